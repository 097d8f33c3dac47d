"""The step to restore and where each rank restores it from (``_tier/agreement.py``)."""

from __future__ import annotations

import random
from collections import Counter

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from snapshotkit._tier.agreement import Decision, Holdings, RankSource, Source, decide, describe
from snapshotkit.errors import ConfigError, InvalidArgumentError

FAST = settings(max_examples=300, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])

LOCAL, PEER, DURABLE = Source.LOCAL, Source.PEER, Source.DURABLE

Excluded = frozenset[tuple[int, int, int]]
Case = tuple[list[Holdings], list[int], Excluded]


def held(*copies: tuple[int, int]) -> Holdings:
    return Holdings(frozenset(copies))


# --------------------------------------------------------------------------- examples


def test_every_rank_has_its_own_copy() -> None:
    decision = decide([held((100, 0), (150, 0)), held((100, 1), (150, 1))], [100])
    assert decision == Decision(150, (RankSource(LOCAL, 0), RankSource(LOCAL, 1)))
    assert decision.tier == "local"


def test_a_lost_node_is_served_by_peers() -> None:
    """Ranks 2 and 3 lost their node; ranks 0 and 1 hold their replicas."""
    holdings = [held((150, 0), (150, 2)), held((150, 1), (150, 3)), held(), held()]
    decision = decide(holdings, [100])
    assert decision is not None
    assert decision.sources == (RankSource(LOCAL, 0), RankSource(LOCAL, 1), RankSource(PEER, 0), RankSource(PEER, 1))
    assert describe(decision) == "step 150: ranks 0,1 local; rank 2 from rank 0 (peer); rank 3 from rank 1 (peer)"


def test_without_replicas_a_lost_node_falls_back_to_the_durable_step() -> None:
    holdings = [held((150, 0)), held((150, 1)), held(), held()]
    decision = decide(holdings, [100, 50])
    assert decision == Decision(100, (RankSource(DURABLE, None),) * 4)
    assert decision.tier == "durable"
    assert describe(decision) == "step 100: ranks 0-3 durable"


def test_a_newer_durable_step_wins_over_an_older_local_one() -> None:
    decision = decide([held((150, 0)), held((150, 1))], [200])
    assert decision is not None
    assert (decision.step, decision.tier) == (200, "durable")


def test_a_step_in_both_tiers_is_served_locally_unless_durable_wins_ties() -> None:
    holdings = [held((200, 0)), held((200, 1))]
    assert decide(holdings, [200]) == Decision(200, (RankSource(LOCAL, 0), RankSource(LOCAL, 1)))
    durable = decide(holdings, [200], newest_durable_wins_ties=True)
    assert durable == Decision(200, (RankSource(DURABLE, None),) * 2)
    # the flag changes nothing for a step the durable tier lacks
    assert decide(holdings, [100], newest_durable_wins_ties=True) == decide(holdings, [100])


def test_a_damaged_copy_is_never_used() -> None:
    holdings = [held((150, 0), (150, 1), (100, 0)), held((150, 1), (100, 1))]
    # rank 1's own copy of 150 is damaged: rank 0's replica serves it
    decision = decide(holdings, [], excluded=frozenset({(150, 1, 1)}))
    assert decision is not None
    assert decision.sources == (RankSource(LOCAL, 0), RankSource(PEER, 0))
    # both copies damaged: the next intact step
    decision = decide(holdings, [], excluded=frozenset({(150, 1, 1), (150, 1, 0)}))
    assert decision is not None
    assert decision.step == 100


def test_nothing_to_restore() -> None:
    assert decide([held(), held()], []) is None
    assert decide([held((5, 0)), held()], []) is None  # rank 1 has no copy of step 5 anywhere


def test_copies_of_ranks_outside_the_group_serve_no_rank() -> None:
    assert decide([held((5, 0), (5, 3))], []) == Decision(5, (RankSource(LOCAL, 0),))


def test_peers_share_the_ranks_they_can_serve() -> None:
    """Ranks 2-5 lost their copies; ranks 0 and 1 both hold all four: two each."""
    everything = [(9, owner) for owner in range(6)]
    decision = decide([held(*everything), held(*everything)] + [held()] * 4, [])
    assert decision is not None
    holders = [source.holder for source in decision.sources[2:]]
    assert Counter(holders) == {0: 2, 1: 2}
    assert describe(decision) == "step 9: ranks 0,1 local; ranks 2,4 from rank 0 (peer); ranks 3,5 from rank 1 (peer)"


def test_ranks_with_fewer_candidates_are_served_first() -> None:
    """Rank 2 can only be served by rank 0; rank 3 by rank 0 or 1: it goes to rank 1."""
    holdings = [held((1, 0), (1, 2), (1, 3)), held((1, 1), (1, 3)), held(), held()]
    decision = decide(holdings, [])
    assert decision is not None
    assert decision.sources[2:] == (RankSource(PEER, 0), RankSource(PEER, 1))


def test_arguments_are_checked() -> None:
    with pytest.raises(ConfigError):
        decide([], [1])
    with pytest.raises(InvalidArgumentError):
        decide([frozenset({(1, 0)})], [1])  # type: ignore[list-item]
    with pytest.raises(ConfigError, match="durable step"):
        decide([held()], [-1])
    with pytest.raises(InvalidArgumentError):
        decide([held()], ["1"])  # type: ignore[list-item]
    with pytest.raises(ConfigError, match="owner rank"):
        decide([held((1, -1))], [])
    with pytest.raises(InvalidArgumentError, match="step"):
        decide([held((True, 0))], [])
    with pytest.raises(InvalidArgumentError, match="frozenset"):
        Holdings({(1, 0)})  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match="pairs"):
        Holdings(frozenset({(1, 0, 0)}))  # type: ignore[arg-type]


# --------------------------------------------------------------------------- properties


@st.composite
def situations(
    draw: st.DrawFn,
) -> Case:
    """Every rank's copies (its own, some replicas), durable steps and some damaged copies."""
    world = draw(st.integers(1, 6))
    steps = draw(st.lists(st.integers(0, 8), min_size=1, max_size=5, unique=True))
    copies = st.tuples(st.sampled_from(steps), st.integers(0, world - 1))
    holdings = [Holdings(frozenset(draw(st.lists(copies, max_size=12)))) for _ in range(world)]
    # often give a step a full set of own copies, so that local decisions are common
    if draw(st.booleans()):
        full = draw(st.sampled_from(steps))
        holdings = [Holdings(h.copies | {(full, rank)}) for rank, h in enumerate(holdings)]
    durable = draw(st.lists(st.integers(0, 8), max_size=4))
    every_copy = sorted((step, owner, holder) for holder, h in enumerate(holdings) for step, owner in h.copies)
    excluded = frozenset(draw(st.lists(st.sampled_from(every_copy), max_size=4))) if every_copy else frozenset()
    return holdings, durable, excluded


def usable_holders(holdings: list[Holdings], excluded: Excluded, step: int, owner: int) -> set[int]:
    return {
        holder
        for holder, h in enumerate(holdings)
        if (step, owner) in h.copies and (step, owner, holder) not in excluded
    }


def locally_servable(holdings: list[Holdings], excluded: Excluded, step: int) -> bool:
    return all(usable_holders(holdings, excluded, step, owner) for owner in range(len(holdings)))


@FAST
@given(case=situations(), ties=st.booleans())
def test_the_newest_servable_step_is_chosen(case: Case, ties: bool) -> None:
    holdings, durable, excluded = case
    decision = decide(holdings, durable, excluded=excluded, newest_durable_wins_ties=ties)
    every_step = {step for h in holdings for step, _ in h.copies} | set(durable)
    servable = {step for step in every_step if step in durable or locally_servable(holdings, excluded, step)}
    if not servable:
        assert decision is None
        return
    assert decision is not None
    assert decision.step == max(servable)
    assert len(decision.sources) == len(holdings)
    if decision.tier == "durable":
        # the durable tier serves every rank or none, and only a step it holds
        assert decision.step in durable
        assert all(source == RankSource(DURABLE, None) for source in decision.sources)
        assert ties or not locally_servable(holdings, excluded, decision.step)
    else:
        assert not (ties and decision.step in durable)


@FAST
@given(case=situations())
def test_every_source_really_holds_an_intact_copy(
    case: Case,
) -> None:
    holdings, durable, excluded = case
    decision = decide(holdings, durable, excluded=excluded)
    if decision is None or decision.tier == "durable":
        return
    for rank, source in enumerate(decision.sources):
        assert source.holder is not None
        assert (decision.step, rank) in holdings[source.holder].copies
        assert (decision.step, rank, source.holder) not in excluded
        own = rank in usable_holders(holdings, excluded, decision.step, rank)
        # the own copy is used whenever it is usable, a peer's only otherwise
        assert source == (RankSource(LOCAL, rank) if own else RankSource(PEER, source.holder))
        assert source.source is LOCAL or source.holder != rank


@FAST
@given(case=situations(), ties=st.booleans(), rng=st.randoms(use_true_random=False))
def test_the_decision_depends_on_the_sets_alone(case: Case, ties: bool, rng: random.Random) -> None:
    holdings, durable, excluded = case
    decision = decide(holdings, durable, excluded=excluded, newest_durable_wins_ties=ties)

    def shuffled(items: list[tuple[int, ...]]) -> list[tuple[int, ...]]:
        items = list(items)
        rng.shuffle(items)
        return items

    again = [Holdings(frozenset(shuffled(list(h.copies)))) for h in holdings]
    durable_again = shuffled([(step,) for step in durable]) + [(step,) for step in durable]  # order, duplicates
    excluded_again = frozenset(shuffled(list(excluded)))
    assert (
        decide(again, (step for (step,) in durable_again), excluded=excluded_again, newest_durable_wins_ties=ties)
        == decision
    )


@FAST
@given(case=situations())
def test_peers_serve_a_balanced_share(case: Case) -> None:
    """The rule replayed without shortcuts (fewest candidates first, then by rank; each onto the
    candidate that served the fewest so far, the lower rank on ties), and the bound decide()
    documents: with P peer-served ranks, each with at least m candidate peers, no peer serves
    more than 1 + (P - 1) / m."""
    holdings, durable, excluded = case
    decision = decide(holdings, durable, excluded=excluded)
    if decision is None or decision.tier == "durable":
        return
    peer_served = [rank for rank, source in enumerate(decision.sources) if source.source is PEER]
    if not peer_served:
        return
    candidates = {rank: usable_holders(holdings, excluded, decision.step, rank) for rank in peer_served}
    served: Counter[int] = Counter()
    for rank in sorted(peer_served, key=lambda rank: (len(candidates[rank]), rank)):
        expected = min(candidates[rank], key=lambda holder: (served[holder], holder))
        assert decision.sources[rank].holder == expected
        served[expected] += 1
    fewest = min(len(holders) for holders in candidates.values())
    assert (max(served.values()) - 1) * fewest <= len(peer_served) - 1


@FAST
@given(case=situations())
def test_describe_names_every_rank_once(case: Case) -> None:
    holdings, durable, excluded = case
    decision = decide(holdings, durable, excluded=excluded)
    if decision is None:
        return
    line = describe(decision)
    assert line.startswith(f"step {decision.step}: ")
    named: list[int] = []
    for part in line.split(": ", 1)[1].split("; "):
        ranks = part.split(" ")[1]
        for word in ranks.split(","):
            first, _, last = word.partition("-")
            named.extend(range(int(first), int(last or first) + 1))
    assert sorted(named) == list(range(len(holdings)))
