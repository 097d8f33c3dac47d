"""Restoring state the snapshot and the destination do not fully share: missing and unexpected
keys, the :class:`RestoreReport`, and saved state merged over the current one.

Both sides are flattened trees rooted at an app_state key: the snapshot's entries and the
destination's current ``state_dict()``. A *leaf* is a value that is not descended, or an empty
container. They are compared through the dicts they share from the root:

* a module is compared like ``nn.Module.load_state_dict``: its leaf paths as two sets;
* any other object is compared dict by dict, from the root, descending only where both sides
  hold a non-empty dict: a key only the destination has is *missing* (every leaf below it), a
  key only the snapshot has is *unexpected*. Anywhere else the saved value replaces the current
  one whole: below a list or tuple (stored whole or not at all), where one side has a leaf, and
  where the destination's dict is empty (state the object creates when loading, such as a fresh
  optimizer's ``state``, or an empty ``StateDict``).

Merging (``strict=False``) gives the saved state plus, at each such dict, the current values of
the missing keys, so an object keeps what the snapshot does not have.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from snapshotkit._format.entries import ContainerEntry, DictEntry, Entry, ListEntry, join_path, unescape_key
from snapshotkit._plan.flatten import Flattened, inflate
from snapshotkit._text import first_few
from snapshotkit.errors import StateMismatchError

__all__ = ["RestoreReport"]

#: How many keys of each side an error message lists.
_SHOWN = 10


@dataclasses.dataclass(frozen=True)
class RestoreReport:
    """What :meth:`Snapshot.restore <snapshotkit.Snapshot.restore>` could not match, like the
    result of ``nn.Module.load_state_dict``, in logical paths (``"model/layer1.weight"``).

    Attributes:
        missing_keys: leaf paths the destination's ``state_dict()`` has and the snapshot does
            not, sorted. Nothing was restored there: the object keeps its current value. With
            ``strict=False`` this includes every leaf of an app_state key the snapshot lacks.
        unexpected_keys: leaf paths the snapshot has and the destination's ``state_dict()`` does
            not, sorted. A module does not load them; any other object receives them with the
            rest of the state passed to ``load_state_dict()``.
        mismatched_keys: leaf paths the snapshot has and that were not loaded because they do
            not fit their destination (``strict=False``; ``strict=True`` raises instead), sorted:
            today, every leaf of an optimizer parameter's saved state when one of its state
            tensors has another shape than the parameter needs. That parameter keeps its current
            state (a fresh optimizer creates it at the next ``step()``).
        source: which tier served this rank, in a report of
            :meth:`SnapshotManager.restore_latest <snapshotkit.SnapshotManager.restore_latest>` with
            a ``local_root``: ``"local"`` (its own copy on this node), ``"peer"`` (a replica
            another node sent) or ``"durable"`` (the root); None everywhere else.
    """

    missing_keys: tuple[str, ...] = ()
    unexpected_keys: tuple[str, ...] = ()
    mismatched_keys: tuple[str, ...] = ()
    source: str | None = None


@dataclasses.dataclass(frozen=True)
class KeyDifference:
    """How the saved tree of one app_state key differs from the destination's current one.

    Attributes:
        missing: destination leaf paths the snapshot lacks.
        unexpected: saved leaf paths the destination lacks.
        missing_keys: dict path -> the destination's keys (in its order) the saved dict there
            lacks; a merge adds them with their current values.
    """

    missing: tuple[str, ...] = ()
    unexpected: tuple[str, ...] = ()
    missing_keys: Mapping[str, tuple[str | int, ...]] = dataclasses.field(default_factory=dict)


def leaf_paths(tree: Flattened, top: str) -> list[str]:
    """The leaf paths at or below ``top`` in ``tree`` (empty containers included), depth first."""
    found: list[str] = []
    stack = [top]
    while stack:
        path = stack.pop()
        entry = tree.containers.get(path)
        children = _children(path, entry) if entry is not None else []
        if entry is None or not children:
            if entry is not None or path in tree.leaves:
                found.append(path)
            continue
        stack.extend(reversed(children))
    return found


def compare(root: str, saved: Flattened, current: Flattened, *, module: bool) -> KeyDifference:
    """The missing and unexpected leaf paths of one app_state key (module docstring)."""
    if module:
        saved_paths, current_paths = set(saved.leaves), set(current.leaves)
        return KeyDifference(tuple(sorted(current_paths - saved_paths)), tuple(sorted(saved_paths - current_paths)))
    missing: list[str] = []
    unexpected: list[str] = []
    missing_keys: dict[str, tuple[str | int, ...]] = {}
    stack = [root]
    while stack:
        path = stack.pop()
        saved_entry, current_entry = saved.containers.get(path), current.containers.get(path)
        # Anywhere but between two non-empty dicts, the saved value replaces the current one whole.
        if not isinstance(saved_entry, DictEntry) or not isinstance(current_entry, DictEntry):
            continue
        if not (saved_entry.keys and current_entry.keys):
            continue
        if saved_entry.keys == current_entry.keys:  # the common case: only the containers below can differ
            stack.extend(_child_containers(path, saved_entry.keys, saved.containers))
            continue
        saved_children = {join_path(path, key) for key in saved_entry.keys}
        current_children = {join_path(path, key): key for key in current_entry.keys}
        lacking: list[str | int] = []
        for child, key in current_children.items():
            if child in saved_children:
                stack.append(child)
            else:
                lacking.append(key)
                missing.extend(leaf_paths(current, child))
        if lacking:
            missing_keys[path] = tuple(lacking)
        for child in saved_children:
            if child not in current_children:
                unexpected.extend(leaf_paths(saved, child))
    return KeyDifference(tuple(sorted(missing)), tuple(sorted(unexpected)), missing_keys)


def _child_containers(path: str, keys: tuple[str | int, ...], containers: Mapping[str, Any]) -> list[str]:
    """The children of the dict at ``path`` named by ``keys`` that are containers: from the keys,
    or, when there are fewer containers than keys (a dict of many tensors), from the containers
    (a child's name is its parent's, ``/`` and its escaped key, which holds no ``/``)."""
    if len(containers) >= len(keys):
        return [child for key in keys if (child := join_path(path, key)) in containers]
    prefix, named = path + "/", None
    found = []
    for child in containers:
        component = child[len(prefix) :]
        if child.startswith(prefix) and "/" not in component:
            named = set(keys) if named is None else named  # only once a container may be a child
            key = unescape_key(component)
            if key in named or _as_int(key) in named:
                found.append(child)
    return found


def _as_int(text: str) -> int | None:
    """The int key whose component is ``text`` (``str(key) == text``), or None."""
    try:
        value = int(text)
    except ValueError:
        return None
    return value if str(value) == text else None


def merged_state(root: str, saved: Flattened, current: Flattened, difference: KeyDifference) -> Any:
    """The saved state with the current values of its missing keys added (see :func:`compare`)."""
    containers: dict[str, ContainerEntry] = dict(saved.containers)
    leaves: dict[str, Any] = dict(saved.leaves)
    for path, keys in difference.missing_keys.items():
        entry = containers[path]
        assert isinstance(entry, DictEntry)
        containers[path] = DictEntry(entry.keys + keys, entry.ordered)
        for key in keys:
            _copy_subtree(current, join_path(path, key), containers, leaves)
    return inflate(root, containers, leaves)


def check_keys(app_key: str, difference: KeyDifference, *, module: bool) -> None:
    """Raise, for ``strict=True``, when the snapshot and the destination differ in their keys.

    A module must match both ways; any other object must find every key of its ``state_dict()``
    in the snapshot (keys only the snapshot has are state the object creates when loading).

    Raises:
        StateMismatchError: naming up to ten keys of each side.
    """
    missing, unexpected = list(difference.missing), list(difference.unexpected)
    if module and (missing or unexpected):
        raise StateMismatchError(
            f"the module app_state[{app_key!r}] does not match the snapshot: missing from the snapshot: "
            f"{_shown(missing)}; not in the module: {_shown(unexpected)}. Pass strict=False to load the keys that match"
        )
    if not module and missing:
        raise StateMismatchError(
            f"app_state[{app_key!r}] does not match the snapshot: its state_dict() has {len(missing)} key(s) the "
            f"snapshot lacks, {_shown(missing)}; the snapshot has {len(unexpected)} it does not, {_shown(unexpected)}. "
            "Pass strict=False to load what the snapshot has and keep the current values of the rest "
            "(restore returns them as RestoreReport.missing_keys)"
        )


def _shown(paths: list[str]) -> str:
    return first_few(paths, _SHOWN) if paths else "none"


def _children(path: str, entry: ContainerEntry | Entry) -> list[str]:
    if isinstance(entry, DictEntry):
        return [join_path(path, key) for key in entry.keys]
    if isinstance(entry, ListEntry):
        return [join_path(path, index) for index in range(entry.length)]
    return []


def _copy_subtree(tree: Flattened, top: str, containers: dict[str, ContainerEntry], leaves: dict[str, Any]) -> None:
    stack = [top]
    while stack:
        path = stack.pop()
        entry = tree.containers.get(path)
        if entry is None:
            leaves[path] = tree.leaves[path]
            continue
        containers[path] = entry
        stack.extend(_children(path, entry))
