"""Restoring: plan every leaf of every requested key, fetch all pieces in one pipeline, load.

All keys share one read pipeline (each piece is fetched once, whatever the number of keys);
``load_state_dict`` runs per key afterwards, the RNG last so its state is the one the take saw.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import torch

from snapshotkit._format.document import SnapshotMetadata
from snapshotkit._format.entries import (
    DictEntry,
    Entry,
    ListEntry,
    ObjectEntry,
    ShardedTensorEntry,
    TensorEntry,
    is_shared,
)
from snapshotkit._format.sharded import is_sharded
from snapshotkit._plan.flatten import Flattened, escape_key, flatten, inflate, join_path
from snapshotkit._restore.columns import ColumnView, plan_column_leaves
from snapshotkit._restore.fits import describe_mismatch, tensor_matches
from snapshotkit._restore.optimizer import (
    SkippedState,
    check_optimizer,
    fresh_sharded_state,
    keep_current_state,
    leave_out,
    uses_torch_format,
)
from snapshotkit._restore.overlap import internal_overlap
from snapshotkit._restore.partial import KeyDifference, RestoreReport, check_keys, compare, leaf_paths, merged_state
from snapshotkit._restore.place import LeafLoader
from snapshotkit._text import first_few
from snapshotkit.errors import AppStateKeyNotFoundError, StateMismatchError
from snapshotkit.stateful import RNGState, Stateful

ContainerMap = dict[str, DictEntry | ListEntry]


def close_matches(wanted: str, candidates: Iterable[str], limit: int = 5) -> str:
    """A ``"; did you mean ...?"`` hint, or ``""``."""
    options = list(candidates)
    matches = difflib.get_close_matches(wanted, options, n=limit, cutoff=0.5)
    if not matches:
        matches = [c for c in options if wanted.rsplit("/", 1)[-1] in c][:limit]
    return f"; close matches: {', '.join(repr(m) for m in matches)}" if matches else ""


def rank_view(metadata: SnapshotMetadata, rank: int) -> dict[str, Entry]:
    """``logical path -> entry`` as seen by ``rank``.

    A rank that took part in the take sees its own entries, then the replicated and sharded
    ones rank 0 holds for everyone. A rank that did not exist then (a larger world restoring)
    sees rank 0's replicated and sharded leaves, and rank 0's containers cut down to them.
    """
    view: dict[str, Entry] = {}
    if rank < metadata.world_size:
        own_prefix = f"{rank}/"
        for key, entry in metadata.manifest.items():
            if key.startswith(own_prefix):
                view[key[len(own_prefix) :]] = entry
        if rank != 0:
            for key, entry in metadata.manifest.items():
                if key.startswith("0/") and is_shared(entry):
                    view.setdefault(key[2:], entry)
        return view
    for key, entry in metadata.manifest.items():
        if key.startswith("0/") and (is_shared(entry) or isinstance(entry, (DictEntry, ListEntry))):
            view[key[2:]] = entry
    return _prune_containers(view)


def _prune_containers(view: dict[str, Entry]) -> dict[str, Entry]:
    """Drop container children that are not in ``view`` (deepest first). A container left with
    none of its children, or a list or tuple that lost one, goes too."""
    containers = sorted(
        (p for p, e in view.items() if isinstance(e, (DictEntry, ListEntry))), key=lambda p: -p.count("/")
    )
    for path in containers:
        entry = view[path]
        if isinstance(entry, DictEntry):
            keys = tuple(k for k in entry.keys if join_path(path, k) in view)
            if entry.keys and not keys:
                del view[path]
            elif keys != entry.keys:
                view[path] = DictEntry(keys, entry.ordered)
        elif isinstance(entry, ListEntry) and any(join_path(path, i) not in view for i in range(entry.length)):
            del view[path]
    return view


def missing_key_hint(metadata: SnapshotMetadata, key: str, rank: int) -> str:
    """Why ``key`` is missing from ``rank``'s view although other ranks saved it, or ``""``."""
    holders = sorted(
        int(k.split("/", 1)[0]) for k in metadata.manifest if k.split("/", 1)[1] == key and not k.startswith(f"{rank}/")
    )
    if not holders:
        return ""
    ranks = first_few(holders, 8, show=str)
    if rank >= metadata.world_size:
        return (
            f" It was saved per rank (not replicated) by ranks {ranks} of the {metadata.world_size} that took "
            f"the snapshot; rank {rank} did not exist then and has no state of its own. Pass replicated=[...] "
            "when taking to make such state available to every rank, or leave it out of app_state on new ranks."
        )
    return f" Ranks {ranks} saved it, rank {rank} did not."


def subtree(view: Mapping[str, Entry], root: str) -> tuple[ContainerMap, Mapping[str, Entry]]:
    """Container and leaf entries at or below logical path ``root``."""
    if isinstance(view, ColumnView):
        return view.subtree(root)
    containers: ContainerMap = {}
    leaves: dict[str, Entry] = {}
    below = root + "/"
    for path, entry in view.items():
        if path == root or path.startswith(below):
            if isinstance(entry, (DictEntry, ListEntry)):
                containers[path] = entry
            else:
                leaves[path] = entry
    return containers, leaves


@dataclasses.dataclass(frozen=True)
class RestorePlan:
    """The reads of a restore are with the loader; what remains is loading, and the report.

    Attributes:
        steps: the ``load_state_dict`` calls to make once the reads ran, the RNG last.
        report: the keys the snapshot and the destinations do not share.
    """

    steps: list[Callable[[], None]]
    report: RestoreReport


def plan_restore(
    view: Mapping[str, Entry],
    app_state: Mapping[str, Stateful],
    *,
    strict: bool,
    loader: LeafLoader,
    snapshot_path: str,
    hint: Callable[[str], str] | None = None,
) -> RestorePlan:
    """Plan loading every key of ``app_state``: the ``load_state_dict`` steps, RNG last, and the report.

    Raises:
        AppStateKeyNotFoundError: (strict) an app_state key is not in the snapshot.
        StateMismatchError: (strict) keys or tensors differ (see :func:`~.partial.check_keys`), or an
            optimizer's state does not fit its parameters (see :mod:`.optimizer`).
    """
    steps: list[tuple[bool, Callable[[], None]]] = []
    missing: list[str] = []
    unexpected: list[str] = []
    mismatched: list[str] = []
    for key in sorted(app_state):
        stateful = app_state[key]
        root = escape_key(key)
        is_rng, is_module = isinstance(stateful, RNGState), isinstance(stateful, torch.nn.Module)
        if root not in view:
            if strict:
                saved_keys = sorted({path.split("/", 1)[0] for path in view})
                raise AppStateKeyNotFoundError(
                    f"app_state key {key!r} is not in the snapshot at {snapshot_path!r} for this rank, which sees "
                    f"{saved_keys}{close_matches(root, saved_keys)}.{hint(root) if hint else ''} Remove it from "
                    "app_state, restore those keys from a snapshot that has them, or pass strict=False to skip it"
                )
            missing.extend(leaf_paths(flatten(stateful.state_dict(), root), root))
            continue
        containers, leaves = subtree(view, root)
        if is_rng:
            check_rng_state(key, root, leaves)
        skipped, optimizer = SkippedState(), stateful if uses_torch_format(stateful) else None
        if optimizer is not None:
            leaves = dict(leaves)  # a ColumnView's tensors built: the optimizer checks read them
            skipped = check_optimizer(root, optimizer, containers, leaves, strict=strict)
            if skipped.roots:  # strict=False: a parameter's saved state that does not fit it is not loaded
                containers, leaves = leave_out(containers, leaves, skipped)
                mismatched.extend(skipped.paths)
        # An RNGState has no destinations: it loads what was saved, whole (with or without CUDA or NumPy).
        current = None if is_rng else flatten(stateful.state_dict(), root)
        difference = KeyDifference()
        if current is not None:
            # compare() reads the saved leaves' paths only: a ColumnView builds no entry for it
            saved_leaves = dict.fromkeys(leaves) if isinstance(leaves, ColumnView) else dict(leaves)
            difference = compare(root, Flattened(dict(containers), saved_leaves), current, module=is_module)
            if strict:
                check_keys(key, difference, module=is_module)
            missing.extend(difference.missing)
            unexpected.extend(difference.unexpected)
        destinations = current.leaves if current is not None else {}
        if optimizer is not None and current is not None:  # a fresh optimizer of DTensor parameters
            fresh = fresh_sharded_state(root, optimizer, containers, leaves, destinations)
            destinations = {**destinations, **fresh} if fresh else destinations
        if is_module:  # a module's tensor whose saved value is a dict or list (strict=False gets here)
            for path in containers:
                if isinstance(destinations.get(path), torch.Tensor):
                    raise not_a_tensor(path, containers[path])
        known, thunks = _plan_leaves(leaves, destinations, loader, strict=strict, module=is_module)
        merge_with = current if difference.missing_keys and not is_module else None
        step = _load_step(stateful, root, containers, known, thunks, strict, merge_with, difference)
        if optimizer is not None and skipped.params:
            step = functools.partial(keep_current_state, optimizer, skipped, step)
        steps.append((is_rng, step))
    report = RestoreReport(tuple(sorted(missing)), tuple(sorted(unexpected)), tuple(sorted(mismatched)))
    return RestorePlan([step for _, step in sorted(steps, key=lambda s: s[0])], report)


def check_rng_state(key: str, root: str, leaves: Mapping[str, Entry]) -> None:
    """Refuse a saved state an :class:`RNGState` cannot load whole (docs: it is loaded as saved,
    so after the restore every generator is as it was at the take), before anything is read: one
    taken with ``include=`` covering part of it, or the state of another object under that key."""
    torch_cpu = join_path(root, "torch_cpu")
    if not isinstance(leaves.get(torch_cpu), TensorEntry):
        saved = sorted(path[len(root) + 1 :].split("/", 1)[0] for path in leaves)
        raise StateMismatchError(
            f"cannot restore the RNGState app_state[{key!r}]: the snapshot has no generator state "
            f"{torch_cpu!r} there (it has {first_few(sorted(set(saved)), 10) or 'nothing'} under {root!r}), "
            "and an RNGState is restored whole, as saved. It was taken with include= or exclude= leaving part "
            "of it out, or from another object: leave the key out of app_state, or restore it into that object"
        )


def check_destination(logical_path: str, entry: Entry, destination: torch.Tensor, *, module: bool) -> None:
    """Refuse destinations nothing can be loaded into, whatever ``strict`` says, before any read.

    A tensor on the meta device has no memory (filling it would silently do nothing); an
    inference tensor takes no in-place update outside inference mode (torch's rule, kept even
    where a read into its memory would bypass it); a tensor whose elements share memory cannot
    hold distinct values; a module's ``load_state_dict()`` refuses a tensor of another shape
    even with ``strict=False``, after other tensors were already filled in place. A
    ``DTensor``/``ShardedTensor`` is checked shard by shard as its reads are planned.
    """
    if destination.is_meta:
        raise StateMismatchError(
            f"cannot restore {logical_path!r} into a tensor on the meta device: it has no memory to load into. "
            "Materialize the object first (e.g. module.to_empty(device='cpu')), then restore"
        )
    if not is_sharded(destination):  # a ShardedTensor answers none of these
        _check_plain_destination(logical_path, entry, destination, module=module)
    if module and not isinstance(entry, (TensorEntry, ShardedTensorEntry)):
        raise not_a_tensor(logical_path, entry)
    shape = getattr(entry, "shape", None)
    if module and shape is not None and tuple(destination.shape) != tuple(shape):
        raise StateMismatchError(
            f"cannot restore {logical_path!r}: the snapshot has shape {list(shape)}, the module's tensor shape "
            f"{list(destination.shape)}, and a module's load_state_dict() refuses other shapes even with "
            "strict=False. Build the module with the saved shapes, or read the value with Snapshot.read_object()"
        )


def _check_plain_destination(logical_path: str, entry: Entry, destination: torch.Tensor, *, module: bool) -> None:
    # inside inference mode torch allows updating one in place: a contiguous CPU one is read into
    # directly (other layouts and devices are copied into on worker threads, outside the mode)
    if destination.is_inference() and not (
        torch.is_inference_mode_enabled() and destination.is_cpu and destination.is_contiguous()
    ):
        raise StateMismatchError(
            f"cannot restore {logical_path!r} into an inference tensor (created under torch.inference_mode()): "
            "torch allows no in-place update of one outside inference mode (a module's load_state_dict() "
            "refuses it too). Create the object outside torch.inference_mode() and enter it after the restore, "
            "restore into a .clone() of the tensor, or, for contiguous CPU tensors, call restore inside "
            "torch.inference_mode()"
        )
    if destination.is_nested:  # it has no shape; a nested tensor is saved whole, as an object
        if isinstance(entry, ObjectEntry) and not module:
            return  # loaded new, handed to load_state_dict()
        raise StateMismatchError(
            f"cannot restore {logical_path!r} into a nested tensor: the snapshot has a {entry.kind} there, and only "
            "a nested tensor saved as one (an object) loads into it. Restore into the kind of object that was saved"
        )
    if internal_overlap(destination):
        raise StateMismatchError(
            f"cannot restore {logical_path!r} into a tensor whose elements share memory (an expand()ed, "
            f"unfold()ed or as_strided view, strides {list(destination.stride())}): it cannot hold distinct values. "
            "Restore into a tensor of its own memory (e.g. .clone() or .contiguous() it first)"
        )


def not_a_tensor(logical_path: str, entry: Entry) -> StateMismatchError:
    """The error for a module's tensor whose saved value is not a tensor (an int, None, a list...):
    its ``load_state_dict()`` refuses it even with ``strict=False``, after filling others in place."""
    article = "an" if entry.kind[0] in "aeiou" else "a"
    return StateMismatchError(
        f"cannot restore {logical_path!r}: the module has a tensor there, the snapshot {article} {entry.kind}, and "
        "a module's load_state_dict() accepts only tensors for its parameters and buffers, even with "
        "strict=False. Restore from a snapshot of this module, or read the saved value with Snapshot.read_object()"
    )


def _plan_leaves(
    leaves: Mapping[str, Entry],
    destinations: Mapping[str, Any],
    loader: LeafLoader,
    *,
    strict: bool,
    module: bool,
) -> tuple[dict[str, Any], dict[str, Callable[[], Any]]]:
    """Plan loading the saved leaves of one app_state key into their destinations.

    Returns the values already known (destinations filled in place, :meth:`LeafLoader.add_in_place`)
    and thunks that give the rest once the reads have run.
    """
    thunks: dict[str, Callable[[], Any]] = {}

    def plan_leaf(path: str, entry: Entry, destination: Any) -> None:
        matches: bool | None = None
        if isinstance(destination, torch.Tensor):
            check_destination(path, entry, destination, module=module)
            if isinstance(entry, TensorEntry):
                matches = tensor_matches(entry, destination)
                if not matches:
                    if strict and entry.serializer == "raw":
                        raise describe_mismatch(path, entry, destination)
                    destination = None
        # a module's load_state_dict() copies into its tensors: a sparse value would fail there
        thunks[path] = loader.add(path, entry, destination, matches=matches, or_new=not strict and not module)

    if isinstance(leaves, ColumnView):  # a version-5 manifest: plain tensors planned from its columns
        return plan_column_leaves(leaves, destinations, loader, plan_leaf), thunks
    known: dict[str, Any] = {}
    add_in_place = loader.add_in_place
    for path, entry in leaves.items():
        destination = destinations.get(path)
        if (
            type(entry) is TensorEntry
            and isinstance(destination, torch.Tensor)
            and tensor_matches(entry, destination)
            and add_in_place(path, entry, destination)
        ):  # the common case: no thunk
            known[path] = destination
            continue
        plan_leaf(path, entry, destination)
    return known, thunks


def _load_step(
    stateful: Stateful,
    root: str,
    containers: ContainerMap,
    known: Mapping[str, Any],
    thunks: Mapping[str, Callable[[], Any]],
    strict: bool,
    merge_with: Flattened | None,
    difference: KeyDifference,
) -> Callable[[], None]:
    """Load the saved state (``known`` values and what the ``thunks`` give); with ``merge_with``
    (the current state), merged over it."""

    def step() -> None:
        values = dict(known)
        values.update((path, thunk()) for path, thunk in thunks.items())
        saved = Flattened(dict(containers), values)
        if merge_with is not None:
            state = merged_state(root, saved, merge_with, difference)
        else:
            state = inflate(root, saved.containers, saved.leaves)
        if isinstance(stateful, torch.nn.Module):
            stateful.load_state_dict(state, strict=strict)
        else:
            stateful.load_state_dict(state)

    return step
