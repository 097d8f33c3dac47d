"""Taking a snapshot: collect state, plan the layout, write data objects, commit the manifest.

IMPORTANT: the manifest is written last, with an exclusive write, and only after every data
object write returned; a take that fails or is interrupted before that deletes what it wrote,
and in any case leaves no manifest, so nothing half-written ever opens as a snapshot.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import glob
import itertools
import math
import secrets
import warnings
from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import Any

import torch

from snapshotkit._config import Config
from snapshotkit._dist import Group
from snapshotkit._format.checksum import format_checksum
from snapshotkit._format.document import SnapshotMetadata
from snapshotkit._format.entries import (
    METADATA_FILENAME,
    ContainerEntry,
    Entry,
    ObjectEntry,
    Piece,
    PrimitiveEntry,
    Shard,
    ShardedTensorEntry,
    TensorEntry,
    format_version_for,
)
from snapshotkit._format.serialization import RAW, dtype_from_name, dtype_name, serialize_object, tensor_serializer
from snapshotkit._format.sharded import Box, is_sharded, local_shards
from snapshotkit._plan.flatten import escape_key, flatten, join_path
from snapshotkit._plan.layout import DataObjectPlan, PieceSlot, pack_pieces, row_pieces, split_payload
from snapshotkit._plan.partition import WriteItem, assign_writers, common_patterns, matches_any, replicated_paths
from snapshotkit._runtime.budget import MemoryBudget
from snapshotkit._runtime.gc import gc_paused
from snapshotkit._runtime.loop import run_sync
from snapshotkit._take.stage import Payload, write_data_objects
from snapshotkit._version import __version__
from snapshotkit.errors import (
    InvalidAppStateError,
    SnapshotExistsError,
    SnapshotkitError,
    StorageError,
    UnsupportedValueError,
)
from snapshotkit.stateful import RNGState, Stateful
from snapshotkit.storage import StoragePlugin

_PRIMITIVE_TYPES = (int, float, str, bool, bytes)


def validate_app_state(app_state: object) -> dict[str, Stateful]:
    """Check that ``app_state`` maps string keys to :class:`Stateful` values."""
    if not isinstance(app_state, Mapping):
        raise InvalidAppStateError(
            f"app_state must be a dict of name -> Stateful object, got {type(app_state).__name__}; "
            "wrap loose values in snapshotkit.StateDict"
        )
    for key, value in app_state.items():
        if not isinstance(key, str) or not key:
            raise InvalidAppStateError(f"app_state keys must be non-empty strings, got {key!r}")
        if not isinstance(value, Stateful):
            raise InvalidAppStateError(
                f"app_state[{key!r}] is a {type(value).__name__}, which has no state_dict()/load_state_dict(); "
                f"wrap plain values as snapshotkit.StateDict({key}=...) or give the object those two methods"
            )
    rng_keys = [key for key, value in app_state.items() if isinstance(value, RNGState)]
    if len(rng_keys) > 1:
        raise InvalidAppStateError(f"app_state holds {len(rng_keys)} RNGState objects ({rng_keys}); use one")
    return dict(app_state)


def _tensor_identity(tensor: torch.Tensor) -> tuple[Any, ...] | None:
    """A key equal for two tensors exactly when they view the same elements (tied weights)."""
    if tensor.numel() == 0:
        return None
    return (
        tensor.untyped_storage().data_ptr(),
        tensor.storage_offset(),
        tuple(tensor.shape),
        tuple(tensor.stride()),
        tensor.dtype,
        tensor.device,
    )


# --------------------------------------------------------------------- this rank's leaves


@dataclasses.dataclass(slots=True)
class _TensorLeaf:
    payload: int
    dtype: str
    shape: tuple[int, ...]
    serializer: str
    alias_of: str | None = None  # the first path whose payload this one shares (tied weights)


@dataclasses.dataclass(slots=True)
class _ObjectLeaf:
    payload: int
    obj_type: str


@dataclasses.dataclass(slots=True)
class _ShardedLeaf:
    dtype: str
    shape: tuple[int, ...]
    layout: str
    boxes: list[tuple[Box, int]]  # (box, payload)


_Leaf = _TensorLeaf | _ObjectLeaf | _ShardedLeaf | PrimitiveEntry


@dataclasses.dataclass
class LocalState:
    """One rank's flattened state: containers and leaves by logical path, and the payloads."""

    containers: dict[str, ContainerEntry]
    leaves: dict[str, _Leaf]
    payloads: list[Payload]


def describe_state(states: Mapping[str, Any]) -> LocalState:
    """Flatten collected state into containers, leaves and payloads (objects serialized here)."""
    containers: dict[str, ContainerEntry] = {}
    leaves: dict[str, _Leaf] = {}
    payloads: list[Payload] = []
    by_identity: dict[tuple[Any, ...], tuple[int, str]] = {}
    for key in sorted(states):
        flat_containers, flat_leaves = flatten(states[key], escape_key(key))
        containers.update(flat_containers)
        for path, leaf in flat_leaves.items():
            if isinstance(leaf, torch.Tensor) and is_sharded(leaf):
                leaves[path] = _describe_sharded(path, leaf, payloads)
            elif isinstance(leaf, torch.Tensor):
                leaves[path] = _describe_tensor(path, leaf, payloads, by_identity)
            elif leaf is None or (type(leaf) in _PRIMITIVE_TYPES and _utf8_encodable(leaf)):
                leaves[path] = PrimitiveEntry.of(leaf, False)
            else:
                payloads.append(Payload.of_bytes(_serialize(path, leaf)))
                leaves[path] = _ObjectLeaf(len(payloads) - 1, f"{type(leaf).__module__}.{type(leaf).__qualname__}")
    return LocalState(containers, leaves, payloads)


def _describe_sharded(path: str, value: torch.Tensor, payloads: list[Payload]) -> _ShardedLeaf:
    shards = local_shards(value, path)
    boxes = []
    for box, local in shards.boxes:
        if local.is_meta:
            raise UnsupportedValueError(f"the sharded tensor at {path!r} has a meta local shard; materialize it")
        payloads.append(Payload.of_tensor(local.detach()))
        boxes.append((box, len(payloads) - 1))
    return _ShardedLeaf(dtype_name(shards.dtype), shards.shape, shards.layout, boxes)


def _describe_tensor(
    path: str, tensor: torch.Tensor, payloads: list[Payload], by_identity: dict[tuple[Any, ...], tuple[int, str]]
) -> _TensorLeaf:
    if tensor.is_meta:
        raise UnsupportedValueError(
            f"the tensor at logical path {path!r} is on the meta device and has no data; materialize it first"
        )
    serializer = tensor_serializer(tensor)
    dtype, shape = dtype_name(tensor.dtype), tuple(tensor.shape)
    if serializer != RAW:
        payloads.append(Payload.of_bytes(_serialize(path, tensor)))
        return _TensorLeaf(len(payloads) - 1, dtype, shape, serializer)
    identity = _tensor_identity(tensor)
    known = by_identity.get(identity) if identity is not None else None
    if known is not None:
        return _TensorLeaf(known[0], dtype, shape, serializer, alias_of=known[1])
    payloads.append(Payload.of_tensor(tensor))
    if identity is not None:
        by_identity[identity] = (len(payloads) - 1, path)
    return _TensorLeaf(len(payloads) - 1, dtype, shape, serializer)


# --------------------------------------------------------------------- what ranks exchange


@dataclasses.dataclass
class RankInfo:
    """What a rank tells the others before anything is written (small: no tensor bytes)."""

    path: str
    patterns: list[str]
    candidates: dict[str, tuple[Any, ...]]  # leaf path -> signature, for leaves matching own patterns
    shards: dict[str, tuple[str, tuple[int, ...], list[Box]]]  # path -> (dtype, global shape, boxes)
    total_bytes: int  # payload bytes of every non-sharded leaf
    take_id: str = ""  # rank 0's names the data objects of every rank


def _signature(local: LocalState, leaf: _Leaf) -> tuple[Any, ...]:
    if isinstance(leaf, _TensorLeaf):
        if leaf.alias_of is not None:
            return ("alias", leaf.alias_of, leaf.dtype, leaf.shape)
        return ("tensor", leaf.dtype, leaf.shape, leaf.serializer, local.payloads[leaf.payload].nbytes)
    if isinstance(leaf, _ObjectLeaf):
        return ("object", leaf.obj_type, local.payloads[leaf.payload].nbytes)
    assert isinstance(leaf, PrimitiveEntry)
    return ("primitive", leaf.value_type, repr(leaf.value))


def rank_info(local: LocalState, path: str, patterns: Sequence[str]) -> RankInfo:
    """This rank's :class:`RankInfo` for the leaves of ``local``."""
    candidates = {}
    shards = {}
    sharded_payloads: set[int] = set()
    for leaf_path, leaf in local.leaves.items():
        if isinstance(leaf, _ShardedLeaf):
            shards[leaf_path] = (leaf.dtype, leaf.shape, [box for box, _ in leaf.boxes])
            sharded_payloads.update(p for _, p in leaf.boxes)
        elif patterns and matches_any(leaf_path, patterns):
            candidates[leaf_path] = _signature(local, leaf)
    total = sum(p.nbytes for i, p in enumerate(local.payloads) if i not in sharded_payloads)
    return RankInfo(path, list(patterns), candidates, shards, total)


# --------------------------------------------------------------------- the shared decision


@dataclasses.dataclass
class Decision:
    """Who writes what, computed identically on every rank from every rank's :class:`RankInfo`."""

    replicated: set[str]
    owner: dict[Hashable, int]  # ("r", path, i) / ("s", path, offsets, i) -> rank
    piece_ranges: dict[Hashable, tuple[int, int]]  # same keys -> byte range within the payload
    sharded: dict[str, tuple[str, tuple[int, ...], list[Box]]]  # path -> (dtype, shape, distinct boxes)
    differing: dict[str, list[int]]


def decide(infos: Sequence[RankInfo], *, chunk_bytes: int) -> Decision:
    """Replicated paths, sharded boxes, and the writer of every replicated or sharded piece."""
    patterns = common_patterns([info.patterns for info in infos])
    replicated, differing = replicated_paths([info.candidates for info in infos], patterns)
    first = infos[0].candidates
    # A tied alias is replicated only together with the tensor it shares memory with.
    replicated = {p for p in replicated if first[p][0] != "alias" or first[p][1] in replicated}
    items: list[WriteItem] = []
    ranges: dict[Hashable, tuple[int, int]] = {}
    loads = [info.total_bytes for info in infos]
    for path in sorted(replicated):
        signature = first[path]
        if signature[0] == "alias":
            continue
        for info_rank, info in enumerate(infos):
            loads[info_rank] -= _signature_bytes(info.candidates[path])
        if signature[0] == "tensor" and signature[3] == RAW:
            itemsize = dtype_from_name(signature[1]).itemsize
            spans = split_payload(signature[4], itemsize, chunk_bytes)
        elif signature[0] in ("tensor", "object"):
            spans = [(0, signature[-1])]
        else:
            continue  # primitives are inline in the manifest
        for index, (start, end) in enumerate(spans):
            replicated_key: Hashable = ("r", path, index)
            ranges[replicated_key] = (start, end)
            items.append(WriteItem(replicated_key, end - start))
    sharded: dict[str, tuple[str, tuple[int, ...], list[Box]]] = {}
    holders: dict[tuple[str, Box], list[int]] = {}
    for rank, info in enumerate(infos):
        for path, (dtype, shape, boxes) in info.shards.items():
            known = sharded.setdefault(path, (dtype, shape, []))
            if known[:2] != (dtype, shape):
                raise UnsupportedValueError(
                    f"the sharded tensor at {path!r} is {known[0]} {list(known[1])} on one rank and {dtype} "
                    f"{list(shape)} on rank {rank}; every rank must hold shards of the same global tensor"
                )
            for box in boxes:
                ranks = holders.setdefault((path, box), [])
                if not ranks:
                    known[2].append(box)
                ranks.append(rank)
    for path, (dtype, shape, boxes) in sharded.items():
        covered = sum(math.prod(sizes) for _, sizes in boxes)
        if covered != math.prod(shape):
            raise UnsupportedValueError(
                f"the shards of {path!r} held by the ranks cover {covered} of its {math.prod(shape)} elements "
                "(overlapping or missing shards); every shard must be held by a rank of the process group"
            )
        itemsize = dtype_from_name(dtype).itemsize
        for box in boxes:
            for index, (start, end) in enumerate(row_pieces(box[1], itemsize, chunk_bytes)):
                sharded_key: Hashable = ("s", path, box[0], index)
                ranges[sharded_key] = (start, end)
                items.append(WriteItem(sharded_key, end - start, tuple(holders[(path, box)])))
    owner = assign_writers(items, [max(0, load) for load in loads])
    return Decision(replicated, owner, ranges, sharded, differing)


def _signature_bytes(signature: tuple[Any, ...]) -> int:
    return int(signature[-1]) if signature[0] in ("tensor", "object") else 0


# --------------------------------------------------------------------- this rank's plan


@dataclasses.dataclass(slots=True)
class _PendingTensor:
    payload: int
    dtype: str
    shape: tuple[int, ...]
    serializer: str


@dataclasses.dataclass(slots=True)
class _PendingObject:
    payload: int
    obj_type: str


@dataclasses.dataclass(slots=True)
class _PendingReplicated:
    """A replicated leaf whose pieces several ranks may write; rank 0 assembles it at commit."""

    source: str  # the path whose pieces it uses (itself, or the tensor it is tied to)
    template: _TensorLeaf | _ObjectLeaf
    pieces: int


@dataclasses.dataclass(slots=True)
class _PendingSharded:
    path: str


_Pending = Entry | _PendingTensor | _PendingObject | _PendingReplicated | _PendingSharded


@dataclasses.dataclass
class TakePlan:
    """Everything this rank writes, decided before the first byte moves."""

    rank: int
    entries: dict[str, _Pending]
    payloads: list[Payload]
    data_objects: list[DataObjectPlan]
    slots: list[list[PieceSlot]]  # rank-local payload -> its slots
    shared_slots: dict[Hashable, PieceSlot]  # replicated/sharded piece key -> slot, for pieces this rank writes
    decision: Decision

    @property
    def nbytes(self) -> int:
        return sum(plan.nbytes for plan in self.data_objects)


def plan_take(
    states: Mapping[str, Any],
    *,
    rank: int,
    replicated: Sequence[str],
    config: Config,
    take_id: str | None = None,
) -> TakePlan:
    """Plan a single-process take: every leaf of ``states`` written by this process."""
    local = describe_state(states)
    decision = decide([rank_info(local, "", replicated)], chunk_bytes=config.chunk_bytes)
    return plan_rank(local, decision, rank=rank, config=config, take_id=take_id or secrets.token_hex(4))


def _shared_pieces(
    decision: Decision, rank: int, prefix: tuple[Any, ...], payload: int, out: list[tuple[int, int, int]]
) -> tuple[int, list[Hashable]]:
    """Count the pieces named ``prefix + (i,)``; queue those this rank writes into ``out``."""
    mine: list[Hashable] = []
    index = 0
    while (span := decision.piece_ranges.get((*prefix, index))) is not None:
        key = (*prefix, index)
        if decision.owner[key] == rank:
            out.append((payload, span[0], span[1]))
            mine.append(key)
        index += 1
    return index, mine


def plan_rank(local: LocalState, decision: Decision, *, rank: int, config: Config, take_id: str) -> TakePlan:
    """This rank's entries and data objects under ``decision``.

    Replicated and sharded leaves appear only in rank 0's entries (every rank reads them from
    there); each rank writes the pieces of them the decision gave it.
    """
    entries: dict[str, _Pending] = {f"{rank}/{path}": c for path, c in local.containers.items()}
    shared: list[tuple[int, int, int]] = []
    shared_keys: list[Hashable] = []
    local_payloads: list[int] = []
    for path, leaf in local.leaves.items():
        key = f"{rank}/{path}"
        if isinstance(leaf, _ShardedLeaf):
            for box, payload in leaf.boxes:
                shared_keys.extend(_shared_pieces(decision, rank, ("s", path, box[0]), payload, shared)[1])
            if rank == 0:
                entries[key] = _PendingSharded(path)
        elif path in decision.replicated:
            if isinstance(leaf, PrimitiveEntry):
                if rank == 0:
                    entries[key] = PrimitiveEntry.of(leaf.value, True)
            elif isinstance(leaf, _TensorLeaf) and leaf.alias_of is not None:
                if rank == 0:
                    entries[key] = _PendingReplicated(leaf.alias_of, leaf, -1)
            else:
                assert isinstance(leaf, (_TensorLeaf, _ObjectLeaf))
                count, mine = _shared_pieces(decision, rank, ("r", path), leaf.payload, shared)
                shared_keys.extend(mine)
                if rank == 0:
                    entries[key] = _PendingReplicated(path, leaf, count)
        elif isinstance(leaf, PrimitiveEntry):
            entries[key] = leaf
        elif isinstance(leaf, _TensorLeaf):
            entries[key] = _PendingTensor(leaf.payload, leaf.dtype, leaf.shape, leaf.serializer)
            local_payloads.append(leaf.payload)
        else:
            assert isinstance(leaf, _ObjectLeaf)
            entries[key] = _PendingObject(leaf.payload, leaf.obj_type)
            local_payloads.append(leaf.payload)
    local_pieces = [
        (index, start, end)
        for index in sorted(set(local_payloads))
        for start, end in split_payload(
            local.payloads[index].nbytes, local.payloads[index].itemsize, config.chunk_bytes
        )
    ]
    data_objects, slots = pack_pieces(
        local_pieces + shared, rank=rank, take_id=take_id, data_object_bytes=config.data_object_bytes
    )
    per_payload: list[list[PieceSlot]] = [[] for _ in local.payloads]
    for slot in slots[: len(local_pieces)]:
        per_payload[slot.payload].append(slot)
    shared_slots = dict(zip(shared_keys, slots[len(local_pieces) :], strict=True))
    return TakePlan(rank, entries, local.payloads, data_objects, per_payload, shared_slots, decision)


def collect_state(app_state: dict[str, Stateful]) -> dict[str, Any]:
    """Call every ``state_dict()``, RNG first, and put the RNG back afterwards.

    Other objects' ``state_dict()`` may draw random numbers; re-applying the state captured
    first means the snapshot and the caller both continue from the same RNG state.
    """
    rng_keys = [k for k, v in app_state.items() if isinstance(v, RNGState)]
    states: dict[str, Any] = {}
    for key in rng_keys:
        states[key] = app_state[key].state_dict()
    for key in sorted(app_state):
        if key not in states:
            states[key] = app_state[key].state_dict()
    for key in rng_keys:
        app_state[key].load_state_dict(states[key])
    return states


def _utf8_encodable(value: Any) -> bool:
    """Strings with lone surrogates cannot go inline into the UTF-8 manifest; they are pickled."""
    if type(value) is not str or value.isascii():
        return True
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _serialize(path: str, value: Any) -> bytes:
    try:
        return serialize_object(value)
    except Exception as exc:  # pickling raises many types (TypeError, PicklingError, AttributeError)
        raise UnsupportedValueError(
            f"cannot store the {type(value).__name__} at logical path {path!r}: torch.save failed with "
            f"{type(exc).__name__}: {exc}. Make it picklable, or return tensors/primitives from state_dict()"
        ) from exc


# --------------------------------------------------------------------- results and the manifest


@dataclasses.dataclass
class RankResult:
    """What a rank wrote: its finished entries (rank 0 also the pending shared ones) and the
    pieces of replicated and sharded leaves it wrote."""

    entries: dict[str, Entry | _PendingReplicated | _PendingSharded]
    shared: dict[Hashable, Piece]


def _piece(slot: PieceSlot, checksum: int) -> Piece:
    return Piece(slot.location, (slot.offset, slot.offset + slot.nbytes), format_checksum(checksum))


def finish_rank(plan: TakePlan, checksums: Mapping[tuple[int, int], int]) -> RankResult:
    """Turn this rank's plan and the checksums of what it wrote into its :class:`RankResult`."""

    def pieces(payload: int) -> tuple[Piece, ...]:
        return tuple(_piece(slot, checksums[(payload, slot.start)]) for slot in plan.slots[payload])

    entries: dict[str, Entry | _PendingReplicated | _PendingSharded] = {}
    for key, entry in plan.entries.items():
        if isinstance(entry, _PendingTensor):
            entries[key] = TensorEntry(entry.dtype, entry.shape, entry.serializer, pieces(entry.payload), False)
        elif isinstance(entry, _PendingObject):
            (piece,) = pieces(entry.payload)  # torch.save output is never empty: exactly one piece
            entries[key] = ObjectEntry(entry.obj_type, piece, False)
        else:
            entries[key] = entry
    shared = {key: _piece(slot, checksums[(slot.payload, slot.start)]) for key, slot in plan.shared_slots.items()}
    return RankResult(entries, shared)


def merge_results(results: Sequence[RankResult], decision: Decision, layouts: Mapping[str, str]) -> dict[str, Entry]:
    """The snapshot's manifest: every rank's entries, shared leaves assembled from all ranks' pieces."""
    shared: dict[Hashable, Piece] = {}
    for result in results:
        shared.update(result.shared)

    def collect(prefix: tuple[Any, ...]) -> tuple[Piece, ...]:
        found: list[Piece] = []
        for index in itertools.count():
            key = (*prefix, index)
            if key not in decision.piece_ranges:
                return tuple(found)
            found.append(shared[key])
        raise AssertionError("unreachable")  # pragma: no cover

    manifest: dict[str, Entry] = {}
    for result in results:
        for key, entry in result.entries.items():
            if isinstance(entry, _PendingReplicated):
                template = entry.template
                pieces = collect(("r", entry.source))
                if isinstance(template, _TensorLeaf):
                    manifest[key] = TensorEntry(template.dtype, template.shape, template.serializer, pieces, True)
                else:
                    (piece,) = pieces
                    manifest[key] = ObjectEntry(template.obj_type, piece, True)
            elif isinstance(entry, _PendingSharded):
                dtype, shape, boxes = decision.sharded[entry.path]
                shards = tuple(Shard(box[0], box[1], collect(("s", entry.path, box[0]))) for box in boxes)
                manifest[key] = ShardedTensorEntry(dtype, shape, shards, layouts.get(entry.path, ""))
            else:
                manifest[key] = entry
    return manifest


def build_metadata(manifest: dict[str, Entry], world_size: int) -> SnapshotMetadata:
    return SnapshotMetadata(
        format_version=format_version_for(manifest),
        snapshotkit_version=__version__,
        torch_version=str(torch.__version__),
        created_at=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        world_size=world_size,
        manifest=manifest,
    )


# --------------------------------------------------------------------- I/O phases


def _storage_error(exc: BaseException, path: str) -> BaseException:
    if isinstance(exc, OSError) and not isinstance(exc, SnapshotkitError):
        return StorageError(
            f"writing the snapshot at {path!r} failed: {type(exc).__name__}: {exc}. Nothing was committed; "
            "check the path, permissions and free space, then take again"
        )
    return exc


async def write_rank(
    plugin: StoragePlugin, plan: TakePlan, *, path: str, config: Config, written: list[str]
) -> RankResult:
    """Write this rank's data objects; on failure delete them and raise (storage errors wrapped)."""
    try:
        checksums = await write_data_objects(
            plugin,
            plan.data_objects,
            plan.payloads,
            budget=MemoryBudget(config.memory_budget_bytes),
            io_concurrency=config.io_concurrency,
            written=written,
        )
    except BaseException as exc:
        await _discard(plugin, written)
        written.clear()
        wrapped = _storage_error(exc, path)
        if wrapped is exc:
            raise
        raise wrapped from exc
    return finish_rank(plan, checksums)


async def commit(plugin: StoragePlugin, metadata: SnapshotMetadata, *, path: str) -> None:
    """Write the manifest, exclusively: the snapshot exists from this moment on."""
    try:
        await plugin.write_exclusive(METADATA_FILENAME, metadata.to_json_text().encode())
    except FileExistsError:
        raise SnapshotExistsError(
            f"another take committed a snapshot at {path!r} while this one was writing; "
            "this take's data was discarded. Use a new path for every snapshot"
        ) from None
    except OSError as exc:
        raise _storage_error(exc, path) from exc


async def execute_take(
    plugin: StoragePlugin, plan: TakePlan, *, path: str, world_size: int, config: Config
) -> SnapshotMetadata:
    """Single-process take of a plan: write, then commit; on any failure delete what was written."""
    written: list[str] = []
    result = await write_rank(plugin, plan, path=path, config=config, written=written)
    try:
        metadata = build_metadata(merge_results([result], plan.decision, {}), world_size)
        await commit(plugin, metadata, path=path)
    except BaseException:
        await _discard(plugin, written)
        raise
    return metadata


async def _discard(plugin: StoragePlugin, written: Sequence[str]) -> None:
    with contextlib.suppress(Exception):  # cleanup must not mask the take's own error
        await plugin.discard(written)


# --------------------------------------------------------------------- the take, on every rank


def ddp_replicated_patterns(app_state: Mapping[str, Stateful]) -> list[str]:
    """Logical paths of the state of ``DistributedDataParallel`` values, which DDP keeps identical
    on every rank (parameters and buffers it was told to ignore excepted), as exact patterns."""
    try:
        from torch.nn.parallel import DistributedDataParallel
    except ImportError:  # pragma: no cover - torch without distributed
        return []
    patterns: list[str] = []
    for key, value in app_state.items():
        if not isinstance(value, DistributedDataParallel):
            continue
        ignored = set(getattr(value, "parameters_to_ignore", ()))
        for name in value.module.state_dict():
            if name not in ignored:
                patterns.append(glob.escape(join_path(escape_key(key), f"module.{name}")))
    return patterns


@dataclasses.dataclass
class PreparedTake:
    """A take after the first exchange: this rank's plan, identical decisions on every rank."""

    path: str  # rank 0's path, which every rank writes to
    local: LocalState
    decision: Decision
    plan: TakePlan
    take_id: str


def prepare_take(
    path: str,
    app_state: object,
    *,
    group: Group,
    config: Config,
    replicated: Sequence[str],
    open_plugin: Callable[[str], StoragePlugin],
) -> PreparedTake:
    """Collect and describe this rank's state, exchange descriptions, and plan (shared by
    ``take`` and ``async_take``). Objects are serialized here; nothing is written yet."""
    local: LocalState | None = None
    info: RankInfo | None = None
    error: BaseException | None = None
    try:
        states_of = validate_app_state(app_state)
        if group.rank == 0:
            run_sync(_refuse_existing(open_plugin(path), path))
        states = collect_state(states_of)
        patterns = list(dict.fromkeys([*replicated, *ddp_replicated_patterns(states_of)]))
        with gc_paused():
            local = describe_state(states)
            info = rank_info(local, path, patterns)
            info.take_id = secrets.token_hex(4)
    except Exception as exc:
        error = exc
    infos: list[RankInfo] = group.exchange(info, error, "take: describing each rank's state")
    assert local is not None
    if group.rank == 0:
        _warn_about_differences(infos)
    with gc_paused():
        decision = decide(infos, chunk_bytes=config.chunk_bytes)
        plan = plan_rank(local, decision, rank=group.rank, config=config, take_id=infos[0].take_id)
    if group.rank == 0 and decision.differing:
        shown = ", ".join(f"{p!r} (ranks {r[:4]})" for p, r in sorted(decision.differing.items())[:5])
        warnings.warn(
            f"{len(decision.differing)} path(s) match replicated= patterns but differ between ranks, e.g. {shown}; "
            "they are stored per rank instead",
            stacklevel=4,
        )
    return PreparedTake(infos[0].path, local, decision, plan, infos[0].take_id)


def sharded_layouts(local: LocalState) -> dict[str, str]:
    return {p: leaf.layout for p, leaf in local.leaves.items() if isinstance(leaf, _ShardedLeaf)}


def take_on_group(
    path: str,
    app_state: object,
    *,
    group: Group,
    config: Config,
    replicated: Sequence[str],
    open_plugin: Callable[[str], StoragePlugin],
) -> tuple[str, SnapshotMetadata | None]:
    """Take a snapshot SPMD on every rank of ``group``: the path written (rank 0's) and, on rank
    0, the committed metadata.

    Three exchanges keep the ranks in step whatever happens on any of them: after describing the
    state (nothing written yet), after writing the data objects, after rank 0's commit. A failure
    on any rank makes every rank raise at the next exchange, and each rank deletes what it wrote.
    """
    prepared = prepare_take(path, app_state, group=group, config=config, replicated=replicated, open_plugin=open_plugin)
    local, decision, plan = prepared.local, prepared.decision, prepared.plan
    target = prepared.path
    written: list[str] = []
    result: RankResult | None = None
    error = None

    async def write() -> RankResult:
        plugin = open_plugin(target)
        try:
            return await write_rank(plugin, plan, path=target, config=config, written=written)
        finally:
            await plugin.close()

    try:
        with gc_paused():
            result = run_sync(write())
    except Exception as exc:
        error = exc
    try:
        results: list[RankResult] = group.exchange(result, error, "take: writing the data objects")
        metadata: SnapshotMetadata | None = None
        error = None
        if group.rank == 0:
            try:
                with gc_paused():
                    metadata = build_metadata(
                        merge_results(results, decision, sharded_layouts(local)), group.world_size
                    )
                run_sync(_commit_with(open_plugin(target), metadata, target))
            except Exception as exc:
                error = exc
        group.exchange(None, error, "take: committing the manifest")
    except BaseException:
        if written:
            run_sync(_discard_with(open_plugin(target), written))
        raise
    return target, metadata


async def _refuse_existing(plugin: StoragePlugin, path: str) -> None:
    try:
        if await plugin.exists(METADATA_FILENAME):
            raise SnapshotExistsError(
                f"a snapshot already exists at {path!r}; snapshotkit never overwrites one. "
                "Take to a new path (e.g. one per step), or delete the old snapshot first"
            )
    finally:
        await plugin.close()


async def _commit_with(plugin: StoragePlugin, metadata: SnapshotMetadata, path: str) -> None:
    try:
        await commit(plugin, metadata, path=path)
    finally:
        await plugin.close()


async def _discard_with(plugin: StoragePlugin, written: Sequence[str]) -> None:
    try:
        await _discard(plugin, written)
    finally:
        await plugin.close()


def _warn_about_differences(infos: Sequence[RankInfo]) -> None:
    paths = {info.path for info in infos}
    if len(paths) > 1:
        warnings.warn(
            f"the ranks passed {len(paths)} different paths to Snapshot.take; rank 0's {infos[0].path!r} is used",
            stacklevel=4,
        )
