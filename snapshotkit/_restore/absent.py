"""Why there is no snapshot at a path: nothing there, the leftovers of a take that never committed,
another library's checkpoint, or something else, each said with what to do next.

IMPORTANT: only objects named as a take names them (:data:`~snapshotkit._format.entries.OWN_OBJECT`)
are called a take's leftovers, and no message advises deleting anything: a directory without a
manifest may hold someone's data (a DCP checkpoint, a model download, a typo'd path).
"""

from __future__ import annotations

from collections.abc import Sequence

from snapshotkit._format.codec import decode_document
from snapshotkit._format.entries import METADATA_FILENAME, OWN_OBJECT
from snapshotkit._format.foreign import (
    ForeignCheckpoint,
    classify_file,
    classify_listing,
    import_command,
    is_torchsnapshot_document,
)
from snapshotkit._restore.failures import describe_paths, storage_failure
from snapshotkit.errors import (
    ForeignCheckpointError,
    IncompleteSnapshotError,
    SnapshotkitError,
    SnapshotNotFoundError,
)
from snapshotkit.storage import StoragePlugin

_SHOWN_NAMES = 3


async def not_found(plugin: StoragePlugin, path: str, wanted: Sequence[str]) -> SnapshotNotFoundError:
    """The error for a ``path`` without a manifest, from what its listing (or, for a local file, its
    first bytes) shows."""
    names: list[str] = []
    if plugin.capabilities.listing:
        try:
            names = await plugin.list("")
        except Exception as exc:
            error = storage_failure(
                exc, location=None, logical_paths=wanted, path=path, action="listing the objects of"
            )
            raise error  # noqa: B904 - the cause is set
    asked = f"cannot read {describe_paths(wanted)}: " if wanted else ""
    if not names:
        found = _local_file(path)
        if found is not None:
            return _foreign_error(asked, path, found, is_file=True)
        return SnapshotNotFoundError(f"{asked}no snapshot at {path!r} (no {METADATA_FILENAME} there); check the path")
    own = [name for name in names if OWN_OBJECT.fullmatch(name)]
    others = [name for name in names if not OWN_OBJECT.fullmatch(name)]
    if own and not others:
        return IncompleteSnapshotError(
            f"{asked}{path!r} holds {len(own)} data object(s) of a snapshotkit take ({_shown(own)}) but no "
            f"{METADATA_FILENAME}: the take that wrote them never committed (it failed or was interrupted), so "
            "it is not a snapshot and none of its logical paths can be read. Restore from an earlier snapshot; "
            "these leftovers hold nothing restorable (SnapshotManager.cleanup() removes a manager's)"
        )
    if own:
        return IncompleteSnapshotError(
            f"{asked}{path!r} holds no {METADATA_FILENAME} but {len(own)} data object(s) named like a snapshotkit "
            f"take's ({_shown(own)}) among {len(others)} other object(s) ({_shown(others)}): a take into this "
            "path never committed, so it is not a snapshot. Check the path; restore from an earlier snapshot"
        )
    foreign = classify_listing(names)
    if foreign is not None:
        return _foreign_error(asked, path, foreign, is_file=False)
    return SnapshotNotFoundError(
        f"{asked}{path!r} is not a snapshot: it holds {len(names)} object(s) ({_shown(names)}) but no "
        f"{METADATA_FILENAME}, and none of them was written by snapshotkit. Check the path. To convert a "
        "torch.save, safetensors, DCP or torchsnapshot checkpoint into a snapshot: snapshotkit import SRC OUT"
    )


def foreign_manifest(path: str, data: bytes, wanted: Sequence[str]) -> ForeignCheckpointError | None:
    """The error for a ``.snapshot_metadata`` that torchsnapshot wrote, or None if it is not one."""
    try:
        document = decode_document(data)
    except (SnapshotkitError, ValueError):
        return None
    if not is_torchsnapshot_document(document):
        return None
    asked = f"cannot read {describe_paths(wanted)}: " if wanted else ""
    found = ForeignCheckpoint(
        "torchsnapshot",
        f"a torchsnapshot snapshot (its {METADATA_FILENAME} is torchsnapshot's, version "
        f"{str(document.get('version'))[:20]!r}, world size {str(document.get('world_size'))[:20]})",
    )
    return _foreign_error(asked, path, found, is_file=False)


def _foreign_error(asked: str, path: str, found: ForeignCheckpoint, *, is_file: bool) -> ForeignCheckpointError:
    src = path.rstrip("/") + "/" + found.name if found.name else path
    local = "://" not in src or src.lower().startswith("file://")
    command = import_command(src.removeprefix("file://") if local else "LOCAL_COPY", found.source_format)
    where = "" if local else f" (import reads local files: copy {src} to local disk first)"
    what = found.description if is_file else f"a directory holding {found.description}"
    return ForeignCheckpointError(
        f"{asked}{path!r} is not a snapshotkit snapshot but {what}. Convert it into a snapshot with: "
        f"{command}{where} (or snapshotkit.convert.import_snapshot), then open OUT",
        found.source_format,
    )


def _local_file(path: str) -> ForeignCheckpoint | None:
    """What the local regular file at ``path`` is (another library's checkpoint), if it is one."""
    local = path[7:] if path[:7].lower() == "file://" else path
    if "://" in local:
        return None
    return classify_file(local)


def _shown(names: Sequence[str]) -> str:
    shown = ", ".join(repr(name) for name in sorted(names)[:_SHOWN_NAMES])
    return shown + (" ..." if len(names) > _SHOWN_NAMES else "")
