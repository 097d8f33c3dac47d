"""The step every rank restores, and the copy each rank restores it from.

Pure: no process group, no storage, no torch. The caller gathers every rank's :class:`Holdings`
(the committed copies in its node's local root) and the durable tier's steps, and every rank then
computes the same :class:`Decision` with :func:`decide`.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Iterable, Sequence

from snapshotkit.errors import ConfigError, InvalidArgumentError

__all__ = ["Decision", "Holdings", "RankSource", "Source", "decide", "describe"]


class Source(str, enum.Enum):
    """Where a rank's state for the chosen step comes from."""

    LOCAL = "local"
    """Its own copy, in its node's local root."""
    PEER = "peer"
    """A copy in another rank's local root, sent over the process group."""
    DURABLE = "durable"
    """The durable tier (the manager's root)."""


@dataclasses.dataclass(frozen=True)
class Holdings:
    """The committed copies one rank finds in its node's local root.

    Attributes:
        copies: ``(step, owner_rank)`` of each copy: its own snapshots (``owner_rank`` is the rank
            itself) and the replicas it holds for others. Copies are of one world size: the
            caller leaves out those taken with another.
    """

    copies: frozenset[tuple[int, int]]

    def __post_init__(self) -> None:
        if not isinstance(self.copies, frozenset):
            raise InvalidArgumentError(
                f"Holdings.copies must be a frozenset of (step, owner_rank), got {type(self.copies).__name__}"
            )
        for copy in self.copies:
            if not isinstance(copy, tuple) or len(copy) != 2:
                raise InvalidArgumentError(f"Holdings.copies holds (step, owner_rank) pairs, got {copy!r}")
            _non_negative("a step", copy[0])
            _non_negative("an owner rank", copy[1])


@dataclasses.dataclass(frozen=True)
class RankSource:
    """Where one rank's state comes from.

    Attributes:
        source: which tier, and whether the copy is the rank's own.
        holder: the rank whose local root holds the copy (the rank itself for ``LOCAL``, the
            peer for ``PEER``); None for ``DURABLE``.
    """

    source: Source
    holder: int | None


@dataclasses.dataclass(frozen=True)
class Decision:
    """The step to restore and, for each rank, where from.

    Attributes:
        step: the step every rank restores.
        sources: ``sources[rank]``: where that rank's state comes from.
    """

    step: int
    sources: tuple[RankSource, ...]

    @property
    def tier(self) -> str:
        """``"local"`` when every rank is served by the local tier, else ``"durable"``."""
        return "durable" if any(rank.source is Source.DURABLE for rank in self.sources) else "local"


def decide(
    holdings: Sequence[Holdings],
    durable_steps: Iterable[int],
    *,
    excluded: frozenset[tuple[int, int, int]] = frozenset(),
    newest_durable_wins_ties: bool = False,
) -> Decision | None:
    """The newest step some tier can serve on every rank, and the copy each rank restores.

    The rule. Candidate steps are every step in any rank's holdings or in ``durable_steps``,
    newest first; the first one served wins:

    - A step is served by the local tier when every rank ``r`` has a usable copy of
      ``(step, r)``: a copy some rank holds that is not in ``excluded``. A rank's own copy is
      preferred (``LOCAL``). Otherwise a peer's (``PEER``): ranks are served in order of how
      few peers could serve them (then by rank), each by the candidate peer that serves the
      fewest ranks so far, the lower rank on ties. Node membership plays no part here.
    - Otherwise, a step in ``durable_steps`` is served by the durable tier on every rank
      (``DURABLE``): a durable restore is collective, so that tier serves all ranks of a step
      or none, never a mix with local copies.

    So a local step older than the newest durable step is never chosen over it, and a step in
    both tiers is served locally, unless ``newest_durable_wins_ties``.

    Load spread: a rank served by peer ``h`` saw ``h`` serve no more ranks than any of its other
    candidates at that moment. Hence if every peer-served rank has at least ``m`` candidate
    peers, no peer serves more than ``1 + (P - 1) / m`` of the ``P`` peer-served ranks.

    Args:
        holdings: ``holdings[rank]``: the copies in that rank's local root, for every rank.
        durable_steps: the steps the durable tier holds committed.
        excluded: ``(step, owner, holder)`` copies found damaged or unusable: never chosen.
        newest_durable_wins_ties: serve the chosen step from the durable tier when it holds it,
            even if the local tier could serve it too.

    Returns:
        The decision, or None when no tier holds a step every rank can restore.

    Raises:
        InvalidArgumentError: an argument of the wrong type.
        ConfigError: no ranks, or a negative durable step.
    """
    holdings = tuple(holdings)
    if not holdings:
        raise ConfigError("decide() needs the holdings of at least one rank, got none")
    if not all(isinstance(held, Holdings) for held in holdings):
        raise InvalidArgumentError(f"holdings must be a sequence of Holdings, one per rank, got {holdings!r}")
    durable = {_non_negative("a durable step", step) for step in durable_steps}
    world = len(holdings)
    # usable[step][owner]: the ranks holding a usable copy of (step, owner)
    usable: dict[int, dict[int, set[int]]] = {}
    for holder, held in enumerate(holdings):
        for step, owner in held.copies:
            if owner < world and (step, owner, holder) not in excluded:
                usable.setdefault(step, {}).setdefault(owner, set()).add(holder)
    for step in sorted(usable.keys() | durable, reverse=True):
        by_owner = usable.get(step, {})
        local = len(by_owner) == world and not (newest_durable_wins_ties and step in durable)
        if local:
            return Decision(step, _local_sources(by_owner, world))
        if step in durable:
            return Decision(step, (RankSource(Source.DURABLE, None),) * world)
    return None


def _local_sources(by_owner: dict[int, set[int]], world: int) -> tuple[RankSource, ...]:
    """Each rank's own copy where it has one, else the least busy peer (see :func:`decide`)."""
    sources: list[RankSource | None] = [None] * world
    served: dict[int, int] = {}
    for owner in range(world):
        if owner in by_owner[owner]:
            sources[owner] = RankSource(Source.LOCAL, owner)
    waiting = sorted((len(by_owner[owner]), owner) for owner in range(world) if sources[owner] is None)
    for _, owner in waiting:
        peer = min(by_owner[owner], key=lambda holder: (served.get(holder, 0), holder))
        served[peer] = served.get(peer, 0) + 1
        sources[owner] = RankSource(Source.PEER, peer)
    chosen = tuple(source for source in sources if source is not None)
    assert len(chosen) == world  # every rank is LOCAL or has a usable peer: by_owner covers every rank
    return chosen


def _non_negative(what: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidArgumentError(f"{what} must be an int, got {type(value).__name__} {value!r}")
    if value < 0:
        raise ConfigError(f"{what} must be at least 0, got {value}")
    return value


def describe(decision: Decision) -> str:
    """One log line: ``step 150: ranks 0,1 local; rank 2 from rank 0 (peer); rank 3 from rank 1 (peer)``.

    Runs of three or more ranks are written as ranges (``ranks 0-7 local``), and the ranks one
    peer serves are named together (``ranks 4,6 from rank 1 (peer)``).
    """
    local = [rank for rank, source in enumerate(decision.sources) if source.source is Source.LOCAL]
    durable = [rank for rank, source in enumerate(decision.sources) if source.source is Source.DURABLE]
    by_peer: dict[int, list[int]] = {}
    for rank, source in enumerate(decision.sources):
        if source.source is Source.PEER and source.holder is not None:
            by_peer.setdefault(source.holder, []).append(rank)
    parts = []
    if local:
        parts.append(f"{_ranks(local)} local")
    parts.extend(f"{_ranks(ranks)} from rank {peer} (peer)" for peer, ranks in sorted(by_peer.items()))
    if durable:
        parts.append(f"{_ranks(durable)} durable")
    return f"step {decision.step}: " + "; ".join(parts)


def _ranks(ranks: list[int]) -> str:
    """``rank 3``, ``ranks 0,1``, ``ranks 0-7,9`` for ascending ``ranks``."""
    runs: list[list[int]] = []
    for rank in ranks:
        if runs and rank == runs[-1][-1] + 1:
            runs[-1].append(rank)
        else:
            runs.append([rank])
    words = []
    for run in runs:
        words.append(f"{run[0]}-{run[-1]}" if len(run) >= 3 else ",".join(map(str, run)))
    return ("rank " if len(ranks) == 1 else "ranks ") + ",".join(words)
