"""Opening a snapshot: read and decode its manifest (``.snapshot_metadata``), or say why there is none.

Below the restore engine and the modules it reads through (an incremental snapshot's storage,
:mod:`.bases`, checks its bases' manifests with :func:`load_metadata` too), so each imports it
without an import circle. What a path without a manifest holds is :mod:`.absent`'s to explain.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from snapshotkit._format.document import SnapshotMetadata
from snapshotkit._format.pieces import METADATA_FILENAME
from snapshotkit._restore.absent import foreign_manifest, not_found
from snapshotkit._restore.failures import open_failure, storage_failure
from snapshotkit._runtime.frames import drop_frames
from snapshotkit._runtime.gc import gc_paused
from snapshotkit._runtime.loop import run_sync
from snapshotkit.errors import ManifestError, SnapshotkitError
from snapshotkit.storage import StoragePlugin

#: Opens the snapshot's storage plugin (called once per read; the reader closes what it opened).
OpenPlugin = Callable[[], StoragePlugin]


def load_metadata(open_plugin: OpenPlugin, path: str, wanted: Sequence[str] = ()) -> SnapshotMetadata:
    """Read and decode the manifest of the snapshot at ``path``; errors name the ``wanted`` logical paths.

    Raises:
        SnapshotNotFoundError: nothing is at the path, or something that is not a snapshot.
        IncompleteSnapshotError: data objects of a take are there but the take never committed.
        ForeignCheckpointError: another library's checkpoint is there (the message says which, and
            the ``snapshotkit import`` command that converts it).
        ManifestError: the manifest is malformed or from a newer format version.
        StorageError: the store failed (the plugin's error is the cause).
    """
    try:
        with gc_paused():
            return run_sync(_load_metadata(open_store(open_plugin, path), path, wanted))
    except Exception as exc:
        drop_frames(exc)
        raise


def open_store(open_plugin: OpenPlugin, path: str) -> StoragePlugin:
    """``open_plugin()``, its failure a :class:`~snapshotkit.errors.StorageError` naming ``path``."""
    try:
        return open_plugin()
    except Exception as exc:
        raise open_failure(exc, path)  # noqa: B904 - the cause is set by open_failure


async def _load_metadata(plugin: StoragePlugin, path: str, wanted: Sequence[str]) -> SnapshotMetadata:
    try:
        try:
            text = await plugin.read(METADATA_FILENAME)
        except FileNotFoundError as exc:
            if isinstance(exc, SnapshotkitError):  # BucketNotFoundError: the store, not the snapshot, is missing
                raise storage_failure(exc, location=METADATA_FILENAME, logical_paths=wanted, path=path)  # noqa: B904
            raise await not_found(plugin, path, wanted) from None
        except Exception as exc:
            raise storage_failure(exc, location=METADATA_FILENAME, logical_paths=wanted, path=path)  # noqa: B904
    finally:
        await plugin.close()
    try:
        return SnapshotMetadata.from_text(bytes(text))
    except ManifestError as exc:
        foreign = foreign_manifest(path, bytes(text), wanted)
        if foreign is not None:
            raise foreign from None
        raise type(exc)(f"{path}/{METADATA_FILENAME}: {exc}") from None
