"""The vectorized decide (``_plan/decide.py``, issue 27) against the decide it replaced
(``tests/plan/_old_decide.py``, kept verbatim): the same decision on random layouts."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from plan import _old_decide
from plan._world import StateBuilder, World, worlds
from snapshotkit._format.sharded import Box
from snapshotkit._plan.decide import Decision, decide
from snapshotkit._plan.leaves import RankInfo
from snapshotkit.errors import UnsupportedValueError

# Worlds of up to 24 ranks take a while to draw; the comparison itself is fast.
SETTINGS = settings(max_examples=150, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])


def assert_same(infos: list[RankInfo], chunk_bytes: int) -> Decision | None:
    """Both decide alike, or both raise the same error (then None)."""
    try:
        old = _old_decide.decide(infos, chunk_bytes=chunk_bytes)
    except UnsupportedValueError as exc:
        expected = str(exc)
    else:
        expected = None
    if expected is not None:
        with pytest.raises(UnsupportedValueError) as raised:
            decide(infos, chunk_bytes=chunk_bytes)
        assert str(raised.value) == expected
        return None
    new = decide(infos, chunk_bytes=chunk_bytes)
    assert new.replicated == old.replicated
    assert new.differing == old.differing
    assert new.sharded == old.sharded
    assert new.spans == old.spans
    assert new.owner == old.owner
    return new


@SETTINGS
@given(world=worlds(max_ranks=6))
def test_the_same_decision_as_before_on_random_takes(world: World) -> None:
    assert_same(world.infos(), world.chunk_bytes)


@st.composite
def sharded_worlds(draw: st.DrawFn) -> World:
    """Many ranks: a fully sharded tensor (a box per rank, so one holder each), row blocks held
    by groups of ranks (several holders), replicated tensors whose pieces may be as large as
    the boxes' (sizes placed item by item, mixed), and rank-local bytes that differ."""
    size = draw(st.integers(1, 24))
    builders = [StateBuilder() for _ in range(size)]
    rows = draw(st.lists(st.integers(1, 4), min_size=size, max_size=size))  # uneven: loads differ
    starts = [sum(rows[:rank]) for rank in range(size)]
    for rank, builder in enumerate(builders):
        builder.sharded("optim/fsdp", (sum(rows), 2), [Box((starts[rank], 0), (rows[rank], 2))])
    groups = draw(st.integers(1, min(size, 4)))
    block = draw(st.integers(1, 3))
    for rank, builder in enumerate(builders):
        builder.sharded("tp/w", (block * groups, 2), [Box((rank % groups * block, 0), (block, 2))])
    for index in range(draw(st.integers(0, 4))):
        shape = (draw(st.sampled_from([rows[0] * 2, block * 2, 1, 5, 16])),)
        for builder in builders:
            builder.tensor(f"model/w{index}", shape)
    for rank, builder in enumerate(builders):
        for index in range(draw(st.integers(0, 2))):
            builder.tensor(f"local/{rank}/{index}", (draw(st.integers(0, 20)),))
    return World(tuple(b.build() for b in builders), draw(st.sampled_from([4, 8, 16, 64, 1 << 20])), 1 << 20)


@SETTINGS
@given(world=sharded_worlds())
def test_the_same_owners_as_before_with_many_single_holder_boxes(world: World) -> None:
    assert_same(world.infos(), world.chunk_bytes)
