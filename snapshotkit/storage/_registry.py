"""URI -> storage plugin.

Resolution order for ``scheme://...``: plugins registered at runtime with
:func:`register_storage_plugin`; then the built-in table (a plain path or ``file://`` is the
local filesystem plugin); then plugins other distributions declare in the entry-point group
``snapshotkit.storage_plugins`` (name = scheme, value = a factory ``(root, storage_options) ->
StoragePlugin``, e.g. a plugin class); then any scheme fsspec knows, through the generic fsspec
plugin.

:func:`url_to_storage_plugin` returns that plugin itself; :func:`open_storage_plugin` (what
snapshotkit's own operations call) returns it behind the retry layer. The ``retry`` storage
option belongs to the retry layer: factories never see it.
"""

from __future__ import annotations

import difflib
import importlib.metadata
import re
import threading
from collections.abc import Callable, Mapping
from typing import Any

from snapshotkit.errors import UnknownStorageSchemeError
from snapshotkit.storage._base import StoragePlugin
from snapshotkit.storage._retry import RetryPolicy
from snapshotkit.storage._retry_layer import with_retries

#: ``factory(root, storage_options) -> StoragePlugin``; root is the URI without ``scheme://``.
StoragePluginFactory = Callable[[str, Mapping[str, Any]], StoragePlugin]

_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]+)://(.*)$", re.DOTALL)

_registered: dict[str, StoragePluginFactory] = {}
_registered_lock = threading.Lock()


def _fs_factory(root: str, storage_options: Mapping[str, Any]) -> StoragePlugin:
    from snapshotkit.storage._fs import FSStoragePlugin

    return FSStoragePlugin(root)


def _memory_factory(root: str, storage_options: Mapping[str, Any]) -> StoragePlugin:
    from snapshotkit.storage._memory import MemoryStoragePlugin

    return MemoryStoragePlugin(root)


def _gcs_factory(root: str, storage_options: Mapping[str, Any]) -> StoragePlugin:
    try:
        from snapshotkit.storage._gcs import GCSStoragePlugin
    except ImportError as exc:
        from snapshotkit.errors import StorageError

        raise StorageError(f'the gs:// scheme needs gcsfs ({exc}): pip install "snapshotkit[gcs]"') from exc
    return GCSStoragePlugin(root, storage_options)


def _s3_factory(root: str, storage_options: Mapping[str, Any]) -> StoragePlugin:
    try:
        from snapshotkit.storage._s3 import S3StoragePlugin
    except ImportError as exc:
        from snapshotkit.errors import StorageError

        raise StorageError(f'the s3:// scheme needs s3fs ({exc}): pip install "snapshotkit[s3]"') from exc
    return S3StoragePlugin(root, storage_options)


_BUILTIN: dict[str, StoragePluginFactory] = {
    "file": _fs_factory,
    "memory": _memory_factory,
    "gs": _gcs_factory,
    "gcs": _gcs_factory,
    "s3": _s3_factory,
}

#: Entry-point group third-party distributions declare their storage plugins in.
ENTRY_POINT_GROUP = "snapshotkit.storage_plugins"


def _entry_point_factory(scheme: str) -> StoragePluginFactory | None:
    for entry_point in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        if entry_point.name.lower() == scheme:
            factory: StoragePluginFactory = entry_point.load()
            return factory
    return None


def _entry_point_schemes() -> set[str]:
    return {ep.name.lower() for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)}


def register_storage_plugin(scheme: str, factory: StoragePluginFactory) -> None:
    """Serve ``scheme://...`` URIs with ``factory(root, storage_options)``; replaces earlier registrations."""
    with _registered_lock:
        _registered[scheme.lower()] = factory


def split_uri(uri: str) -> tuple[str, str]:
    """``"s3://bucket/p"`` -> ``("s3", "bucket/p")``; a plain path -> ``("file", path)``."""
    match = _SCHEME.match(uri)
    if match is None:
        return "file", uri
    return match.group(1).lower(), match.group(2)


def serves(uri: str) -> bool:
    """Whether some storage plugin serves ``uri``'s scheme (registered, built in, by entry point,
    or through fsspec), without opening one."""
    scheme, _ = split_uri(uri)
    with _registered_lock:
        if scheme in _registered:
            return True
    if scheme in _BUILTIN or _entry_point_factory(scheme) is not None:
        return True
    from snapshotkit.storage._fsspec import fsspec_knows

    return bool(fsspec_knows(scheme))


def url_to_storage_plugin(uri: str, storage_options: Mapping[str, Any] | None = None) -> StoragePlugin:
    """The storage plugin for a snapshot URI (without the retry layer: see :func:`open_storage_plugin`).

    The ``retry`` storage option is checked and removed; the factory gets the other options.

    Raises:
        UnknownStorageSchemeError: no plugin serves the URI's scheme.
        ConfigError: the ``retry`` option is not a valid retry policy.
    """
    scheme, root = split_uri(uri)
    options = dict(storage_options or {})
    RetryPolicy.from_option(options.pop("retry", None))
    with _registered_lock:
        factory = _registered.get(scheme)
    if factory is None:
        factory = _BUILTIN.get(scheme)
    if factory is None:
        factory = _entry_point_factory(scheme)
    if factory is None:
        from snapshotkit.storage._fsspec import FsspecStoragePlugin, fsspec_knows

        if fsspec_knows(scheme):
            return FsspecStoragePlugin(scheme, root, options)
    if factory is None:
        raise UnknownStorageSchemeError(_unknown_scheme(scheme, uri))
    return factory(root, options)


def _unknown_scheme(scheme: str, uri: str) -> str:
    """What was tried for ``scheme``, and the one thing to do: a typo, a plugin to register, or fsspec to install."""
    from snapshotkit.storage._fsspec import fsspec_schemes

    with _registered_lock:
        ours = sorted({*_BUILTIN, *_registered, *_entry_point_schemes()})
    fsspec_known = fsspec_schemes()
    close = difflib.get_close_matches(
        scheme, list(dict.fromkeys([*ours, *sorted(fsspec_known or ())])), n=3, cutoff=0.5
    )
    typo = f"; did you mean {_either([f'{c}://' for c in close])}?" if close else ""
    found = f"no storage plugin for scheme {scheme!r} in {uri!r}: snapshotkit's plugins serve {', '.join(ours)}"
    register = (
        f"register a plugin for it with snapshotkit.storage.register_storage_plugin({scheme!r}, factory) (or install "
        f"a distribution declaring one in the {ENTRY_POINT_GROUP!r} entry-point group)"
    )
    if fsspec_known is None:
        return (
            f"{found}, and fsspec, which serves many more, is not installed{typo}. For a scheme fsspec knows, "
            f"pip install fsspec (and its implementation of {scheme!r}); otherwise {register}"
        )
    if close:
        return f"{found}, and fsspec (installed) has no implementation for {scheme!r} either{typo}"
    return f"{found}, and fsspec (installed) has no implementation for {scheme!r} either. To use it, {register}"


def _either(options: list[str]) -> str:
    """``a``, ``a or b``, ``a, b or c``."""
    return options[0] if len(options) == 1 else f"{', '.join(options[:-1])} or {options[-1]}"


def open_storage_plugin(uri: str, storage_options: Mapping[str, Any] | None = None) -> StoragePlugin:
    """The storage plugin for ``uri`` behind the retry layer, as every snapshotkit operation opens it.

    Each operation is retried on transient failures under the policy of the ``retry`` storage
    option (a :class:`~snapshotkit.storage.RetryPolicy`, a dict of its fields, or an int
    ``max_attempts``; default :class:`~snapshotkit.storage.RetryPolicy()`), unless the plugin
    declares ``capabilities.own_retries``.

    Raises:
        UnknownStorageSchemeError: no plugin serves the URI's scheme.
        ConfigError: the ``retry`` option is not a valid retry policy.
    """
    options = dict(storage_options or {})
    policy = RetryPolicy.from_option(options.pop("retry", None))
    return with_retries(url_to_storage_plugin(uri, options), policy, uri)
