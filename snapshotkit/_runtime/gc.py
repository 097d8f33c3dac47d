"""Pausing the cyclic garbage collector while a take or restore creates many small objects.

A snapshot of 20,000 tensors creates hundreds of thousands of objects (entries, pieces, views,
plans), most freed by reference counting and some kept (the manifest, the plan cache). With the
collector running, every 700 net allocations start a young collection and every tenth of those
a middle one; a take of 20,000 tensors made about ten middle collections, so most takes also met
the condition for a *full* collection, which scans every object of the process (0.1-0.2 s of a
~0.4 s take in a process that imported torch). Paused, the take makes none: reference counting
still frees everything acyclic, and the first collection after the pause scans what the take
left alive once, as the young collections would have.

Pauses nest and may overlap across threads (``async_take``'s coordinator thread and the caller's
next take): the collector is re-enabled when the last pause ends, if it was enabled when the
first began. A process forked during a pause (by another thread) has none of the pausing threads:
it starts with no pause and the collector as it was before the pause.
"""

from __future__ import annotations

import contextlib
import gc
import os
import threading
from collections.abc import Iterator

_lock = threading.Lock()
_depth = 0
_was_enabled = False


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """Disable cyclic GC inside the block (re-entrant and thread-safe; restores the state the
    collector was in when the outermost pause began)."""
    global _depth, _was_enabled
    with _lock:
        if _depth == 0:
            _was_enabled = gc.isenabled()
            gc.disable()
        _depth += 1
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0 and _was_enabled:
                gc.enable()


def _forget_pauses_after_fork() -> None:
    global _lock, _depth
    _lock = threading.Lock()  # another thread may have held it at the fork
    if _depth:
        _depth = 0
        if _was_enabled:
            gc.enable()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_pauses_after_fork)
