"""Optimizer state checked against the parameters it belongs to, before anything is loaded.

``torch.optim.Optimizer.load_state_dict`` maps the saved state to parameters by position (the
``params`` ids of the saved ``param_groups``, zipped with the optimizer's parameters group by
group) and accepts state of any shape: a moment buffer saved for a ``[3, 4]`` weight loads into
an optimizer over a ``[5, 4]`` weight and the error comes at the next ``step()``. So a restore
checks, for an optimizer that uses torch's ``state_dict()`` format, while it plans its reads:

* the number of parameter groups, and of parameters in each group, against the saved
  ``param_groups`` (``load_state_dict()`` refuses other counts, after other objects loaded);
* for torch.optim's own optimizers (and their subclasses), each per-parameter state tensor that
  the optimizer keeps shaped like its parameter (:data:`_PARAMETER_SHAPED`; ``step`` and other
  scalars are not) against the global shape of the parameter it maps to (a ``DTensor``
  parameter's state is a ``DTensor`` of the same global shape). Other optimizers may keep state
  of any shape (projected or quantized moments): only their counts are checked.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable, Iterator, Mapping
from typing import Any, TypeGuard

import torch

from snapshotkit._format.dtypes import RAW_ITEMSIZE
from snapshotkit._format.entries import DictEntry, Entry, ListEntry, PrimitiveEntry, ShardedTensorEntry, TensorEntry
from snapshotkit._plan.flatten import join_path
from snapshotkit._plan.grid import is_dtensor
from snapshotkit.errors import StateMismatchError

Shape = tuple[int, ...]
ShapeRule = Callable[[Shape], "Shape | None"]


def _same(shape: Shape) -> Shape | None:
    return shape


def _rows(shape: Shape) -> Shape | None:
    """Adafactor's row variance of a matrix parameter: its last dimension reduced to 1."""
    return (*shape[:-1], 1) if len(shape) >= 2 else None


def _columns(shape: Shape) -> Shape | None:
    """Adafactor's column variance of a matrix parameter: its second to last dimension reduced to 1."""
    return (*shape[:-2], 1, shape[-1]) if len(shape) >= 2 else None


_MOMENTS: dict[str, ShapeRule] = {"exp_avg": _same, "exp_avg_sq": _same}

#: torch.optim class name -> state name -> the shape that state has for a parameter of a given
#: shape. Only state the optimizer creates per parameter with that shape; scalars (``step``,
#: ``eta``, ``mu_product``) are never compared with the parameter.
_PARAMETER_SHAPED: dict[str, dict[str, ShapeRule]] = {
    "SGD": {"momentum_buffer": _same},
    "Adam": {**_MOMENTS, "max_exp_avg_sq": _same},
    "AdamW": {**_MOMENTS, "max_exp_avg_sq": _same},
    "NAdam": _MOMENTS,
    "RAdam": _MOMENTS,
    "SparseAdam": _MOMENTS,
    "Adamax": {"exp_avg": _same, "exp_inf": _same},
    "Adagrad": {"sum": _same},
    "Adadelta": {"square_avg": _same, "acc_delta": _same},
    "RMSprop": {"square_avg": _same, "momentum_buffer": _same, "grad_avg": _same},
    "Rprop": {"prev": _same, "step_size": _same},
    "ASGD": {"ax": _same},
    "Adafactor": {"variance": _same, "row_var": _rows, "col_var": _columns},
    "Muon": {"momentum_buffer": _same},
}


@dataclasses.dataclass(frozen=True)
class SkippedState:
    """The saved state of parameters that does not fit them (``strict=False``): not loaded.

    Attributes:
        paths: every saved leaf path below the skipped ``state/<id>`` entries, sorted.
        roots: the logical paths of the skipped ``state/<id>`` entries.
        params: the optimizer's parameters they map to; each keeps its current state.
    """

    paths: tuple[str, ...] = ()
    roots: tuple[str, ...] = ()
    params: tuple[torch.Tensor, ...] = ()


def uses_torch_format(stateful: object) -> TypeGuard[torch.optim.Optimizer]:
    """Whether ``stateful`` is an optimizer saved and loaded with torch's own ``state_dict()`` format."""
    return (
        isinstance(stateful, torch.optim.Optimizer)
        and type(stateful).state_dict is torch.optim.Optimizer.state_dict
        and type(stateful).load_state_dict is torch.optim.Optimizer.load_state_dict
    )


def check_optimizer(
    root: str,
    optimizer: torch.optim.Optimizer,
    containers: Mapping[str, Entry],
    leaves: Mapping[str, Entry],
    *,
    strict: bool,
) -> SkippedState:
    """Check the saved state of ``optimizer`` (at logical path ``root``) against its parameters.

    Returns:
        With ``strict=False``, the saved per-parameter state to leave out (see :class:`SkippedState`).

    Raises:
        StateMismatchError: whatever ``strict`` says, the parameter groups or their sizes differ
            from the saved ones; with ``strict=True``, a state tensor's shape differs from what
            its parameter needs.
    """
    id_map = param_id_map(root, optimizer, containers, leaves)
    groups = optimizer.param_groups
    rules = _rules(optimizer)
    state_path = join_path(root, "state")
    state = containers.get(state_path)
    if not rules or not isinstance(state, DictEntry):
        return SkippedState()
    skipped: list[tuple[str, torch.Tensor]] = []
    for key in state.keys:
        param_path = join_path(state_path, key)
        param = id_map.get(key)
        entry = containers.get(param_path)
        if param is None or not isinstance(entry, DictEntry):
            continue  # load_state_dict() keeps state of an id no parameter has as it is
        for name in entry.keys:
            rule = rules.get(name) if isinstance(name, str) else None
            value_path = join_path(param_path, name)
            saved = leaves.get(value_path)
            if rule is None or not isinstance(saved, (TensorEntry, ShardedTensorEntry)):
                continue
            param_shape = tuple(param.shape)
            expected = rule(param_shape)
            if expected is None or tuple(saved.shape) == expected:
                continue
            if strict:
                raise StateMismatchError(
                    f"cannot restore {value_path!r}: the optimizer's parameter {_where(groups, param)} has shape "
                    f"{list(param_shape)}, so its {name} needs shape {list(expected)}, and the snapshot has shape "
                    f"{list(saved.shape)} (the optimizer was saved over other parameters). Build the model and its "
                    "optimizer with the saved shapes, or pass strict=False to leave this parameter's saved state out "
                    "(the optimizer starts it afresh; restore reports it in mismatched_keys)"
                )
            skipped.append((param_path, param))
            break
    if not skipped:
        return SkippedState()
    below = tuple(path + "/" for path, _ in skipped)
    return SkippedState(
        paths=tuple(sorted(path for path in leaves if path.startswith(below))),
        roots=tuple(path for path, _ in skipped),
        params=tuple(param for _, param in skipped),
    )


def param_id_map(
    root: str, optimizer: torch.optim.Optimizer, containers: Mapping[str, Entry], leaves: Mapping[str, Entry]
) -> dict[object, torch.Tensor]:
    """Saved parameter id -> the optimizer's parameter, as ``load_state_dict()`` maps them (after
    checking the groups' counts)."""
    saved_ids = _saved_param_ids(root, optimizer, containers, leaves)
    params = itertools.chain.from_iterable(group["params"] for group in optimizer.param_groups)
    if saved_ids is None:  # the snapshot lacks the ids (left out at take): the optimizer's own order
        return dict(enumerate(params))
    # The counts were checked equal: as load_state_dict() does, zip the saved ids with the parameters.
    return dict(zip(itertools.chain.from_iterable(saved_ids), params, strict=True))


def fresh_sharded_state(
    root: str,
    optimizer: torch.optim.Optimizer,
    containers: Mapping[str, Entry],
    leaves: Mapping[str, Entry],
    current: Mapping[str, Any],
) -> dict[str, torch.Tensor]:
    """Destinations for the saved state of ``DTensor`` parameters that the optimizer does not hold
    yet (a fresh optimizer, as a resumed FSDP2 run builds it): for each saved sharded state tensor
    shaped like its parameter (per :data:`_PARAMETER_SHAPED`) and absent from ``current`` (the
    optimizer's flattened state), a zero ``DTensor`` laid out like the parameter, in the saved
    dtype. The restore fills it in place, box by box, so the optimizer gets back ``DTensor`` state
    as it had it; loaded whole instead, it would hold plain tensors of the global shape, which the
    next ``step()`` refuses beside its ``DTensor`` parameters."""
    rules = _rules(optimizer)
    if not rules:
        return {}
    out: dict[str, torch.Tensor] = {}
    for _, name, path, param in param_state(root, optimizer, containers, leaves):
        saved = leaves.get(path)
        rule = rules.get(name) if isinstance(name, str) else None
        fits = isinstance(saved, ShardedTensorEntry) and tuple(saved.shape) == tuple(param.shape)
        if is_dtensor(param) and rule is _same and fits and path not in current and _plain_dtype(saved):
            dtype = getattr(torch, saved.dtype)  # type: ignore[union-attr]
            out[path] = torch.zeros_like(param, dtype=dtype, requires_grad=False)
    return out


def param_state(
    root: str, optimizer: torch.optim.Optimizer, containers: Mapping[str, Entry], leaves: Mapping[str, Entry]
) -> Iterator[tuple[str | int, str | int, str, torch.Tensor]]:
    """``(id, name, logical path, parameter)`` of each saved per-parameter state value (``exp_avg``
    of ``state/<id>``) whose saved id maps to a parameter of ``optimizer``."""
    state_path = join_path(root, "state")
    state = containers.get(state_path)
    if not isinstance(state, DictEntry):
        return
    id_map = param_id_map(root, optimizer, containers, leaves)
    for key in state.keys:
        param, param_path = id_map.get(key), join_path(state_path, key)
        names = containers.get(param_path)
        if param is None or not isinstance(names, DictEntry):
            continue
        for name in names.keys:
            yield key, name, join_path(param_path, name), param


def _plain_dtype(entry: Any) -> bool:
    return entry.dtype in RAW_ITEMSIZE and isinstance(getattr(torch, entry.dtype, None), torch.dtype)


def leave_out(
    containers: Mapping[str, DictEntry | ListEntry], leaves: Mapping[str, Entry], skipped: SkippedState
) -> tuple[dict[str, DictEntry | ListEntry], dict[str, Entry]]:
    """The saved tree without the skipped ``state/<id>`` entries: nothing is read for them."""
    roots = set(skipped.roots)
    below = tuple(root + "/" for root in roots)
    kept_containers = {p: e for p, e in containers.items() if p not in roots and not p.startswith(below)}
    kept_leaves = {p: e for p, e in leaves.items() if not p.startswith(below)}
    for root in roots:
        state_path = root.rsplit("/", 1)[0]
        state = kept_containers[state_path]
        assert isinstance(state, DictEntry)  # check_optimizer found each root below a saved state dict
        keys = tuple(key for key in state.keys if join_path(state_path, key) not in roots)
        kept_containers[state_path] = DictEntry(keys, state.ordered)
    return kept_containers, kept_leaves


def keep_current_state(optimizer: torch.optim.Optimizer, skipped: SkippedState, load: Callable[[], None]) -> None:
    """Run ``load`` (the optimizer's ``load_state_dict()``), then give the parameters whose saved
    state was skipped the state they had before (none for a fresh optimizer)."""
    kept = [(param, optimizer.state[param]) for param in skipped.params if param in optimizer.state]
    load()
    for param in skipped.params:
        optimizer.state.pop(param, None)
    for param, value in kept:
        optimizer.state[param] = value


def _rules(optimizer: torch.optim.Optimizer) -> Mapping[str, ShapeRule]:
    for cls in type(optimizer).__mro__:
        if cls.__module__.startswith("torch.optim") and cls.__name__ in _PARAMETER_SHAPED:
            return _PARAMETER_SHAPED[cls.__name__]
    return {}


def check_param_groups(
    root: str, optimizer: torch.optim.Optimizer, containers: Mapping[str, Entry], leaves: Mapping[str, Entry]
) -> None:
    """The part of :func:`check_optimizer` that holds whatever the state's shapes (the local tier's
    copies hold a sharded optimizer's moments as local shards): the saved parameter groups and
    their sizes against the optimizer's.

    Raises:
        StateMismatchError: the counts differ (the message names the path).
    """
    _saved_param_ids(root, optimizer, containers, leaves)


def _saved_param_ids(
    root: str, optimizer: torch.optim.Optimizer, containers: Mapping[str, Entry], leaves: Mapping[str, Entry]
) -> list[list[object]] | None:
    """The ``params`` ids of each saved parameter group, after checking their counts against the
    optimizer's; None when the snapshot does not hold them all."""
    groups_path = join_path(root, "param_groups")
    saved_groups = containers.get(groups_path)
    if not isinstance(saved_groups, ListEntry):
        return None
    groups = optimizer.param_groups
    if saved_groups.length != len(groups):
        raise StateMismatchError(
            f"cannot restore {groups_path!r}: the snapshot has {saved_groups.length} parameter group(s), the "
            f"optimizer {len(groups)}, and its load_state_dict() refuses other counts even with strict=False. "
            "Build the optimizer with the parameter groups it was saved with"
        )
    saved_ids: list[list[object]] = []
    for index, group in enumerate(groups):
        params_path = join_path(join_path(groups_path, index), "params")
        params = containers.get(params_path)
        if not isinstance(params, ListEntry):
            return None
        if params.length != len(group["params"]):
            raise StateMismatchError(
                f"cannot restore {params_path!r}: the snapshot's parameter group {index} has {params.length} "
                f"parameter(s), the optimizer's {len(group['params'])}, and its load_state_dict() refuses other "
                "sizes even with strict=False. Build the optimizer over the parameters it was saved with, in the "
                "same groups and order"
            )
        ids = [leaves.get(join_path(params_path, position)) for position in range(params.length)]
        if not all(isinstance(entry, PrimitiveEntry) for entry in ids):
            return None
        saved_ids.append([entry.value for entry in ids if isinstance(entry, PrimitiveEntry)])
    return saved_ids


def _where(groups: list[dict[str, Any]], param: torch.Tensor) -> str:
    for index, group in enumerate(groups):
        for position, candidate in enumerate(group["params"]):
            if candidate is param:
                return f"{position} of group {index}"
    return "(not in its param_groups)"  # pragma: no cover - id_map maps to the groups' parameters
