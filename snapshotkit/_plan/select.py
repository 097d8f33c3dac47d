"""Partial state on take: which flattened nodes the ``include=`` / ``exclude=`` patterns keep.

Patterns are globs over logical paths matched like ``replicated=`` (:func:`matches_any`:
``fnmatch.fnmatchcase``, ``*`` also matches ``/``). A *leaf* here is a flattened leaf or an
empty container. A leaf is kept when it matches an ``include`` pattern (any leaf when include is
None) and no ``exclude`` pattern. Containers are kept as far as they hold kept leaves:

* a dict keeps the keys whose child is kept, and goes when none is;
* a list or tuple is kept whole or not at all: a manifest list names every index, so one that
  lost an element could not be rebuilt. If any leaf below it is not kept, none is.

Pure: applied by each rank to its own flattened state, before anything is described or written.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable

from snapshotkit._format.entries import ContainerEntry, DictEntry, join_path
from snapshotkit._plan.flatten import Flattened
from snapshotkit._plan.partition import matches_any
from snapshotkit.errors import InvalidArgumentError


@dataclasses.dataclass(frozen=True)
class Selection:
    """The ``include=`` and ``exclude=`` patterns of a take.

    Attributes:
        include: a leaf must match one of these; None keeps every leaf.
        exclude: a leaf matching one of these is never kept.
    """

    include: tuple[str, ...] | None
    exclude: tuple[str, ...]

    @classmethod
    def of(cls, include: object, exclude: object) -> Selection | None:
        """The selection for the arguments of a take; None when both are None (everything is kept).

        Raises:
            InvalidArgumentError: an argument is not a list (or other iterable) of ``str``, or is
                a single ``str`` (which would be read as patterns of one character each).
        """
        if include is None and exclude is None:
            return None
        return cls(_patterns("include", include) if include is not None else None, _patterns("exclude", exclude))

    def keeps(self, logical_path: str) -> bool:
        """Whether the leaf at ``logical_path`` is stored."""
        if self.include is not None and not matches_any(logical_path, self.include):
            return False
        return not matches_any(logical_path, self.exclude)

    def apply(self, flat: Flattened, root: str) -> Flattened | None:
        """The part of ``flat`` (flattened at ``root``) this selection keeps; None when nothing is."""
        return prune(flat, root, self.keeps)


def prune(flat: Flattened, root: str, keeps: Callable[[str], bool]) -> Flattened | None:
    """The part of ``flat`` (flattened at ``root``) made of the leaves ``keeps`` accepts and the
    containers that hold them, by the rules of the module docstring; None when nothing is left."""
    kept = _kept_nodes(flat, root, keeps)
    if root not in kept:
        return None
    containers: dict[str, ContainerEntry] = {}
    for path, entry in flat.containers.items():
        if path not in kept:
            continue
        if isinstance(entry, DictEntry):
            keys = tuple(key for key in entry.keys if join_path(path, key) in kept)
            entry = entry if keys == entry.keys else DictEntry(keys, entry.ordered)
        containers[path] = entry
    leaves = {path: value for path, value in flat.leaves.items() if path in kept}
    return Flattened(containers, leaves)


def _patterns(name: str, value: object) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, (str, bytes)):
        raise InvalidArgumentError(
            f"{name}= takes a list of glob patterns, got the single {type(value).__name__} {value!r}; "
            f"pass {name}=[{value!r}]"
        )
    if not isinstance(value, Iterable):
        raise InvalidArgumentError(
            f"{name}= takes a list of glob patterns over logical paths (e.g. ['model/**']), got "
            f"{type(value).__name__} {value!r}"
        )
    patterns = tuple(value)
    for pattern in patterns:
        if not isinstance(pattern, str):
            raise InvalidArgumentError(
                f"{name}= patterns must be str globs over logical paths (e.g. 'model/**'), got "
                f"{type(pattern).__name__} {pattern!r}"
            )
    return patterns


def _children(path: str, entry: ContainerEntry) -> list[str]:
    if isinstance(entry, DictEntry):
        return [join_path(path, key) for key in entry.keys]
    return [join_path(path, index) for index in range(entry.length)]


def _kept_nodes(flat: Flattened, root: str, keeps: Callable[[str], bool]) -> set[str]:
    """Every node that stays: selected leaves, and containers kept by the rules of the module docstring."""
    alive = {path for path in flat.leaves if keeps(path)}
    whole = set(alive)  # alive with nothing below dropped
    # Deepest first, so a container's children are decided before it. Logical paths escape "/"
    # inside keys, so the number of "/" is the depth.
    for path in sorted(flat.containers, key=lambda p: -p.count("/")):
        entry = flat.containers[path]
        children = _children(path, entry)
        if not children:
            keep = keeps(path)  # an empty container is a leaf
        elif isinstance(entry, DictEntry):
            keep = any(child in alive for child in children)
        else:
            keep = all(child in whole for child in children)
        if keep:
            alive.add(path)
            if all(child in whole for child in children):
                whole.add(path)
    # A node stays only if every container above it does (a dict below a dropped list goes too).
    kept: set[str] = set()
    stack = [root] if root in alive else []
    while stack:
        path = stack.pop()
        kept.add(path)
        if path in flat.containers:
            stack.extend(child for child in _children(path, flat.containers[path]) if child in alive)
    return kept
