"""Text for messages: a bounded list of names.

At the bottom of the layering (it imports nothing of snapshotkit), so every module that names
paths, locations or steps in a message or a log line says "and N more" the same way.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import TypeVar

__all__ = ["describe_paths", "first_few"]

T = TypeVar("T")


def first_few(items: Sequence[T], limit: int = 5, *, show: Callable[[T], str] = repr, separator: str = ", ") -> str:
    """``'a', 'b', 'c', 'd', 'e' and 3 more``: the first ``limit`` of ``items``, in their order.

    Args:
        items: what to name, already in the order to show (sort and deduplicate first if needed).
        limit: how many to name at most; the rest are counted.
        show: how to write one item (``repr`` by default: quoted paths; ``str`` for numbers, file names).
        separator: between two items (``"; "`` where an item holds commas).

    Returns:
        The shown items joined by ``separator``, then `` and N more`` when some were left out; ``""``
        for none.
    """
    if limit < 1:
        raise ValueError(f"limit must be at least 1, got {limit}")
    shown = separator.join(show(item) for item in items[:limit])
    return shown + (f" and {len(items) - limit} more" if len(items) > limit else "")


def describe_paths(paths: Iterable[str]) -> str:
    """``'a', 'b' and 3 more``: the paths (logical paths, locations) a message is about, each once,
    sorted, the first five quoted."""
    return first_few(sorted(set(paths)))
