"""A root of ``step_<n>`` snapshots (a SnapshotManager's), as the names of its listing show it.

Names are all that is read here: which ``step_<n>`` directories hold objects, which of them hold a
manifest (a committed snapshot), and whether a manifest sits at the root itself (a snapshot taken
into the root instead of into a step: a stray, which the manager never counts as a step). The
manager (:mod:`snapshotkit._lifecycle.catalog`), ``snapshotkit ls`` and ``info``, and a take's
refusal to write into a root (:mod:`snapshotkit._take.prepare`) all read a root this way.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping, Sequence

from snapshotkit._format.entries import METADATA_FILENAME, OWN_OBJECT

_STEP_DIR = re.compile(r"step_(0|[1-9][0-9]*)")


def step_dir(step: int) -> str:
    """The directory (location prefix, no slash) of ``step``'s snapshot below the root."""
    return f"step_{step}"


def step_of(name: str) -> int | None:
    """The step of the directory ``name`` below the root (``"step_10"`` -> 10); None for any other name."""
    match = _STEP_DIR.fullmatch(name)
    return int(match.group(1)) if match is not None else None


@dataclasses.dataclass(frozen=True)
class StepObjects:
    """The objects below one ``step_<n>`` directory of the root.

    Attributes:
        step: ``n``.
        locations: every object below it, relative to the root, sorted.
    """

    step: int
    locations: tuple[str, ...]

    @property
    def committed(self) -> bool:
        """Whether the manifest is there (the take committed)."""
        return f"{step_dir(self.step)}/{METADATA_FILENAME}" in self.locations

    @property
    def only_ours(self) -> bool:
        """Whether every object is one a take writes (so removing them removes nothing foreign)."""
        prefix = step_dir(self.step) + "/"
        return all(OWN_OBJECT.fullmatch(location.removeprefix(prefix)) for location in self.locations)


@dataclasses.dataclass(frozen=True)
class RootListing:
    """The ``step_<n>`` directories of a root, by step.

    Attributes:
        steps: step -> its objects.
        root_snapshot: a manifest sits at the root itself: a snapshot taken into the root, not into
            a step (with steps beside it, a stray: never one of the manager's steps).
    """

    steps: Mapping[int, StepObjects]
    root_snapshot: bool = False

    @property
    def committed(self) -> list[int]:
        """Steps with a committed snapshot, ascending."""
        return sorted(step for step, objects in self.steps.items() if objects.committed)

    @property
    def incomplete(self) -> list[int]:
        """Steps with objects but no manifest (a take that never committed, or a deletion cut short)."""
        return sorted(step for step, objects in self.steps.items() if not objects.committed)

    @property
    def stray_snapshot(self) -> bool:
        """A snapshot sits at the root itself beside committed ``step_<n>`` snapshots."""
        return self.root_snapshot and bool(self.committed)


def parse_listing(locations: Sequence[str]) -> RootListing:
    """Group a root's listing by ``step_<n>`` directory; every other entry is ignored (a manifest
    at the root itself is noted in ``root_snapshot``)."""
    grouped: dict[int, list[str]] = {}
    for location in locations:
        head, slash, _ = location.partition("/")
        step = step_of(head) if slash else None
        if step is not None:
            grouped.setdefault(step, []).append(location)
    return RootListing(
        {step: StepObjects(step, tuple(sorted(found))) for step, found in grouped.items()},
        root_snapshot=METADATA_FILENAME in locations,
    )
