"""Taking a snapshot: collect state, plan the layout, write data objects, commit the manifest.

IMPORTANT: the manifest is written last, with an exclusive write, and only after every data
object write returned; a take that fails or is interrupted before that deletes what it wrote,
and in any case leaves no manifest, so nothing half-written ever opens as a snapshot.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import fnmatch
import secrets
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from ._budget import MemoryBudget
from ._checksum import format_checksum
from ._config import Config
from ._flatten import escape_key, flatten
from ._plan import DataObjectPlan, PieceSlot, plan_layout
from ._serialization import RAW, dtype_name, serialize_object, tensor_serializer
from ._version import __version__
from ._write_pipeline import Payload, write_data_objects
from .errors import (
    InvalidAppStateError,
    SnapshotExistsError,
    SnapshotkitError,
    StorageError,
    UnsupportedValueError,
)
from .manifest import (
    FORMAT_VERSION,
    METADATA_FILENAME,
    Entry,
    ObjectEntry,
    Piece,
    PrimitiveEntry,
    SnapshotMetadata,
    TensorEntry,
)
from .stateful import RNGState, Stateful
from .storage import StoragePlugin

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


@dataclasses.dataclass(slots=True)
class _PendingTensor:
    payload: int
    dtype: str
    shape: tuple[int, ...]
    serializer: str
    replicated: bool


@dataclasses.dataclass(slots=True)
class _PendingObject:
    payload: int
    obj_type: str
    replicated: bool


@dataclasses.dataclass
class TakePlan:
    """Everything a take writes, decided before the first byte moves."""

    entries: dict[str, Entry | _PendingTensor | _PendingObject]
    payloads: list[Payload]
    data_objects: list[DataObjectPlan]
    slots: list[list[PieceSlot]]

    @property
    def nbytes(self) -> int:
        return sum(plan.nbytes for plan in self.data_objects)


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


def plan_take(
    states: Mapping[str, Any], *, rank: int, replicated: Sequence[str], config: Config, take_id: str | None = None
) -> TakePlan:
    """Flatten collected state into manifest entries and a data-object layout."""
    entries: dict[str, Entry | _PendingTensor | _PendingObject] = {}
    payloads: list[Payload] = []
    by_identity: dict[tuple[Any, ...], int] = {}

    def is_replicated(path: str) -> bool:
        return any(fnmatch.fnmatchcase(path, pattern) for pattern in replicated)

    for key in sorted(states):
        containers, leaves = flatten(states[key], escape_key(key))
        for path, container in containers.items():
            entries[f"{rank}/{path}"] = container
        for path, leaf in leaves.items():
            manifest_key = f"{rank}/{path}"
            flag = bool(replicated) and is_replicated(path)
            if isinstance(leaf, torch.Tensor):
                entries[manifest_key] = _plan_tensor(path, leaf, flag, payloads, by_identity)
            elif leaf is None or (type(leaf) in _PRIMITIVE_TYPES and _utf8_encodable(leaf)):
                entries[manifest_key] = PrimitiveEntry.of(leaf, flag)
            else:
                payloads.append(Payload.of_bytes(_serialize(path, leaf)))
                obj_type = f"{type(leaf).__module__}.{type(leaf).__qualname__}"
                entries[manifest_key] = _PendingObject(len(payloads) - 1, obj_type, flag)

    data_objects, slots = plan_layout(
        [p.nbytes for p in payloads],
        [p.itemsize for p in payloads],
        rank=rank,
        take_id=take_id if take_id is not None else secrets.token_hex(4),
        chunk_bytes=config.chunk_bytes,
        data_object_bytes=config.data_object_bytes,
    )
    return TakePlan(entries, payloads, data_objects, slots)


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


def _plan_tensor(
    path: str,
    tensor: torch.Tensor,
    replicated: bool,
    payloads: list[Payload],
    by_identity: dict[tuple[Any, ...], int],
) -> _PendingTensor:
    if tensor.is_meta:
        raise UnsupportedValueError(
            f"the tensor at logical path {path!r} is on the meta device and has no data; materialize it first"
        )
    serializer = tensor_serializer(tensor)
    if serializer == RAW:
        identity = _tensor_identity(tensor)
        index = by_identity.get(identity) if identity is not None else None
        if index is None:
            payloads.append(Payload.of_tensor(tensor))
            index = len(payloads) - 1
            if identity is not None:
                by_identity[identity] = index
    else:
        payloads.append(Payload.of_bytes(_serialize(path, tensor)))
        index = len(payloads) - 1
    return _PendingTensor(index, dtype_name(tensor.dtype), tuple(tensor.shape), serializer, replicated)


def _finish_entries(plan: TakePlan, checksums: Mapping[tuple[int, int], int]) -> dict[str, Entry]:
    def pieces(payload: int) -> tuple[Piece, ...]:
        return tuple(
            Piece(
                slot.location,
                (slot.offset, slot.offset + slot.nbytes),
                format_checksum(checksums[(payload, slot.start)]),
            )
            for slot in plan.slots[payload]
        )

    manifest: dict[str, Entry] = {}
    for key, entry in plan.entries.items():
        if isinstance(entry, _PendingTensor):
            manifest[key] = TensorEntry(
                entry.dtype, entry.shape, entry.serializer, pieces(entry.payload), entry.replicated
            )
        elif isinstance(entry, _PendingObject):
            (piece,) = pieces(entry.payload)  # torch.save output is never empty: exactly one piece
            manifest[key] = ObjectEntry(entry.obj_type, piece, entry.replicated)
        else:
            manifest[key] = entry
    return manifest


async def execute_take(
    plugin: StoragePlugin, plan: TakePlan, *, path: str, world_size: int, config: Config
) -> SnapshotMetadata:
    """Write the data objects, then commit the manifest; on any failure delete what was written."""
    written: list[str] = []
    try:
        checksums = await write_data_objects(
            plugin,
            plan.data_objects,
            plan.payloads,
            budget=MemoryBudget(config.memory_budget_bytes),
            io_concurrency=config.io_concurrency,
            written=written,
        )
        metadata = SnapshotMetadata(
            format_version=FORMAT_VERSION,
            snapshotkit_version=__version__,
            torch_version=str(torch.__version__),
            created_at=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            world_size=world_size,
            manifest=_finish_entries(plan, checksums),
        )
        try:
            await plugin.write_exclusive(METADATA_FILENAME, metadata.to_json_text().encode())
        except FileExistsError:
            raise SnapshotExistsError(
                f"another take committed a snapshot at {path!r} while this one was writing; "
                "this take's data was discarded. Use a new path for every snapshot"
            ) from None
        return metadata
    except BaseException as exc:
        await _discard(plugin, written)
        if isinstance(exc, OSError) and not isinstance(exc, SnapshotkitError):
            raise StorageError(
                f"writing the snapshot at {path!r} failed: {type(exc).__name__}: {exc}. Nothing was committed; "
                "check the path, permissions and free space, then take again"
            ) from exc
        raise


async def _discard(plugin: StoragePlugin, written: Sequence[str]) -> None:
    with contextlib.suppress(Exception):  # cleanup must not mask the take's own error
        await plugin.discard(written)
