"""``restore_latest``: the newest snapshot that restores, every rank moving on together.

A snapshot that is gone or damaged (an incremental one whose base is, too) is skipped; anything
else (a state that does not match, a store that cannot be reached, a newer format) would fail on
every snapshot alike and is raised.
Each rank classifies its own failure; a rank that only learned of another rank's failure
(``RankFailedError`` without a cause that crossed over) follows the others' verdict.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal

from snapshotkit import _events
from snapshotkit._dist import Group
from snapshotkit._text import first_few
from snapshotkit.errors import (
    IntegrityError,
    ManifestError,
    RankFailedError,
    SnapshotNotFoundError,
    StateMismatchError,
    UnsafeStorageObjectError,
    UnsupportedFormatVersionError,
)


def restore_newest(
    group: Group,
    candidates: Sequence[int],
    open_step: Callable[[int], Any],
    app_state: Any,
    restore_kwargs: Mapping[str, Any],
) -> tuple[int, Any] | None:
    """Restore the newest of ``candidates`` (ascending committed steps, the same on every rank)
    that restores; its step and :class:`~snapshotkit.RestoreReport`, or None when none does or
    there is none.
    ``open_step(step)`` gives the :class:`~snapshotkit.Snapshot` of a step (not imported here: the
    facade sits above this layer).

    Collective. A snapshot every rank agrees to skip (see :func:`verdict`) gets a
    ``RuntimeWarning`` and the next older one is tried; after a fallback, a snapshot that lacks
    some of the state raises ``StateMismatchError`` (the failed attempt may have left its data).
    """
    skipped: list[int] = []
    for step in reversed(candidates):
        snapshot = open_step(step)
        try:
            opening: BaseException | None = None
            try:
                snapshot.metadata  # noqa: B018 - read on every rank, then agreed on, before the restore
            except Exception as exc:
                opening = exc
            group.exchange(None, opening, f"restore_latest: opening the snapshot of step {step}")
            with _events.step_scope(step):
                report = snapshot.restore(app_state, **restore_kwargs)
        except Exception as exc:
            if not _skip_together(group, exc):
                raise
            warnings.warn(
                f"restore_latest: skipping the snapshot of step {step} at {snapshot.path!r}: {reason(exc)}; "
                "trying the next older one",
                RuntimeWarning,
                stacklevel=3,  # the caller of SnapshotManager.restore_latest
            )
            skipped.append(step)
            continue
        if skipped and group.any(bool(report.missing_keys), "restore_latest: checking the fallback"):
            raise StateMismatchError(
                f"restore_latest fell back from step {skipped[0]} to step {step}, which lacks some of the state "
                f"({shown_paths(report.missing_keys)} on this rank): the failed attempt may have left "
                "its data there. Rebuild the objects and restore again (strict=False restores only what a "
                "snapshot has)"
            )
        return step, report
    return None


def _skip_together(group: Group, exc: BaseException) -> bool:
    """Whether every rank skips the snapshot that raised ``exc`` (all ranks agree)."""
    mine = verdict(exc)
    if not group.distributed:
        return mine == "skip"
    return skip_agreed(group.exchange(mine, None, "restore_latest: agreeing to skip a snapshot"))


Verdict = Literal["skip", "raise", "follow"]


def verdict(exc: BaseException) -> Verdict:
    """This rank's verdict on the snapshot whose restore raised ``exc``."""
    own = exc.__cause__ if isinstance(exc, RankFailedError) else exc
    if own is None:
        return "follow"
    if isinstance(own, UnsupportedFormatVersionError):
        return "raise"
    damaged = (SnapshotNotFoundError, ManifestError, IntegrityError, UnsafeStorageObjectError)
    return "skip" if isinstance(own, damaged) else "raise"


def skip_agreed(verdicts: Sequence[Verdict]) -> bool:
    """Whether the ranks skip together: someone says skip and nobody says raise."""
    return "raise" not in verdicts and "skip" in verdicts


def reason(exc: BaseException) -> str:
    """The failure to name in the warning: the failing rank's own error where it crossed over."""
    own = exc.__cause__ if isinstance(exc, RankFailedError) and exc.__cause__ is not None else exc
    return f"{type(own).__name__}: {own}"


def shown_steps(steps: Sequence[int]) -> str:
    if not steps:
        return "none"
    return first_few(steps, 10, show=str)


def shown_paths(paths: Sequence[str]) -> str:
    return first_few(paths)
