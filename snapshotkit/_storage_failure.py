"""Where a storage plugin's exception becomes a snapshotkit error, for takes and restores alike.

An exception a storage plugin raises (``TimeoutError``, ``ConnectionResetError``, ``OSError``,
``RuntimeError``, ...) becomes a :class:`~snapshotkit.errors.StorageError` that says what was being
done, where (the location, the snapshot's path) and to which logical paths, with the original as its
``__cause__``; a ``StorageError`` the plugin raised itself (retries exhausted, permission refused)
keeps its class and gains the same context. Snapshotkit's other errors, and interrupts
(``KeyboardInterrupt``, cancellation), pass unchanged. Each side says what to do next: the take side
(``_take.commit.storage_error``) that nothing was committed, the restore side
(``_restore.failures.storage_failure``) that the snapshot is unchanged.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable

from snapshotkit._text import describe_paths
from snapshotkit.errors import SnapshotkitError, StorageError

__all__ = ["wrap_storage_failure"]


def wrap_storage_failure(
    exc: BaseException,
    *,
    action: str,
    advice: str,
    location: str | None = None,
    path: str | None = None,
    logical_paths: Iterable[str] = (),
    whole: str = "the snapshot",
) -> BaseException:
    """The error to raise for ``exc``, which a storage call (``action`` ``location``) raised.

    Args:
        action: what the call did, as a verb: ``"reading"``, ``"writing"``, ``"checking for"``.
        advice: what to do next, the message's last sentence.
        location: the object the call was about, if one.
        path: the snapshot's path or URI, if known.
        logical_paths: the logical paths stored at ``location`` (the first five are named).
        whole: what the call was about when there is no ``location`` (``"the storage"``): ``"... at {path}"``.

    Raise the result without ``from``: a new error already has ``exc`` as its ``__cause__``.
    """
    if not isinstance(exc, Exception) or (isinstance(exc, SnapshotkitError) and not isinstance(exc, StorageError)):
        return exc
    at = f"{'the snapshot' if location else whole} at {path!r}" if path else ""
    where = " of ".join(part for part in (repr(location) if location else "", at) if part)
    holding = describe_paths(logical_paths)
    what = f"{action} {where}" + (f" (holding {holding})" if holding else "")
    detail = str(exc) if isinstance(exc, StorageError) else f"{type(exc).__name__}: {exc}"
    message = f"{what} failed: {detail}. {advice}"
    error: BaseException = StorageError(message)
    if isinstance(exc, StorageError):
        with contextlib.suppress(TypeError):  # a subclass with another constructor keeps StorageError
            error = type(exc)(message)
    error.__cause__ = exc
    return error
