"""The column packer and the fix_plan built on it (issue 27, a first take of many small tensors)
against the planner they replaced (``tests/plan/_old_rank_plan.py``, kept verbatim): the same
plan, down to the order of the entries and of the shared pieces, on random takes."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from plan import _old_rank_plan
from plan._world import World, worlds
from snapshotkit._plan.layout import PayloadSpan, pack_columns, pack_pieces
from snapshotkit._plan.rank_plan import fix_plan

SETTINGS = settings(max_examples=150, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])


@SETTINGS
@given(world=worlds(max_ranks=5))
def test_fix_plan_plans_as_before_on_random_takes(world: World) -> None:
    decision = world.decide()
    for rank, state in enumerate(world.states):
        sizes = {"chunk_bytes": world.chunk_bytes, "data_object_bytes": world.data_object_bytes}
        new = fix_plan(state, decision, rank=rank, **sizes)
        old = _old_rank_plan.fix_plan(state, decision, rank=rank, **sizes)
        assert new == old
        assert list(new.entries) == list(old.entries)  # the manifest's writer order
        assert list(new.shared_slots) == list(old.shared_slots)  # merge_results places by this order


pieces = st.lists(
    st.tuples(st.integers(0, 50), st.integers(0, 300), st.integers(0, 300)).map(
        lambda t: PayloadSpan(t[0], min(t[1], t[2]), max(t[1], t[2]))
    ),
    max_size=40,
)


@SETTINGS
@given(
    pieces=pieces,
    data_object_bytes=st.integers(1, 1000),
    alignment=st.sampled_from([1, 8, 64]),
    first_index=st.integers(0, 3),
)
def test_the_column_packer_packs_as_before(
    pieces: list[PayloadSpan], data_object_bytes: int, alignment: int, first_index: int
) -> None:
    options = {"rank": 1, "take_id": "t", "data_object_bytes": data_object_bytes, "first_index": first_index}
    old = _old_rank_plan.pack_pieces(pieces, alignment=alignment, **options)
    assert pack_pieces(pieces, alignment=alignment, **options) == old
    columns = [p.payload for p in pieces], [p.start for p in pieces], [p.end for p in pieces]
    assert pack_columns(*columns, alignment=alignment, **options) == old
