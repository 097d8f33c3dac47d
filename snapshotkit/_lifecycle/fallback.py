"""``restore_latest``: the newest snapshot that restores, every rank moving on together.

A snapshot that is gone or damaged (an incremental one whose base is, too) is skipped; anything
else (a state that does not match, a store that cannot be reached, a newer format) would fail on
every snapshot alike and is raised.
Each rank classifies its own failure; a rank that only learned of another rank's failure
(``RankFailedError`` without a cause that crossed over) follows the others' verdict.
A failed attempt may already have written into the state (direct reads fill tensors in place
before their checksums are known to be wrong): when no snapshot restores after such an attempt,
every rank raises ``PartialRestoreError``; None means nothing restored and nothing changed.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal

from snapshotkit import _events
from snapshotkit._dist import Group
from snapshotkit._runtime.touched import state_touched
from snapshotkit._text import first_few
from snapshotkit.errors import (
    IntegrityError,
    ManifestError,
    PartialRestoreError,
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
    that restores; its step and :class:`~snapshotkit.RestoreReport`, or None when there is none,
    or none restored and no attempt changed the state.
    ``open_step(step)`` gives the :class:`~snapshotkit.Snapshot` of a step (not imported here: the
    facade sits above this layer).

    Collective. A snapshot every rank agrees to skip (see :func:`verdict`) gets a
    ``RuntimeWarning`` and the next older one is tried; after a fallback, a snapshot that lacks
    some of the state raises ``StateMismatchError`` (the failed attempt may have left its data).
    When no snapshot restores and an attempt may have written into the state on any rank (the
    restore engine marks its errors, :mod:`snapshotkit._runtime.touched`), every rank raises
    :class:`~snapshotkit.errors.PartialRestoreError` naming each attempt (the last failure as its
    cause), instead of returning None or raising that failure alone.
    """
    tried: list[Attempt] = []
    last_error: BaseException | None = None
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
            skip, touched = _agree(group, exc)
            tried.append(Attempt(step, snapshot.path, reason(exc), touched))
            if not skip:
                if any(attempt.touched for attempt in tried):
                    raise partial_restore(tried) from exc
                raise
            warnings.warn(
                f"restore_latest: skipping the snapshot of step {step} at {snapshot.path!r}: {reason(exc)}; "
                "trying the next older one",
                RuntimeWarning,
                stacklevel=3,  # the caller of SnapshotManager.restore_latest
            )
            last_error = exc
            continue
        # State not loaded keeps its current values, which the failed attempt may have written.
        kept = report.missing_keys + report.mismatched_keys
        if tried and group.any(bool(kept), "restore_latest: checking the fallback"):
            raise StateMismatchError(
                f"restore_latest fell back from step {tried[0].step} to step {step}, which lacks some of the state "
                f"({shown_paths(kept)} on this rank): the failed attempt may have left "
                "its data there. Rebuild the objects and restore again (strict=False restores only what a "
                "snapshot has)"
            )
        return step, report
    if any(attempt.touched for attempt in tried):
        raise partial_restore(tried) from last_error
    return None


@dataclasses.dataclass(frozen=True)
class Attempt:
    """A snapshot restore_latest tried, which did not restore.

    Attributes:
        touched: whether the attempt may have written into the state, on any rank.
    """

    step: int
    path: str
    reason: str
    touched: bool


def partial_restore(tried: Sequence[Attempt]) -> PartialRestoreError:
    """The error for attempts that restored nothing, some of which may have written into the state."""
    lines = "; ".join(
        f"step {a.step} at {a.path!r}: {a.reason} "
        f"({'may have written into the state' if a.touched else 'failed before writing anything'})"
        for a in tried
    )
    return PartialRestoreError(
        "restore_latest restored no snapshot, and a failed attempt may have written part of a snapshot into the "
        "objects of app_state: they now hold neither their previous values nor a snapshot's. Tried, newest "
        f"first: {lines}. Do not train on from these objects: build them anew (model, optimizer...), then "
        "restore from an intact snapshot (`snapshotkit verify PATH` checks one) or start from scratch with "
        "the new objects",
        tuple((a.step, a.reason) for a in tried),
    )


def _agree(group: Group, exc: BaseException) -> tuple[bool, bool]:
    """Whether every rank skips the snapshot that raised ``exc`` (all ranks agree), and whether the
    failed attempt may have written into the state on any rank (all ranks agree on that too)."""
    mine, touched = verdict(exc), state_touched(exc)
    if not group.distributed:
        return mine == "skip", touched
    verdicts: list[tuple[Verdict, bool]] = group.exchange(
        (mine, touched), None, "restore_latest: agreeing to skip a snapshot"
    )
    return skip_agreed([v for v, _ in verdicts]), any(t for _, t in verdicts)


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
