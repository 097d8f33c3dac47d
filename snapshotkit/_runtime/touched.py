"""Whether a failed restore may have changed what it restored into: a mark on the error it raised.

The restore engine marks every error it raises: ``True`` once reads into the caller's own
tensors (in-place destinations) have started or a ``load_state_dict()`` has run, on this rank,
or when another rank failed after this one loaded. Layers that retry or fall back
(``SnapshotManager.restore_latest``) read the mark without knowing the engine, which sits beside
them. An error without a mark (raised before the engine ran) changed nothing.
"""

from __future__ import annotations

#: The attribute the mark is kept in; every exception instance accepts attributes.
_ATTRIBUTE = "_snapshotkit_state_touched"


def mark_touched(exc: BaseException, touched: bool) -> None:
    """Record on ``exc`` whether the failed restore may have changed its destinations.

    A mark only ever goes from ``False`` to ``True``: an error re-raised through several layers
    keeps the most cautious answer.
    """
    if touched or not hasattr(exc, _ATTRIBUTE):
        setattr(exc, _ATTRIBUTE, bool(touched) or state_touched(exc))


def state_touched(exc: BaseException) -> bool:
    """Whether the restore that raised ``exc`` may have changed its destinations (False unmarked)."""
    return bool(getattr(exc, _ATTRIBUTE, False))
