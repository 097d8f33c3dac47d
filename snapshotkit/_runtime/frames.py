"""Letting go of a failure's memory: the frames in an exception's traceback keep their local
variables (buffers, tensors, views of shared memory) alive for as long as the exception lives.

When the exception is also referenced from one of those frames (``error = exc`` in a handler, an
asyncio task that stored it), that is a reference cycle, and the memory stays allocated until a
garbage collection. :func:`drop_frames` frees it at once, at the cost of the locals a post-mortem
debugger would show.
"""

from __future__ import annotations

import traceback


def drop_frames(exc: BaseException) -> None:
    """Clear the local variables of every finished frame in the tracebacks of ``exc`` and of its
    causes and contexts; frames still executing (the caller's) are left alone."""
    seen: set[int] = set()
    pending: list[BaseException | None] = [exc]
    while pending:
        current = pending.pop()
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        if current.__traceback__ is not None:
            traceback.clear_frames(current.__traceback__)
        pending.extend((current.__cause__, current.__context__))
