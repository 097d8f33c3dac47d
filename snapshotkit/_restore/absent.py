"""Why there is no snapshot at a path: nothing there, an empty directory, a file, a folder of
snapshots (a run's root), the leftovers of a take that never committed, another library's
checkpoint (or a folder of them), or something else, each said with what was found and what to
do next.

IMPORTANT: only objects named as a take names them (:data:`~snapshotkit._format.entries.OWN_OBJECT`)
are called a take's leftovers, and no message advises deleting anything: a directory without a
manifest may hold someone's data (a DCP checkpoint, a model download, a typo'd path).
"""

from __future__ import annotations

import difflib
import os
import re
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
from snapshotkit._restore.failures import storage_failure
from snapshotkit._text import describe_paths, first_few
from snapshotkit.errors import (
    Advice,
    ForeignCheckpointError,
    IncompleteSnapshotError,
    SnapshotkitError,
    SnapshotNotFoundError,
)
from snapshotkit.storage import StoragePlugin

_SHOWN_NAMES = 3
_MANIFEST_SUFFIX = "/" + METADATA_FILENAME
# A SnapshotManager's step directories (see snapshotkit._lifecycle.catalog).
_STEP_DIR = re.compile(r"step_(0|[1-9][0-9]*)")


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
        return SnapshotNotFoundError(asked + _nothing_there(path))
    snapshots = sorted({name[: -len(_MANIFEST_SUFFIX)] for name in names if name.endswith(_MANIFEST_SUFFIX)})
    if snapshots:
        return _folder_of_snapshots(asked, path, snapshots)
    own = [name for name in names if OWN_OBJECT.fullmatch(name)]
    others = [name for name in names if not OWN_OBJECT.fullmatch(name)]
    if own and not others:
        problem = (
            f"{asked}{path!r} holds {len(own)} data object(s) of a snapshotkit take ({_shown(own)}) but no "
            f"{METADATA_FILENAME}: the take that wrote them never committed (it failed or was interrupted), so "
            "it is not a snapshot and none of its logical paths can be read"
        )
        error = IncompleteSnapshotError(
            f"{problem}. Restore from an earlier snapshot; these leftovers hold nothing restorable "
            "(SnapshotManager.cleanup() removes a manager's)"
        )
        managed = _STEP_DIR.fullmatch(path.rstrip("/").rsplit("/", 1)[-1]) is not None
        return error.advised(Advice(problem, "remove_leftovers", (path,), managed))
    if own:
        return IncompleteSnapshotError(
            f"{asked}{path!r} holds no {METADATA_FILENAME} but {len(own)} data object(s) named like a snapshotkit "
            f"take's ({_shown(own)}) among {len(others)} other object(s) ({_shown(others)}): a take into this "
            "path never committed, so it is not a snapshot. Check the path; restore from an earlier snapshot"
        )
    foreign = classify_listing(names)
    if foreign is not None:
        return _foreign_error(asked, path, foreign, is_file=False)
    nested = _folder_of_foreign(path, names)
    if nested is not None:
        return ForeignCheckpointError(asked + nested[0], nested[1])
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


def _nothing_there(path: str) -> str:
    """What is at a ``path`` whose listing is empty: nothing, an empty directory, or a file."""
    local = _local_path(path)
    if local is None:
        return f"no snapshot at {path!r}: no object is stored under it; check the path"
    if os.path.isdir(local):
        return (
            f"no snapshot at {path!r}: it is an empty directory (a snapshot's directory holds "
            f"{METADATA_FILENAME} and its data objects); check the path"
        )
    if os.path.lexists(local):
        if os.path.basename(local.rstrip(os.sep)) == METADATA_FILENAME:
            return (
                f"{path!r} is a snapshot's manifest file; open the directory that holds it: {os.path.dirname(local)!r}"
            )
        return (
            f"{path!r} is a file, not a snapshot (a snapshot is a directory holding {METADATA_FILENAME}), and not "
            "a checkpoint format snapshotkit import reads; open the snapshot's directory"
        )
    parent, name = os.path.split(local.rstrip(os.sep))
    try:
        siblings = os.listdir(parent or ".")
    except OSError:
        return f"no snapshot at {path!r}: nothing exists there, nor at its parent directory {parent!r}; check the path"
    close = [repr(os.path.join(parent, c)) for c in difflib.get_close_matches(name, siblings, n=3)]
    hint = ""
    if close:
        either = close[0] if len(close) == 1 else f"{', '.join(close[:-1])} or {close[-1]}"
        hint = f"; did you mean {either}?"
    return f"no snapshot at {path!r}: nothing exists there (its parent directory exists){hint or '; check the path'}"


def _folder_of_snapshots(asked: str, path: str, snapshots: Sequence[str]) -> SnapshotNotFoundError:
    """A directory whose subdirectories hold snapshots (a run's root): name them, say how to open one."""
    ordered = sorted(snapshots, key=_natural)
    shown = ordered[0] if len(ordered) == 1 else f"{ordered[0]} ... {ordered[-1]}"
    latest = path.rstrip("/") + "/" + ordered[-1]
    managed = all(_STEP_DIR.fullmatch(name) for name in ordered)
    also = f", or SnapshotManager({path!r}).restore_latest(app_state) for the latest step" if managed else ""
    problem = (
        f"{asked}{path!r} is not a snapshot but a folder of {len(ordered)} snapshot{'s' if len(ordered) > 1 else ''} "
        f"({shown})"
    )
    error = SnapshotNotFoundError(f"{problem}; open one of them, e.g. Snapshot({latest!r}){also}")
    return error.advised(Advice(problem, "open_a_snapshot", (path, latest), managed))


def _folder_of_foreign(path: str, names: Sequence[str]) -> tuple[str, str] | None:
    """A directory whose subdirectories hold other libraries' checkpoints: the message and the format."""
    below: dict[str, list[str]] = {}
    for name in names:
        top, slash, rest = name.partition("/")
        if slash:
            below.setdefault(top, []).append(rest)
    found = {top: hit for top, rest in below.items() if (hit := classify_listing(rest)) is not None}
    if not found:
        return None
    ordered = sorted(found, key=_natural)
    first = found[ordered[0]]
    shown = ordered[0] if len(ordered) == 1 else f"{ordered[0]} ... {ordered[-1]}"
    src = path.rstrip("/") + "/" + ordered[0] + ("/" + first.name if first.name else "")
    local = _local_path(src) is not None
    command = import_command(src.removeprefix("file://") if local else "LOCAL_COPY", first.source_format)
    where = "" if local else f" (import reads local files: copy {src} to local disk first)"
    return (
        f"{path!r} is not a snapshotkit snapshot but a folder of {len(ordered)} subdirector"
        f"{'ies' if len(ordered) > 1 else 'y'} holding other libraries' checkpoints ({shown}; the first is "
        f"{first.description}). Convert the one you want into a snapshot, e.g.: {command}{where}, then open OUT",
        first.source_format,
    )


def _natural(name: str) -> tuple[object, ...]:
    """Sort key putting ``step_2`` before ``step_10``."""
    return tuple(int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name))


def _local_path(path: str) -> str | None:
    """The local filesystem path of ``path``, or None for another scheme."""
    local = path[7:] if path[:7].lower() == "file://" else path
    return None if "://" in local else local


def _local_file(path: str) -> ForeignCheckpoint | None:
    """What the local regular file at ``path`` is (another library's checkpoint), if it is one."""
    local = _local_path(path)
    return None if local is None else classify_file(local)


def _shown(names: Sequence[str]) -> str:
    return first_few(sorted(names), _SHOWN_NAMES)
