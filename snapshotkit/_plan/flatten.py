"""App state <-> ``{logical path: leaf}``, reversibly.

Containers of exact type ``dict``, ``OrderedDict``, ``list`` and ``tuple`` are descended; a dict
is descended only when every key is a ``str`` or an ``int`` and no two keys print the same.
Everything else is a leaf. Logical paths join escaped keys with ``/``; inside a key ``%`` is
written ``%25`` and ``/`` is written ``%2F`` so paths split unambiguously.
"""

from __future__ import annotations

import dataclasses
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

from snapshotkit._format.entries import (
    ContainerEntry,
    DictEntry,
    ListEntry,
    TupleEntry,
    escape_key,
    join_path,
    unescape_key,
)

__all__ = ["Flattened", "escape_key", "flatten", "inflate", "join_path", "unescape_key"]


@dataclasses.dataclass(frozen=True)
class Flattened:
    """An object split by :func:`flatten`, both parts keyed by logical path in DFS order.

    Attributes:
        containers: the entry of every descended container (the object itself, if it is one).
        leaves: every value that is not descended.
    """

    containers: dict[str, ContainerEntry]
    leaves: dict[str, Any]


def _is_flattenable_dict(obj: Mapping[Any, Any]) -> bool:
    seen: set[str] = set()
    for key in obj:
        if not (isinstance(key, str) or type(key) is int):
            return False
        text = str(key)
        if text in seen:
            return False
        seen.add(text)
    return True


def flatten(obj: Any, prefix: str) -> Flattened:
    """Split ``obj`` into container entries and leaves, both keyed by logical path, in DFS order.

    ``obj`` itself has path ``prefix``; :func:`inflate` rebuilds it.
    """
    containers: dict[str, ContainerEntry] = {}
    leaves: dict[str, Any] = {}
    stack: list[tuple[str, Any]] = [(prefix, obj)]
    while stack:
        path, value = stack.pop()
        kind = type(value)
        children: list[tuple[str, Any]]
        if (kind is dict or kind is OrderedDict) and _is_flattenable_dict(value):
            containers[path] = DictEntry(tuple(value.keys()), ordered=kind is OrderedDict)
            children = [(join_path(path, k), v) for k, v in value.items()]
        elif kind is list:
            containers[path] = ListEntry(len(value))
            children = [(join_path(path, i), v) for i, v in enumerate(value)]
        elif kind is tuple:
            containers[path] = TupleEntry(len(value))
            children = [(join_path(path, i), v) for i, v in enumerate(value)]
        else:
            leaves[path] = value
            continue
        stack.extend(reversed(children))
    return Flattened(containers, leaves)


def inflate(prefix: str, containers: Mapping[str, ContainerEntry], leaves: Mapping[str, Any]) -> Any:
    """Rebuild the object at ``prefix`` from :func:`flatten`'s output.

    Raises:
        KeyError: a child the container entry names has neither a container nor a leaf.
    """
    if prefix in leaves:
        return leaves[prefix]
    entry = containers[prefix]
    if isinstance(entry, DictEntry):
        items = [(k, inflate(join_path(prefix, k), containers, leaves)) for k in entry.keys]
        return OrderedDict(items) if entry.ordered else dict(items)
    values = [inflate(join_path(prefix, i), containers, leaves) for i in range(entry.length)]
    return tuple(values) if isinstance(entry, TupleEntry) else values
