"""Where a failure of the restore side becomes a snapshotkit error: the one wrapper for manifest
reads, data object reads and opening the store (the take side's is ``_take.commit.storage_error``;
both are :func:`snapshotkit._storage_failure.wrap_storage_failure` with their own advice).

An exception a storage plugin raises (``TimeoutError``, ``ConnectionResetError``, ``OSError``,
``RuntimeError``, ...) becomes a :class:`~snapshotkit.errors.StorageError` that names the
location and the logical paths involved, with the original as its ``__cause__``; a
``StorageError`` the plugin raised itself (retries exhausted, permission refused) keeps its class
and gains the same context. Snapshotkit's other errors pass unchanged.
"""

from __future__ import annotations

from collections.abc import Iterable

from snapshotkit._storage_failure import wrap_storage_failure
from snapshotkit.errors import SnapshotkitError, StorageError


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
    return wrap_storage_failure(
        exc,
        action=action,
        advice="The snapshot itself is unchanged: check that the store is reachable and the credentials, then retry",
        location=location,
        path=path,
        logical_paths=logical_paths,
    )


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
