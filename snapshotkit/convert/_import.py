"""``import_snapshot``: another library's checkpoint in, a snapshot out, written by the regular take.

    check the arguments  ->  detect (or check) the source's format (:mod:`._detect`)
    ->  read it into app state, tensors mapped from its files (:mod:`._from_torch`,
        :mod:`._from_safetensors`, :mod:`._from_dcp`, :mod:`._from_torchsnapshot`)
    ->  ``Snapshot.take(dst, app_state)``  ->  an :class:`ImportReport`

The snapshot is an ordinary one (same format, checksums and commit as any take); its user
metadata records where it came from under ``"snapshotkit.import"``.
"""

from __future__ import annotations

import dataclasses
import difflib
import logging
import os
import time
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path
from typing import Any

from snapshotkit._app_state import Held
from snapshotkit._config import snapshot_path
from snapshotkit._dist import resolve_group
from snapshotkit._events import transfer_summary
from snapshotkit._format.document import SnapshotMetadata
from snapshotkit._format.entries import DictEntry, ListEntry, pieces_of
from snapshotkit._format.foreign import SOURCE_FORMATS
from snapshotkit._runtime.progress import check_progress
from snapshotkit._text import first_few
from snapshotkit.convert._detect import detect
from snapshotkit.convert._from_dcp import read_dcp
from snapshotkit.convert._from_safetensors import read_safetensors
from snapshotkit.convert._from_torch import read_torch
from snapshotkit.convert._from_torchsnapshot import read_torchsnapshot
from snapshotkit.convert._source import Loaded
from snapshotkit.errors import Advice, ConfigError, InvalidArgumentError
from snapshotkit.snapshot import Snapshot
from snapshotkit.stateful import StateDict, Stateful

logger = logging.getLogger("snapshotkit.convert")

#: The user-metadata member in which an imported snapshot records its source.
IMPORT_METADATA_KEY = "snapshotkit.import"

_READERS: dict[str, Callable[..., Loaded]] = {
    "dcp": read_dcp,
    "safetensors": read_safetensors,
    "torch": read_torch,
    "torchsnapshot": read_torchsnapshot,
}


@dataclasses.dataclass(frozen=True)
class ImportReport:
    """What :func:`import_snapshot` wrote.

    Attributes:
        source_format: the format read: ``"dcp"``, ``"safetensors"``, ``"torch"`` or ``"torchsnapshot"``.
        source: the file or directory read (absolute).
        path: the snapshot written (``dst``).
        logical_paths: every leaf of the snapshot (``"model/0.weight"``), in manifest order.
        nbytes: bytes of tensor and object data the snapshot stores.
        seconds: how long the import took, reading included.
        skipped_paths: what the source holds that the snapshot does not: a multi-rank
            torchsnapshot's per-rank state of ranks other than 0 (``"1/extra/step"``).
    """

    source_format: str
    source: str
    path: str
    logical_paths: tuple[str, ...]
    nbytes: int
    seconds: float
    skipped_paths: tuple[str, ...] = ()


def import_snapshot(
    src: str | os.PathLike[str],
    dst: str | os.PathLike[str],
    *,
    source: str | None = None,
    key: str = "model",
    storage_options: dict[str, Any] | None = None,
    memory_budget_bytes: int | None = None,
    weights_only: bool = True,
    progress: bool = False,
) -> ImportReport:
    """Convert a checkpoint of another library into a snapshot at ``dst``.

    Reads a ``torch.save`` file, a safetensors file or Hugging Face sharded directory (with its
    ``*.safetensors.index.json``), a DCP (``torch.distributed.checkpoint``) directory, or a
    torchsnapshot directory, and takes an ordinary snapshot of it. Tensors are mapped from the
    source's files, not read into memory, so an import needs about the take's memory budget.

    Naming: a checkpoint holding a dict with ``str`` keys (``{"model": sd, "optim": osd}``, a
    DCP state dict, a torchsnapshot app state) keeps those keys as the snapshot's app-state keys
    (``model/0.weight``); a safetensors source, a bare state dict of tensors, or anything else
    becomes the state of app-state key ``key``, so ``Snapshot(dst).restore({"model": module})``
    loads it into a module.

    Args:
        src: a local file or directory.
        dst: where the snapshot goes: any snapshot path or URI (it must not hold a snapshot).
        source: ``"torch"``, ``"safetensors"``, ``"dcp"`` or ``"torchsnapshot"``; detected from
            ``src`` when None.
        key: the app-state key of a source that is one state dict (default ``"model"``).
        storage_options: passed to the storage plugin of ``dst``.
        memory_budget_bytes: the take's host-memory budget (see ``Snapshot.take``).
        weights_only: unpickle the source's objects with ``torch.load(weights_only=True)`` (and
            DCP's metadata with an unpickler that builds only its classes). Pass ``False`` only
            for checkpoints you trust: no code from a source runs unless you do.
        progress: show a bar of the bytes written on stderr, once the take has run 2 s (see
            ``Snapshot.take``).

    Returns:
        An :class:`ImportReport`.

    Raises:
        ImportSourceError: nothing is at ``src``; its format is not recognized (or not
            ``source``); it is already a snapshot; the checkpoint is malformed or incomplete.
        UnsafeObjectError: ``weights_only=True`` refused an object of the source.
        InvalidArgumentError: an argument has the wrong type.
        ConfigError: ``source`` is not a known format, ``key`` is empty, ``src`` is not local,
            ``dst`` is ``src`` or inside it, or this process is one of several ranks.
        SnapshotExistsError: ``dst`` already holds a snapshot.
        StorageError: writing ``dst`` failed.
    """
    started_s = time.perf_counter()
    check_progress(progress, "import_snapshot")
    source_path = _local_source(src)
    target = snapshot_path(dst)
    _check_options(source, key, weights_only)
    _refuse_inside(source_path, target)
    if resolve_group(None).world_size > 1:
        raise ConfigError(
            "import_snapshot runs in one process, but torch.distributed is initialized with several ranks; run it "
            "outside the distributed job (e.g. snapshotkit import SRC OUT), then restore the snapshot on every rank"
        )
    detected = detect(source_path, source)
    loaded = _READERS[detected.source_format](detected.path, key=key, weights_only=weights_only)
    app_state = {name: _stateful(state) for name, state in loaded.states.items()}
    skipped = loaded.skipped_paths
    provenance = {"source_format": detected.source_format, "source": str(detected.path), **loaded.provenance}
    snapshot = Snapshot.take(
        target,
        app_state,
        storage_options=storage_options,
        memory_budget_bytes=memory_budget_bytes,
        metadata={IMPORT_METADATA_KEY: provenance},
        progress=progress,
    )
    del app_state, loaded  # the mapped tensors: the files are unmapped when the last view goes
    paths, nbytes = _contents(snapshot.metadata)
    report = ImportReport(
        detected.source_format,
        str(detected.path),
        snapshot.path,
        paths,
        nbytes,
        time.perf_counter() - started_s,
        skipped,
    )
    return _log(report)


def _stateful(state: Any) -> Stateful:
    if type(state) in (dict, OrderedDict):
        holder = StateDict()
        holder.data = state  # as it is: an OrderedDict stays one
        return holder
    return Held(state)


def _local_source(src: object) -> Path:
    text = os.fspath(src) if isinstance(src, os.PathLike) else src
    if not isinstance(text, str):
        raise InvalidArgumentError(f"src must be a str or os.PathLike (a local file or directory), got {src!r}")
    if text[:7].lower() == "file://":
        text = text[7:]
    if "://" in text:
        raise ConfigError(
            f"src {text!r} is not a local path; import reads local files: copy the checkpoint to local disk first"
        )
    if not text.strip():
        raise ConfigError("src is empty; pass the path of a checkpoint file or directory")
    return Path(os.path.abspath(os.path.expanduser(text)))


def _check_options(source: object, key: object, weights_only: object) -> None:
    if source is not None:
        if not isinstance(source, str):
            raise InvalidArgumentError(f"source must be a str or None, got {type(source).__name__} {source!r}")
        if source not in SOURCE_FORMATS:
            close = difflib.get_close_matches(source.lower(), SOURCE_FORMATS, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ConfigError(f"source={source!r} is not a format import reads{hint}; use one of {SOURCE_FORMATS}")
    if not isinstance(key, str):
        raise InvalidArgumentError(f"key must be a str (an app-state key such as 'model'), got {key!r}")
    if not key:
        raise ConfigError("key is empty; pass the app-state key the state dict goes under (e.g. 'model')")
    if not isinstance(weights_only, bool):
        raise InvalidArgumentError(f"weights_only must be True or False, got {weights_only!r}")


def _refuse_inside(source: Path, target: str) -> None:
    local = target[7:] if target[:7].lower() == "file://" else target
    if "://" in local:
        return
    destination = Path(os.path.abspath(os.path.expanduser(local)))
    if destination == source or (source.is_dir() and destination.is_relative_to(source)):
        problem = (
            f"dst {target!r} is {'src' if destination == source else 'inside src'} ({source}); the snapshot would mix "
            "with the checkpoint it is made from"
        )
        raise ConfigError(f"{problem}. Pass a new path for dst").advised(Advice(problem, "new_destination", (target,)))


def _contents(metadata: SnapshotMetadata) -> tuple[tuple[str, ...], int]:
    """The snapshot's leaf logical paths, and the bytes its pieces hold (shared pieces once)."""
    paths: list[str] = []
    pieces: dict[tuple[str, tuple[int, int]], int] = {}
    for name, entry in metadata.manifest.items():
        if isinstance(entry, (DictEntry, ListEntry)):
            continue
        paths.append(name.partition("/")[2])
        for piece in pieces_of(entry):
            pieces[(piece.address, piece.byte_range)] = piece.byte_range[1] - piece.byte_range[0]
    return tuple(paths), sum(pieces.values())


def _log(report: ImportReport) -> ImportReport:
    logger.info(
        "imported the %s checkpoint %s into %s: %d logical paths, %s",
        report.source_format,
        report.source,
        report.path,
        len(report.logical_paths),
        transfer_summary(report.nbytes, report.seconds),
    )
    if report.skipped_paths:
        logger.warning(
            "%s: %d value(s) held by ranks other than 0 only were not imported (a snapshot of rank 0's view): %s",
            report.source,
            len(report.skipped_paths),
            first_few(report.skipped_paths, show=str),
        )
    return report
