"""Sharded state in a local copy: each ``DTensor`` or ``ShardedTensor`` as this rank's own shard.

A local copy is a snapshot taken by one rank alone, and the format's ``sharded_tensor`` entry must
cover its whole global tensor, which one rank of a sharded model never holds. So, for the local
tier only, :func:`own_shards` shows the take (and the restore of a local copy) a view of the app
state in which every sharded tensor is its local tensor, a plain tensor under the same logical
path; the copy's user metadata records where each one sits in its global tensor
(:class:`ShardLayout`). A restore of the copy writes into those local tensors in place (they are
the sharded tensors' own memory) and hands the original ``DTensor`` objects back to
``load_state_dict``. Before it reads anything, it checks that the state holds the same shards the
copy holds (:func:`check_layouts`): the tier needs the same world size and the same rank for
each shard (docs/lifecycle.md, "Tiers").

Statefuls without a sharded tensor are passed through as they are, so that the restore's checks
for modules, optimizers and :class:`~snapshotkit.RNGState` still apply to them.
"""

from __future__ import annotations

import dataclasses
import sys
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

import torch

from snapshotkit._format.document import SnapshotMetadata
from snapshotkit._format.entries import TensorEntry, escape_key, join_path
from snapshotkit._format.sharded import is_sharded, local_shards
from snapshotkit._plan.flatten import is_flattenable_dict
from snapshotkit._restore.optimizer import check_param_groups, param_state, uses_torch_format
from snapshotkit._restore.plan import rank_view, subtree
from snapshotkit.errors import StateMismatchError, UnsupportedValueError
from snapshotkit.stateful import AppState, RNGState

__all__ = ["TIER_KEY", "OwnShards", "ShardLayout", "check_layouts", "check_optimizers", "own_shards"]

#: The user-metadata member of a local copy that records its shards (``{"shards": {path: layout}}``).
TIER_KEY = "snapshotkit.tier"

#: Modules one of which a process must have imported to hold a sharded tensor.
_SHARDED_MODULES = ("torch.distributed.tensor", "torch.distributed._shard.sharded_tensor")


@dataclasses.dataclass(frozen=True)
class ShardLayout:
    """Where a rank's own shard of a sharded tensor sits: the global ``shape``, and the box
    ``offsets`` / ``sizes`` of the local tensor."""

    shape: tuple[int, ...]
    offsets: tuple[int, ...]
    sizes: tuple[int, ...]

    def to_json(self) -> dict[str, list[int]]:
        return {"shape": list(self.shape), "offsets": list(self.offsets), "sizes": list(self.sizes)}

    @classmethod
    def from_json(cls, raw: Any) -> ShardLayout | None:
        """The layout in ``raw``, or None when it is not one (a copy written otherwise)."""
        if not isinstance(raw, Mapping):
            return None
        parts = [raw.get(name) for name in ("shape", "offsets", "sizes")]
        if not all(isinstance(p, list) and all(type(i) is int for i in p) for p in parts):
            return None
        return cls(*(tuple(p) for p in parts))  # type: ignore[arg-type]


@dataclasses.dataclass(frozen=True)
class OwnShards:
    """The app state as a local copy sees it.

    Attributes:
        app_state: each Stateful holding a sharded tensor wrapped (its state as local tensors),
            the others as they were.
        layouts: logical path -> where that local tensor sits in its global tensor.
    """

    app_state: AppState
    layouts: Mapping[str, ShardLayout]

    def layouts_json(self) -> dict[str, dict[str, list[int]]]:
        return {path: layout.to_json() for path, layout in self.layouts.items()}


_Originals = dict[int, tuple[torch.Tensor, torch.Tensor]]


class _LocalState:
    """A Stateful whose state is another one's, with every sharded tensor as its local tensor.

    ``state_dict()`` gives the view made once, when the wrapper was made; ``load_state_dict``
    puts the original sharded tensors back where the view's local tensors come back (they were
    restored in place) and hands the result to the wrapped object."""

    def __init__(self, inner: Any, view: Any, originals: _Originals, strict: bool) -> None:
        self.inner = inner
        self._view = view
        self._originals = originals  # id(local tensor) -> (local tensor, sharded tensor)
        self._strict = strict

    def state_dict(self) -> Any:
        return self._view

    def load_state_dict(self, state_dict: Any) -> Any:
        if isinstance(self.inner, torch.nn.Module):  # as the restore calls a module's: with its strict
            return self.inner.load_state_dict(self._back(state_dict), strict=self._strict)
        return self.inner.load_state_dict(self._back(state_dict))

    def _back(self, value: Any) -> Any:
        if isinstance(value, torch.Tensor):
            found = self._originals.get(id(value))
            return found[1] if found is not None and found[0] is value else value
        if type(value) in (dict, OrderedDict):
            return type(value)((k, self._back(v)) for k, v in value.items())
        if type(value) in (list, tuple):
            return type(value)(self._back(v) for v in value)
        return value


def own_shards(app_state: AppState, *, strict: bool = True, copy: SnapshotMetadata | None = None) -> OwnShards:
    """The view of ``app_state`` a local copy takes and restores (module docstring); ``strict`` is
    the restore's, passed on to a wrapped module's ``load_state_dict``. Restoring, ``copy`` is the
    copy's metadata: an optimizer that holds no state yet for a
    ``DTensor`` parameter whose state the copy holds (a fresh one, as a resumed run builds it) gets
    zero ``DTensor`` state laid out like the parameter in its view, which the restore fills.

    Calls ``state_dict()`` of each Stateful once more (a wrapped one's take or restore gets that
    result), only when this process has imported ``torch.distributed.tensor`` or ``ShardedTensor``:
    without them no state holds a sharded tensor, and ``app_state`` is returned as it is.

    Raises:
        UnsupportedValueError: a ``ShardedTensor`` with several local shards on this rank.
    """
    if not any(name in sys.modules for name in _SHARDED_MODULES):
        return OwnShards(app_state, {})
    wrapped: dict[str, Any] = {}
    layouts: dict[str, ShardLayout] = {}
    saved = _saved_layouts(copy.user_metadata) if copy is not None else {}
    for key, stateful in app_state.items():
        if isinstance(stateful, RNGState):
            wrapped[key] = stateful
            continue
        originals: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        found: dict[str, ShardLayout] = {}
        view = _swap(stateful.state_dict(), escape_key(key), originals, found)
        if copy is not None and uses_torch_format(stateful):
            _fresh_state(escape_key(key), stateful, view, copy, saved, originals, found)
        wrapped[key] = _LocalState(stateful, view, originals, strict) if found else stateful
        layouts.update(found)
    return OwnShards(wrapped, layouts)


def _swap(
    value: Any, path: str, originals: dict[int, tuple[torch.Tensor, torch.Tensor]], found: dict[str, ShardLayout]
) -> Any:
    """``value`` with every sharded tensor replaced by its local tensor (containers rebuilt only
    where something below them was replaced)."""
    if is_sharded(value):
        shards = local_shards(value, path)
        if len(shards.boxes) != 1:
            raise UnsupportedValueError(
                f"the ShardedTensor at {path!r} has {len(shards.boxes)} local shards on this rank; the local tier "
                "keeps one shard per rank and tensor: use one shard per rank, or a SnapshotManager without local_root"
            )
        box, local = shards.boxes[0]
        originals[id(local)] = (local, value)
        found[path] = ShardLayout(shards.shape, box.offsets, box.sizes)
        return local
    if type(value) in (dict, OrderedDict) and is_flattenable_dict(value, path):  # where the take descends
        items = [(k, _swap(v, join_path(path, k), originals, found)) for k, v in value.items()]
        changed = any(new is not value[k] for k, new in items)
        return type(value)(items) if changed else value
    if type(value) in (list, tuple):
        items = [_swap(v, join_path(path, i), originals, found) for i, v in enumerate(value)]
        changed = any(new is not old for new, old in zip(items, value, strict=True))
        return type(value)(items) if changed else value
    return value


def _fresh_state(
    root: str,
    optimizer: Any,
    view: Any,
    copy: SnapshotMetadata,
    saved: Mapping[str, ShardLayout | None],
    originals: _Originals,
    found: dict[str, ShardLayout],
) -> None:
    """Add to an optimizer's ``view`` the local tensors of zero ``DTensor`` state for every state
    tensor the copy holds as a shard (``saved``) and the optimizer does not hold yet; each is
    recorded like a swapped one, so the restore fills it and ``load_state_dict`` gets the DTensor."""
    wanted = {path: layout for path, layout in saved.items() if layout is not None and path not in found}
    if not wanted or not isinstance(view, dict) or not isinstance(view.get("state"), dict):
        return
    containers, leaves = subtree(rank_view(copy, 0), root)
    for key, name, path, param in param_state(root, optimizer, containers, leaves):
        layout, entry = wanted.get(path), leaves.get(path)
        if layout is None or not is_sharded(param) or not isinstance(entry, TensorEntry):
            continue
        if not hasattr(torch, entry.dtype):
            continue
        dtensor = torch.zeros_like(param, dtype=getattr(torch, entry.dtype), requires_grad=False)
        shards = local_shards(dtensor, path)
        box, local = shards.boxes[0]
        if ShardLayout(shards.shape, box.offsets, box.sizes) != layout:
            continue  # laid out otherwise: check_layouts refuses it
        view["state"].setdefault(key, {})[name] = local
        originals[id(local)] = (local, dtensor)
        found[path] = layout


def _saved_layouts(metadata: Mapping[str, Any]) -> dict[str, ShardLayout | None]:
    record = metadata.get(TIER_KEY)
    saved = record.get("shards") if isinstance(record, Mapping) else None
    return {path: ShardLayout.from_json(raw) for path, raw in saved.items()} if isinstance(saved, Mapping) else {}


def check_optimizers(copy: SnapshotMetadata, current: OwnShards) -> None:
    """Check the parameter groups of every wrapped optimizer against the ``copy``'s manifest, as a
    restore checks an optimizer it sees (the wrapper hides it), before anything is read.

    Raises:
        StateMismatchError: an optimizer's parameter groups or their sizes differ from the copy's.
    """
    wrapped = [(key, s.inner) for key, s in current.app_state.items() if isinstance(s, _LocalState)]
    optimizers = [(key, inner) for key, inner in wrapped if uses_torch_format(inner)]
    if not optimizers:
        return
    view = rank_view(copy, 0)
    for key, optimizer in optimizers:
        check_param_groups(escape_key(key), optimizer, *subtree(view, escape_key(key)))


def check_layouts(metadata: Mapping[str, Any], current: OwnShards, copy: str) -> None:
    """Refuse to restore the copy at ``copy``, whose user ``metadata`` records its shards, into a
    state whose shards sit elsewhere (another world size or mesh, another rank for a shard).

    Raises:
        StateMismatchError: the shards differ (the message names the first path).
    """
    stored = _saved_layouts(metadata)
    for path in sorted(set(stored) | set(current.layouts)):
        mine, theirs = current.layouts.get(path), stored.get(path)
        if mine != theirs:
            raise StateMismatchError(
                f"the local copy {copy} holds {_describe(theirs)} at {path!r}, and this rank's state holds "
                f"{_describe(mine)} there: the local tier restores a rank's own shards only, in place, into the "
                "same sharded tensors (same world size, same rank for each shard). Create the state first (an "
                "optimizer's, e.g. by one step with a learning rate of 0), or resume from the durable tier "
                "(a SnapshotManager of the same root without local_root restores from it alone)"
            )


def _describe(layout: ShardLayout | None) -> str:
    if layout is None:
        return "no sharded tensor (nothing, or a plain value: an optimizer whose state is not created yet?)"
    return f"the shard at offsets {list(layout.offsets)} of size {list(layout.sizes)} of a {list(layout.shape)} tensor"
