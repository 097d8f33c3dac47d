"""Where a failure of the restore side becomes a snapshotkit error: the one wrapper for manifest
reads, data object reads and opening the store (the take side's is ``_take.commit.storage_error``).

An exception a storage plugin raises (``TimeoutError``, ``ConnectionResetError``, ``OSError``,
``RuntimeError``, ...) becomes a :class:`~snapshotkit.errors.StorageError` that names the
location and the logical paths involved, with the original as its ``__cause__``; a
``StorageError`` the plugin raised itself (retries exhausted, permission refused) keeps its class
and gains the same context. Snapshotkit's other errors pass unchanged.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable

from snapshotkit.errors import SnapshotkitError, StorageError

#: Logical paths named in one message at most; the rest are counted.
_SHOWN_PATHS = 5


def describe_paths(logical_paths: Iterable[str]) -> str:
    """``'a', 'b' and 3 more``: the logical paths an error is about, sorted and bounded."""
    paths = sorted(set(logical_paths))
    shown = ", ".join(repr(p) for p in paths[:_SHOWN_PATHS])
    return shown + (f" and {len(paths) - _SHOWN_PATHS} more" if len(paths) > _SHOWN_PATHS else "")


def storage_failure(
    exc: BaseException,
    *,
    location: str | None,
    logical_paths: Iterable[str] = (),
    path: str | None = None,
    action: str = "reading",
) -> BaseException:
    """The error a restore raises for ``exc``, which a storage call (``action`` ``location``) raised.

    Raise the result without ``from``: a new error already has ``exc`` as its ``__cause__``.
    """
    if isinstance(exc, SnapshotkitError) and not isinstance(exc, StorageError):
        return exc
    if not isinstance(exc, Exception):  # KeyboardInterrupt, cancellation: not a storage failure
        return exc
    where = " of ".join(
        part for part in (repr(location) if location else "", f"the snapshot at {path!r}" if path else "") if part
    )
    holding = describe_paths(logical_paths)
    what = f"{action} {where}" + (f" (holding {holding})" if holding else "")
    advice = "The snapshot itself is unchanged: check that the store is reachable and the credentials, then retry"
    error: BaseException
    detail = str(exc) if isinstance(exc, StorageError) else f"{type(exc).__name__}: {exc}"
    error = StorageError(f"{what} failed: {detail}. {advice}")
    if isinstance(exc, StorageError):
        with contextlib.suppress(TypeError):  # a subclass with another constructor keeps StorageError
            error = type(exc)(f"{what} failed: {detail}. {advice}")
    error.__cause__ = exc
    return error


def open_failure(exc: BaseException, path: str) -> BaseException:
    """The error for a storage plugin that cannot even be created for ``path``."""
    if isinstance(exc, SnapshotkitError) or not isinstance(exc, Exception):
        return exc
    error = StorageError(
        f"cannot open the storage for the snapshot at {path!r}: {type(exc).__name__}: {exc}. "
        "Check the URI and the storage_options its plugin needs"
    )
    error.__cause__ = exc
    return error
