"""Which failures make ``restore_latest`` move on to an older snapshot, and how they are named.

A snapshot that is gone or damaged is skipped; anything else (a state that does not match, a
store that cannot be reached, a newer format) would fail on every snapshot alike and is raised.
Each rank classifies its own failure; a rank that only learned of another rank's failure
(``RankFailedError`` without a cause that crossed over) follows the others' verdict.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from snapshotkit.errors import (
    IntegrityError,
    ManifestError,
    RankFailedError,
    SnapshotNotFoundError,
    UnsafeStorageObjectError,
    UnsupportedFormatVersionError,
)

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
    return ", ".join(map(str, steps[:10])) + (f" ... ({len(steps)} in all)" if len(steps) > 10 else "")


def shown_paths(paths: Sequence[str]) -> str:
    return ", ".join(repr(p) for p in paths[:5]) + (f" and {len(paths) - 5} more" if len(paths) > 5 else "")
