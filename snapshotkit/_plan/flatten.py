"""App state <-> ``{logical path: leaf}``, reversibly.

Containers of exact type ``dict``, ``OrderedDict``, ``list`` and ``tuple`` are descended; a dict
is descended only when every key is a ``str`` or an ``int``, no two keys print the same, and
no ``str`` key holds a lone surrogate (the UTF-8 manifest cannot name it: such a dict is a leaf).
Everything else is a leaf. Logical paths join escaped keys with ``/``; inside a key ``%`` is
written ``%25`` and ``/`` is written ``%2F`` so paths split unambiguously.

Limits, refused with :class:`~snapshotkit.errors.UnsupportedValueError` naming the path:
containers nest at most :data:`MAX_NESTING_DEPTH` levels deep (both directions are iterative,
so any depth a take accepts is restored), and no int, key or leaf, has more than
:data:`MAX_INT_BITS` bits.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections import OrderedDict
from collections.abc import Iterable, Mapping
from typing import Any

from snapshotkit._format.entries import (
    ContainerEntry,
    DictEntry,
    ListEntry,
    TupleEntry,
    child_paths,
    escape_key,
    join_path,
    unescape_key,
)
from snapshotkit.errors import UnsupportedValueError

__all__ = [
    "MAX_INT_BITS",
    "MAX_NESTING_DEPTH",
    "Flattened",
    "escape_key",
    "fits_inline",
    "flatten",
    "inflate",
    "join_path",
    "unescape_key",
]

#: Containers nest at most this deep below an app_state key. Deeper state is refused by take:
#: logical paths grow with depth, so the manifest would grow with its square.
MAX_NESTING_DEPTH = 1000
#: The largest int (leaf or dict key) a snapshot holds, in bits (about 600 decimal digits). Ints
#: go inline into the JSON manifest, and this is below 640 digits, the least Python's int<->str
#: conversion limit (``sys.set_int_max_str_digits``) can be set to, so every writer and reader
#: can convert them. (Stored as objects instead, ints past 255 bytes would not load with
#: ``weights_only=True``.)
MAX_INT_BITS = 2000


def fits_inline(value: Any) -> bool:
    """Whether a primitive can be written into the UTF-8 manifest as is (not a str with lone
    surrogates, which is stored as an object instead)."""
    if type(value) is str and not value.isascii():
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return False
    return True


def check_int(path: str, value: int) -> None:
    """Refuse an int (a leaf, or a key of the dict at ``path``) beyond :data:`MAX_INT_BITS`."""
    if value.bit_length() > MAX_INT_BITS:
        raise UnsupportedValueError(
            f"the int at logical path {path!r} has {value.bit_length()} bits; snapshotkit stores ints of at "
            f"most {MAX_INT_BITS} bits (about 600 digits) exactly. Store it as a str (str(value), with "
            "sys.set_int_max_str_digits() raised as needed) or as bytes (value.to_bytes(...)) instead"
        )


@dataclasses.dataclass(frozen=True)
class Flattened:
    """An object split by :func:`flatten`, both parts keyed by logical path in DFS order.

    Attributes:
        containers: the entry of every descended container (the object itself, if it is one).
        leaves: every value that is not descended.
    """

    containers: dict[str, ContainerEntry]
    leaves: dict[str, Any]


def is_flattenable_dict(obj: Mapping[Any, Any], path: str) -> bool:
    """Whether a ``dict``/``OrderedDict`` is stored as a container (its keys name logical paths), not
    as one object: distinct str or int keys that fit inline, each printing as its own text."""
    if set(map(type, obj)) <= {str} and "".join(obj).isascii():  # the common case, in C: distinct
        return True  # keys (a dict's), each fits inline
    seen: set[str] = set()
    for key in obj:
        if type(key) is int:
            check_int(path, key)
        elif not isinstance(key, str) or not fits_inline(key):
            return False
        elif type(key) is not str and str(key) != str.__str__(key):
            # a str subclass that prints as other text (a (str, Enum) member prints "C.A"): the
            # path would be built from one text and the manifest hold the other
            return False
        text = str(key)
        if text in seen:
            return False
        seen.add(text)
    return True


def flatten(obj: Any, prefix: str) -> Flattened:
    """Split ``obj`` into container entries and leaves, both keyed by logical path, in DFS order.

    ``obj`` itself has path ``prefix``; :func:`inflate` rebuilds it.

    Raises:
        UnsupportedValueError: containers nest deeper than :data:`MAX_NESTING_DEPTH`, or an int
            key has more than :data:`MAX_INT_BITS` bits.
    """
    containers: dict[str, ContainerEntry] = {}
    leaves: dict[str, Any] = {}
    stack: list[tuple[str, Any, int]] = [(prefix, obj, 0)]
    while stack:
        path, value, depth = stack.pop()
        kind = type(value)
        entry: ContainerEntry
        if (kind is dict or kind is OrderedDict) and is_flattenable_dict(value, path):
            entry = DictEntry(tuple(value.keys()), ordered=kind is OrderedDict)
            children, items = child_paths(path, entry.keys), list(value.values())
        elif kind is list or kind is tuple:
            entry = ListEntry(len(value)) if kind is list else TupleEntry(len(value))
            children, items = child_paths(path, range(len(value))), list(value)
        else:
            leaves[path] = value
            continue
        if depth >= MAX_NESTING_DEPTH:
            raise UnsupportedValueError(
                f"the state nests containers more than {MAX_NESTING_DEPTH} levels deep at logical path "
                f"{path[:200]!r}{'...' if len(path) > 200 else ''}; snapshotkit stores at most "
                f"{MAX_NESTING_DEPTH} levels. Flatten the structure, or return it from state_dict() as one "
                "object (e.g. a class instance) to store it with torch.save"
            )
        containers[path] = entry
        if _DESCENDED.isdisjoint(map(type, items)):  # only leaves below: depth first, they come next, in order
            leaves.update(zip(children, items, strict=True))
        else:
            stack.extend(zip(reversed(children), reversed(items), itertools.repeat(depth + 1)))
    return Flattened(containers, leaves)


#: The container types :func:`flatten` may descend (a dict only when its keys allow).
_DESCENDED = frozenset((dict, OrderedDict, list, tuple))


def inflate(prefix: str, containers: Mapping[str, ContainerEntry], leaves: Mapping[str, Any]) -> Any:
    """Rebuild the object at ``prefix`` from :func:`flatten`'s output (iteratively: any depth).

    Raises:
        KeyError: a child the container entry names has neither a container nor a leaf.
    """
    if prefix in leaves:
        return leaves[prefix]
    built: dict[str, Any] = {}
    # Depth first: a container is visited once to push its child containers, and again, after
    # they were all built, to build itself (its children's paths, named on the first visit, kept).
    stack: list[tuple[str, list[str] | None]] = [(prefix, None)]
    while stack:
        path, children = stack.pop()
        entry = containers[path]
        if children is None:
            names: Iterable[str | int] = entry.keys if isinstance(entry, DictEntry) else range(entry.length)
            children = child_paths(path, names)
            stack.append((path, children))
            stack.extend((child, None) for child in itertools.filterfalse(leaves.__contains__, children))
            continue
        if built:
            values = [leaves[child] if child in leaves else built.pop(child) for child in children]
        else:  # no container below was built: every child is a leaf (or missing: KeyError)
            values = list(map(leaves.__getitem__, children))
        if isinstance(entry, DictEntry):
            items = list(zip(entry.keys, values, strict=True))
            built[path] = OrderedDict(items) if entry.ordered else dict(items)
        else:
            built[path] = tuple(values) if isinstance(entry, TupleEntry) else values
    return built[prefix]
