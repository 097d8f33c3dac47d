"""The first stage of a take: call ``state_dict()``, flatten and describe.

Describing turns every leaf into a typed :mod:`~snapshotkit._plan.leaves` description and a
payload (objects are serialized here), finds tied tensors (stored once), and refuses what
cannot be stored, naming its logical path, before anything is written. A take's
``_custom_tensor_prepare_func`` is applied here, the one step both ``take`` and ``async_take``
run on the caller's thread, so what it returns is what every later stage sees.
"""

from __future__ import annotations

import glob
import itertools
from collections.abc import Callable, Mapping
from typing import Any, TypeAlias

import torch

from snapshotkit._format.dtypes import RAW_ITEMSIZE
from snapshotkit._format.entries import ContainerEntry, PrimitiveEntry, escape_key, join_path
from snapshotkit._format.serialization import (
    RAW,
    Serialized,
    dtype_name,
    is_zero_copy_source,
    serialize_object,
    tensor_serializer,
)
from snapshotkit._format.sharded import LocalChunks, box_slice, column_split, is_sharded, local_shards
from snapshotkit._plan.flatten import check_int, fits_inline, flatten
from snapshotkit._plan.grid import checked_grid, is_dtensor
from snapshotkit._plan.leaves import Leaf, LocalState, ObjectLeaf, Payload, ShardBox, ShardedLeaf, TensorLeaf
from snapshotkit._plan.select import Selection
from snapshotkit.errors import ConfigError, InvalidArgumentError, UnsupportedValueError
from snapshotkit.stateful import RNGState, Stateful

_PRIMITIVE_TYPES = (int, float, str, bool, bytes)

#: ``(logical_path, tensor, tracing) -> tensor to store`` (torchsnapshot's hook).
TensorPrepareFunc: TypeAlias = Callable[[str, torch.Tensor, bool], torch.Tensor]


def collect_state(app_state: Mapping[str, Stateful]) -> dict[str, Any]:
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


def check_tensor_prepare_func(func: object) -> TensorPrepareFunc | None:
    """``func`` if it is None or callable; else raise :class:`InvalidArgumentError`."""
    if func is None or callable(func):
        return func  # a callable; its arity and results are checked when it is called
    raise InvalidArgumentError(
        f"_custom_tensor_prepare_func must be a callable (logical_path, tensor, tracing) -> tensor, or None; "
        f"got {type(func).__name__} {func!r}"
    )


def describe_state(
    states: Mapping[str, Any], selection: Selection | None = None, prepare: TensorPrepareFunc | None = None
) -> LocalState:
    """Flatten collected state into containers, leaves and payloads (objects serialized here).

    With a ``selection`` only what it keeps is described (an app_state key with nothing kept
    is left out). With ``prepare``, every tensor (every local shard of a sharded tensor) is
    replaced by what ``prepare(path, tensor, False)`` returns, after a ``prepare(path, tensor,
    True)`` call that announces its dtype and shape (see :func:`_prepared`).

    Raises:
        ConfigError: the selection keeps nothing of a non-empty state.
    """
    containers: dict[str, ContainerEntry] = {}
    leaves: dict[str, Leaf] = {}
    payloads: list[Payload] = []
    tied = _TiedTensors()
    examples: list[str] = []  # leaf paths for the error when nothing is selected
    for key in sorted(states):
        root = escape_key(key)
        flat = flatten(states[key], root)
        if selection is not None:
            examples.extend(itertools.islice(flat.leaves, max(0, 8 - len(examples))))
            selected = selection.apply(flat, root)
            if selected is None:
                continue
            flat = selected
        containers.update(flat.containers)
        for path, leaf in flat.leaves.items():
            kind = type(leaf)
            if (kind is torch.Tensor or kind is torch.nn.Parameter) and prepare is None:  # the common case first
                leaves[path] = _describe_tensor(path, leaf, payloads, tied)
            elif is_sharded(leaf):
                leaves[path] = _describe_sharded(path, leaf, payloads, prepare)
            elif isinstance(leaf, torch.Tensor):
                if leaf.is_nested:  # no shape to record: stored whole, as an object
                    leaves[path] = _describe_nested(path, leaf, payloads)
                    continue
                if prepare is not None:
                    leaf = _prepared(prepare, path, leaf)
                leaves[path] = _describe_tensor(path, leaf, payloads, tied)
            elif type(leaf) is Serialized:  # already torch.save bytes: stored verbatim
                payloads.append(Payload.of_bytes(leaf.data))
                leaves[path] = ObjectLeaf(len(payloads) - 1, leaf.type_name)
            elif leaf is None or (type(leaf) in _PRIMITIVE_TYPES and fits_inline(leaf)):
                if type(leaf) is int:
                    check_int(path, leaf)
                leaves[path] = PrimitiveEntry.of(leaf, False)
            else:
                payloads.append(Payload.of_bytes(_serialize(path, leaf)))
                leaves[path] = ObjectLeaf(len(payloads) - 1, f"{type(leaf).__module__}.{type(leaf).__qualname__}")
    if selection is not None and states and not (containers or leaves):
        raise ConfigError(
            f"include={list(selection.include) if selection.include is not None else None} and "
            f"exclude={list(selection.exclude)} select nothing of this state, whose logical paths include "
            f"{examples}; nothing was written. Patterns are globs over logical paths ('*' also matches '/', so "
            "'model/**' is everything under 'model'): fix the patterns, or leave them out to store everything"
        )
    return LocalState(containers, leaves, payloads)


def _tensor_identity(tensor: torch.Tensor) -> tuple[Any, ...]:
    """A key equal for two tensors exactly when they read the same values from the same elements
    (tied weights): a lazy conj or neg view of a tensor reads other values, so it is not tied."""
    return (
        tensor.untyped_storage().data_ptr(),
        tensor.storage_offset(),
        tuple(tensor.shape),
        tuple(tensor.stride()),
        tensor.dtype,
        tensor.device,
        tensor.is_conj(),
        tensor.is_neg(),
    )


class _TiedTensors:
    """Finds the tensors that view the same elements as one described earlier (tied weights).

    Keyed by the address of the first element: the full :func:`_tensor_identity` (storage,
    offset, shape, strides, dtype, device) is built only for tensors whose first element another
    tensor's also is, not once per tensor of a state of thousands.
    """

    __slots__ = ("_by_identity", "_first")

    def __init__(self) -> None:
        #: first element's address -> the first tensor seen there, its payload and path (the
        #: tensor None once its identity is in ``_by_identity``).
        self._first: dict[int, tuple[torch.Tensor | None, int, str]] = {}
        self._by_identity: dict[tuple[Any, ...], tuple[int, str]] = {}

    def earlier(
        self, tensor: torch.Tensor, numel: int, address: int, payload: int, path: str
    ) -> tuple[int, str] | None:
        """The payload and path of an earlier tensor with the same elements as ``tensor`` (of
        ``numel()`` elements from ``data_ptr()`` ``address``); if there is none, ``tensor`` is
        remembered as ``payload`` at ``path`` and None returned. An empty tensor is tied to nothing."""
        if not numel:
            return None
        mine = (tensor, payload, path)
        first = self._first.setdefault(address, mine)
        if first is mine:
            return None
        if first[0] is not None:  # the first collision at this address: key the first tensor fully
            self._by_identity.setdefault(_tensor_identity(first[0]), (first[1], first[2]))
            self._first[address] = (None, first[1], first[2])
        remembered = (payload, path)
        known = self._by_identity.setdefault(_tensor_identity(tensor), remembered)
        return None if known is remembered else known


def _prepared(prepare: TensorPrepareFunc, path: str, tensor: torch.Tensor) -> torch.Tensor:
    """What ``prepare`` makes of ``tensor`` for storage.

    torchsnapshot's contract, kept: the hook is called with ``tracing=True`` first, when only the
    dtype and shape of its result matter (a hook may return a cheap stand-in, e.g. an empty
    tensor), then with ``tracing=False`` for the data to store. The shape may not change (restore
    fills the original destinations); the dtype may.
    """
    traced = _checked_result(path, tensor, prepare(path, tensor, True), "True")
    stored = _checked_result(path, tensor, prepare(path, tensor, False), "False")
    if stored.dtype != traced.dtype:
        raise UnsupportedValueError(
            f"_custom_tensor_prepare_func returned {dtype_name(traced.dtype)} for {path!r} with tracing=True but "
            f"{dtype_name(stored.dtype)} with tracing=False; the traced dtype must be the stored one"
        )
    return stored


def _checked_result(path: str, tensor: torch.Tensor, result: object, tracing: str) -> torch.Tensor:
    if not isinstance(result, torch.Tensor):
        raise UnsupportedValueError(
            f"_custom_tensor_prepare_func returned a {type(result).__name__} for the tensor at {path!r} "
            f"(tracing={tracing}); it must return a torch.Tensor (the tensor to store)"
        )
    if result.shape != tensor.shape:
        raise UnsupportedValueError(
            f"_custom_tensor_prepare_func changed the shape of the tensor at {path!r} from {list(tensor.shape)} "
            f"to {list(result.shape)} (tracing={tracing}); it may change the dtype, not the shape"
        )
    return result


def _describe_sharded(
    path: str, value: torch.Tensor | LocalChunks, payloads: list[Payload], prepare: TensorPrepareFunc | None
) -> ShardedLeaf:
    shards = local_shards(value, path)
    dtype, held = shards.dtype, list(shards.boxes)
    if prepare is not None:
        held = [(box, _prepared(prepare, path, local)) for box, local in held]
        if held:
            dtype = held[0][1].dtype
        else:  # no shard here, but every rank must report the stored dtype: trace an empty stand-in
            probe = torch.empty(0, dtype=dtype)
            dtype = _checked_result(path, probe, prepare(path, probe, True), "True").dtype
        mixed = sorted({dtype_name(local.dtype) for _, local in held} - {dtype_name(dtype)})
        if mixed:
            raise UnsupportedValueError(
                f"_custom_tensor_prepare_func returned {dtype_name(dtype)} and {mixed[0]} for local shards of the "
                f"sharded tensor at {path!r}; every shard must be stored in one dtype"
            )
    if dtype_name(dtype) not in RAW_ITEMSIZE:
        raise UnsupportedValueError(
            f"the sharded tensor at {path!r} has dtype {dtype_name(dtype)}, which is stored only through "
            "torch.save; gather it into a plain tensor first (docs/format.md section 4.1 lists the raw dtypes)"
        )
    boxes = []
    for box, local in held:
        if local.is_meta:
            raise UnsupportedValueError(f"the sharded tensor at {path!r} has a meta local shard; materialize it")
        # A large box is stored as column sub-boxes (strided views, copied when staged), so a
        # restore needing some of its columns (Shard(1) from Shard(0) or Shard(1)) reads only
        # those sub-boxes, each whole and verified.
        for part in column_split(box, shards.shape, dtype.itemsize):
            view = local.detach() if part is box else box_slice(local.detach(), box.offsets, part)
            payloads.append(Payload.of_tensor(view))
            boxes.append(ShardBox(part, len(payloads) - 1))
    # a DTensor whose mesh and placements give exactly these boxes is described by them (the same on every rank)
    grid = checked_grid(value, [b.box for b in boxes], dtype.itemsize) if is_dtensor(value) else None
    return ShardedLeaf(dtype_name(dtype), shards.shape, shards.layout, tuple(boxes), grid)


def _describe_nested(path: str, tensor: torch.Tensor, payloads: list[Payload]) -> ObjectLeaf:
    """A nested tensor (strided or jagged): its components differ in shape, so the manifest's
    dtype and shape cannot describe it; ``torch.save`` bytes restore it equal (weights_only too)."""
    payloads.append(Payload.of_bytes(_serialize(path, tensor)))
    return ObjectLeaf(len(payloads) - 1, f"{type(tensor).__module__}.{type(tensor).__qualname__}")


def _describe_tensor(
    path: str, tensor: torch.Tensor, payloads: list[Payload], tied: _TiedTensors
) -> TensorLeaf | ObjectLeaf:
    if tensor.is_meta:
        raise UnsupportedValueError(
            f"the tensor at logical path {path!r} is on the meta device and has no data; materialize it first"
        )
    raw = _RAW_DTYPES.get(tensor.dtype)
    kind = type(tensor)
    if (
        raw is None
        or not (kind is torch.Tensor or kind is torch.nn.Parameter)
        or tensor.layout != torch.strided
        or tensor.is_quantized
    ):  # else RAW, what tensor_serializer() says, without its calls: this runs once per tensor
        serializer = tensor_serializer(tensor)
        if serializer != RAW:
            payloads.append(Payload.of_bytes(_serialize(path, tensor)))
            return TensorLeaf(len(payloads) - 1, dtype_name(tensor.dtype), tuple(tensor.shape), serializer)
        raw = dtype_name(tensor.dtype), tensor.element_size()
    dtype, itemsize = raw
    try:
        shape = tuple(tensor.shape)
    except RuntimeError:  # a strided nested tensor (type Tensor: the common path) has no shape; a jagged
        # one is a subclass, found by describe_state (checked here: free when none raises)
        if tensor.is_nested:
            return _describe_nested(path, tensor, payloads)
        raise
    numel, address = tensor.numel(), tensor.data_ptr()
    known = tied.earlier(tensor, numel, address, len(payloads), path)
    if known is not None:
        return TensorLeaf(known[0], dtype, shape, RAW, alias_of=known[1])
    # Payload.of_tensor, with what is known here already
    zero_copy = numel and is_zero_copy_source(tensor)
    payloads.append(Payload(numel * itemsize, itemsize, tensor, None, address if zero_copy else 0))
    return TensorLeaf(len(payloads) - 1, dtype, shape, RAW)


#: Raw dtypes (stored as their bytes) -> manifest name and element size.
_RAW_DTYPES: dict[torch.dtype, tuple[str, int]] = {
    value: (dtype_name(value), RAW_ITEMSIZE[dtype_name(value)])
    for value in vars(torch).values()
    if isinstance(value, torch.dtype) and dtype_name(value) in RAW_ITEMSIZE
}


def _serialize(path: str, value: Any) -> bytes:
    try:
        return serialize_object(value)
    except Exception as exc:  # pickling raises many types (TypeError, PicklingError, AttributeError)
        raise UnsupportedValueError(
            f"cannot store the {type(value).__name__} at logical path {path!r}: torch.save failed with "
            f"{type(exc).__name__}: {exc}. Make it picklable, or return tensors/primitives from state_dict()"
        ) from exc
