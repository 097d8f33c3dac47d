"""Promotion: a durable step taken from the local tier's copy of it, in the background.

At a step that is both a local and a durable save, :meth:`~snapshotkit.SnapshotManager.save`
with ``async_take=True`` takes the local copy from the trainer's memory (the one time the loop
waits) and then, on the tier's thread, the durable snapshot *from that copy*:

1. every rank verifies its own copy (every checksum, :func:`~snapshotkit.verify.verify_snapshot`):
   a damaged or missing copy fails the promotion on every rank, before anything is written;
2. it rebuilds the state the copy holds (:func:`copy_state`): containers, primitives and objects
   as they were, raw tensors *mapped* from the copy's data objects (private, read-only use: the
   pages belong to the file, so a promotion holds no state-sized memory);
3. ``Snapshot.take`` writes the durable snapshot from that state on the tier's copy group, with
   the manager's ``replicated=``, metadata and, for an incremental manager, its base: unchanged
   pieces become references to the base (matched by content hash), so only what changed goes up.

The copy is the state of the step, so the durable snapshot holds what a take from memory at that
step would have held (tests compare both). A state with sharded tensors (``ShardedTensor``,
``DTensor``) is never promoted: its copy holds only this rank's shards (:mod:`.shards`), and the
durable take needs the live tensors.
"""

from __future__ import annotations

import concurrent.futures
import itertools
import math
import os
from collections import OrderedDict
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from snapshotkit._app_state import Held
from snapshotkit._format.document import SnapshotMetadata
from snapshotkit._format.dtypes import RAW_ITEMSIZE
from snapshotkit._format.entries import (
    DictEntry,
    Entry,
    ListEntry,
    PrimitiveEntry,
    TensorEntry,
    TupleEntry,
    join_path,
    unescape_key,
)
from snapshotkit.errors import IntegrityError, SnapshotkitError, SnapshotNotFoundError, WaitTimeoutError
from snapshotkit.snapshot import Snapshot
from snapshotkit.verify import verify_snapshot

__all__ = ["PromotionJob", "copy_state", "verify_copy"]

#: Raw dtypes a copy's bytes are mapped as (plain numbers, whole bytes each); others are read.
_MAPPED = frozenset(
    {"bool", "uint8", "int8", "uint16", "int16", "uint32", "int32", "uint64", "int64"}
    | {"float16", "bfloat16", "float32", "float64", "complex64", "complex128"}
    | {"float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz"}
)


def verify_copy(path: Path) -> None:
    """Check every piece of the copy at ``path``.

    Raises:
        IntegrityError: a piece does not match its checksum (the message names it).
        SnapshotNotFoundError, IncompleteSnapshotError: there is no committed copy.
    """
    try:
        report = verify_snapshot(str(path))
    except SnapshotNotFoundError as exc:
        raise type(exc)(
            f"the local copy {path} to promote is not there ({exc}): its local save failed or it was removed; "
            "the step was not promoted and the durable tier keeps its previous step. Save a later step again, "
            "or take durable snapshots from memory (local_promote=False)"
        ) from exc
    if not report.ok:
        first = report.problems[0]
        raise IntegrityError(
            f"the local copy {path} is damaged ({len(report.problems)} problem(s); first: {first.logical_path!r} "
            f"in {first.location}: {first.message}); it was not promoted. The durable tier keeps its previous "
            "step; save this step again or take a durable snapshot from memory (local_promote=False)"
        )


class _Leaves:
    """Reads the leaves of one copy: raw tensors mapped from its data objects, the rest read."""

    def __init__(self, copy: Snapshot, directory: Path) -> None:
        self._copy = copy
        self._directory = directory
        self._storages: dict[str, torch.UntypedStorage] = {}

    def value(self, path: str, entry: Entry) -> Any:
        if isinstance(entry, PrimitiveEntry):
            return entry.value
        if isinstance(entry, TensorEntry):
            mapped = self._mapped(entry)
            if mapped is not None:
                return mapped
        # objects, torch_save tensors, odd dtypes, pieces in a base: read (checksummed) into memory;
        # unpickled as the take pickled them (the copy is this rank's own, just verified)
        return self._copy.read_object(path, weights_only=False)

    def _mapped(self, entry: TensorEntry) -> torch.Tensor | None:
        pieces = entry.pieces
        if entry.serializer != "raw" or entry.dtype not in _MAPPED or not pieces:
            return None
        first = pieces[0]
        for before, after in itertools.pairwise(pieces):
            if after.location != first.location or after.byte_range[0] != before.byte_range[1]:
                return None
        if any(piece.base is not None for piece in pieces):
            return None
        dtype = getattr(torch, entry.dtype)
        itemsize = RAW_ITEMSIZE[entry.dtype]
        start, numel = first.byte_range[0], math.prod(entry.shape)
        if start % itemsize or numel * itemsize != pieces[-1].byte_range[1] - start:
            return None
        flat = torch.empty(0, dtype=dtype).set_(self._storage(first.location), start // itemsize, (numel,), (1,))
        return flat.view(entry.shape)

    def _storage(self, location: str) -> torch.UntypedStorage:
        if location not in self._storages:
            path = self._directory.joinpath(*location.split("/"))
            # shared=False: a private mapping, nothing is ever written back to the copy
            storage: Any = torch.UntypedStorage.from_file(os.fspath(path), False, os.path.getsize(path))
            self._storages[location] = storage
        return self._storages[location]


def copy_state(copy: Snapshot, directory: Path) -> dict[str, Any]:
    """The app state held by the local copy ``copy`` (world size 1) in ``directory``: one
    Stateful per app-state key, whose ``state_dict()`` gives the value as it was taken."""
    metadata: SnapshotMetadata = copy.metadata
    manifest: Mapping[str, Entry] = metadata.manifest
    leaves = _Leaves(copy, directory)

    def build(path: str) -> Any:
        entry = manifest[f"0/{path}"]
        if isinstance(entry, DictEntry):
            items = [(key, build(join_path(path, key))) for key in entry.keys]
            return OrderedDict(items) if entry.ordered else dict(items)
        if isinstance(entry, ListEntry):
            values = [build(join_path(path, index)) for index in range(entry.length)]
            return tuple(values) if isinstance(entry, TupleEntry) else values
        return leaves.value(path, entry)

    tops = [key[2:] for key in manifest if key.startswith("0/") and "/" not in key[2:]]
    return {unescape_key(top): Held(build(top)) for top in tops}


class PromotionJob:
    """A promotion on the tier's thread, as :class:`~snapshotkit.PendingSnapshot` waits for it.

    Args:
        path: the durable snapshot being written.
        future: the tier thread's work; its result is rank 0's committed metadata (None elsewhere).
    """

    def __init__(self, path: str, future: concurrent.futures.Future[SnapshotMetadata | None]) -> None:
        self.path = path
        self._future = future

    def done(self) -> bool:
        return self._future.done()

    def wait(self, timeout: float | None = None) -> SnapshotMetadata | None:
        try:
            return self._future.result(timeout)
        except concurrent.futures.CancelledError:
            raise SnapshotkitError(
                f"the promotion of {self.path!r} from the local tier never ran: the SnapshotManager was closed "
                "without waiting (close(wait=False)); the durable tier keeps its previous step"
            ) from None
        except concurrent.futures.TimeoutError:
            raise WaitTimeoutError(
                f"the promotion of {self.path!r} from the local tier did not commit within {timeout} s; it goes on "
                "in the background: call wait() again"
            ) from None
