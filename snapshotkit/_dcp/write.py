"""One rank's part of a DCP save: its write items as a state, written by the take pipeline.

DCP flattens a nested state dict into FQNs (``"model.layer1.weight"``) and keeps, in the plan's
``planner_data``, the path of keys each came from (``("model", "layer1.weight")``). The part
rebuilds that nesting, so every value gets the logical path ``Snapshot.take`` gives it for the
same state (``model/layer1.weight``: each key escaped, ``/`` as ``%2F``), then takes it on a
group of one (:mod:`snapshotkit._take.detached`): DCP has already decided which rank writes
each item, and its own exchange stands in for the take's rendezvous, so snapshotkit issues no
collective here (this runs on ``async_save``'s thread or in its checkpoint process too).

* ``TENSOR`` items (whole tensors; DCP's planner gives each to one rank) stay plain tensors.
* ``SHARD`` items (a ``DTensor``'s or ``ShardedTensor``'s chunks) become
  :class:`~snapshotkit._format.sharded.LocalChunks`, stored as a sharded tensor whose shards
  every rank's part adds to (checked to cover it exactly once at the commit).
* ``BYTE_IO`` items (anything else, ``torch.save``-d by DCP) become
  :class:`~snapshotkit._format.serialization.Serialized`: DCP's bytes are the stored object.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch.distributed.checkpoint.planner import SavePlan, SavePlanner, WriteItemType

from snapshotkit._app_state import Held
from snapshotkit._config import Config
from snapshotkit._dist import Group
from snapshotkit._format.serialization import Serialized
from snapshotkit._format.sharded import Box, LocalChunks
from snapshotkit._take.detached import WrittenPart, write_part
from snapshotkit._take.prepare import LoadBase, prepare_take
from snapshotkit.errors import UnsupportedValueError
from snapshotkit.storage import open_storage_plugin


def item_keys(plan: SavePlan, fqn: str) -> tuple[str | int, ...]:
    """The nested keys DCP flattened into ``fqn`` (``(fqn,)`` when it did not flatten)."""
    mappings = plan.planner_data if isinstance(plan.planner_data, Mapping) else {}
    keys = mappings.get(fqn)
    return tuple(keys) if keys else (fqn,)


def _type_name(planner: SavePlanner, item: Any) -> str:
    """The type of a ``BYTE_IO`` item's value, for the manifest (informative)."""
    lookup: Callable[[Any], Any] | None = getattr(planner, "lookup_object", None)
    if lookup is None:
        return "bytes"
    try:
        value = lookup(item.index)
    except Exception:  # a planner of its own: the type is only informative
        return "bytes"
    return f"{type(value).__module__}.{type(value).__qualname__}"


def _place(tree: dict[Any, Any], keys: tuple[str | int, ...], value: Any, fqn: str) -> None:
    node = tree
    for key in keys[:-1]:
        child = node.setdefault(key, {})
        if not isinstance(child, dict):
            raise UnsupportedValueError(f"the DCP item {fqn!r} lies below another item's value at key {key!r}")
        node = child
    if keys[-1] in node:
        raise UnsupportedValueError(f"two DCP items of this rank map to the keys {list(keys)} (the last: {fqn!r})")
    node[keys[-1]] = value


def plan_state(plan: SavePlan, planner: SavePlanner) -> dict[str, Held]:
    """This rank's write items as an ``app_state`` (module docstring)."""
    tree: dict[Any, Any] = {}
    chunks: dict[str, tuple[tuple[str | int, ...], torch.dtype, tuple[int, ...], list[tuple[Box, torch.Tensor]]]] = {}
    for item in plan.items:
        fqn = item.index.fqn
        keys = item_keys(plan, fqn)
        data: Any = planner.resolve_data(item)
        if item.type == WriteItemType.BYTE_IO:
            _place(tree, keys, Serialized(data.getvalue(), _type_name(planner, item)), fqn)
        elif item.type == WriteItemType.TENSOR:
            _place(tree, keys, data.detach(), fqn)
        else:
            tensor_data = item.tensor_data
            assert tensor_data is not None  # a SHARD item always describes its chunk
            box = Box(tuple(tensor_data.chunk.offsets), tuple(tensor_data.chunk.sizes))
            held = chunks.setdefault(fqn, (keys, tensor_data.properties.dtype, tuple(tensor_data.size), []))
            held[3].append((box, data.detach()))
    for fqn, (keys, dtype, shape, boxes) in chunks.items():
        _place(tree, keys, LocalChunks(dtype, shape, tuple(boxes)), fqn)
    return {str(key): Held(value) for key, value in tree.items()}


def save_part(
    path: str,
    plan: SavePlan,
    planner: SavePlanner,
    *,
    storage_options: Mapping[str, Any],
    config: Config,
    load_base: LoadBase | None,
) -> WrittenPart | None:
    """Write this rank's items as its part of the snapshot at ``path`` (None: it has none)."""
    if not plan.items:
        return None
    options = dict(storage_options)
    prepared = prepare_take(
        path,
        plan_state(plan, planner),
        group=Group(0, 1, None, config.collective_timeout_seconds),
        config=config,
        replicated=[],
        open_plugin=lambda where: open_storage_plugin(where, options),
        load_base=load_base,
        partial_shards=True,
    )
    return write_part(prepared, config=config, storage_options=options)
