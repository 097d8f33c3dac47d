"""Read batching (``_plan/reads.py``): which ranged reads fetch the byte ranges a restore wants."""

from __future__ import annotations

import itertools
import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from snapshotkit._plan.reads import RangeRequest, ReadBatch, plan_read_batches

FAST = settings(max_examples=150, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])


def test_read_batches_merge_close_requests_only() -> None:
    requests = [
        RangeRequest("a", 0, 100, 0),
        RangeRequest("a", 128, 200, 1),  # gap 28: merged
        RangeRequest("a", 10_000, 10_100, 2),  # far: new batch
        RangeRequest("b", 0, 10, 3),  # other object
        RangeRequest("a", 0, 100, 4),  # same bytes again: never merged into an overlapping batch
    ]
    batches = plan_read_batches(requests, max_batch_bytes=1 << 20, max_gap_bytes=64)
    layout = sorted((b.location, b.start, b.end, tuple(r.tag for r in b.requests)) for b in batches)
    assert layout == [
        ("a", 0, 100, (0,)),
        ("a", 0, 200, (4, 1)),
        ("a", 10_000, 10_100, (2,)),
        ("b", 0, 10, (3,)),
    ] or layout == [
        ("a", 0, 100, (4,)),
        ("a", 0, 200, (0, 1)),
        ("a", 10_000, 10_100, (2,)),
        ("b", 0, 10, (3,)),
    ]
    for batch in batches:
        ends = [r.end for r in batch.requests]
        starts = [r.start for r in batch.requests]
        assert all(e <= s for e, s in zip(ends, starts[1:]))


@pytest.mark.parametrize("max_batch", [1, 150, 1 << 20])
def test_read_batches_respect_max_size(max_batch: int) -> None:
    requests = [RangeRequest("x", i * 100, i * 100 + 100, i) for i in range(50)]
    batches = plan_read_batches(requests, max_batch_bytes=max_batch, max_gap_bytes=0)
    assert sorted(t for b in batches for t in (r.tag for r in b.requests)) == list(range(50))
    for batch in batches:
        assert batch.nbytes <= max(max_batch, 100)


def test_no_requests_no_reads() -> None:
    assert plan_read_batches([], max_batch_bytes=1) == []


def test_a_request_larger_than_the_bound_is_read_alone() -> None:
    requests = [RangeRequest("a", 0, 10, 0), RangeRequest("a", 10, 1000, 1), RangeRequest("a", 1000, 1010, 2)]
    batches = plan_read_batches(requests, max_batch_bytes=100, max_gap_bytes=0)
    assert batches == [
        ReadBatch("a", 0, 10, (requests[0],)),
        ReadBatch("a", 10, 1000, (requests[1],)),
        ReadBatch("a", 1000, 1010, (requests[2],)),
    ]


def test_adjacent_and_empty_requests() -> None:
    requests = [RangeRequest("a", 0, 0, 0), RangeRequest("a", 0, 8, 1), RangeRequest("a", 8, 8, 2)]
    (batch,) = plan_read_batches(requests, max_batch_bytes=8, max_gap_bytes=0)
    assert (batch.start, batch.end, [r.tag for r in batch.requests]) == (0, 8, [0, 1, 2])


def test_the_size_bound_is_inclusive() -> None:
    requests = [RangeRequest("a", 0, 5, 0), RangeRequest("a", 5, 10, 1)]
    assert len(plan_read_batches(requests, max_batch_bytes=10, max_gap_bytes=0)) == 1
    assert len(plan_read_batches(requests, max_batch_bytes=9, max_gap_bytes=0)) == 2


def test_the_gap_bound_is_inclusive() -> None:
    requests = [RangeRequest("a", 0, 10, 0), RangeRequest("a", 20, 30, 1), RangeRequest("a", 41, 50, 2)]
    batches = plan_read_batches(requests, max_batch_bytes=1000, max_gap_bytes=10)
    assert [[r.tag for r in b.requests] for b in batches] == [[0, 1], [2]]


@st.composite
def requests_lists(draw: st.DrawFn) -> list[RangeRequest]:
    """Runs of requests on a few objects, mostly one after another with small gaps (so they merge
    and reach the bounds), some wanted twice (overlapping)."""
    requests: list[RangeRequest] = []
    for location in draw(st.lists(st.sampled_from("abc"), max_size=3, unique=True)):
        end = 0
        for gap, size in draw(st.lists(st.tuples(st.integers(0, 12), st.integers(0, 30)), max_size=15)):
            requests.append(RangeRequest(location, end + gap, end + gap + size, len(requests)))
            end += gap + size
    for again in draw(st.lists(st.sampled_from(requests), max_size=3)) if requests else []:
        requests.append(again._replace(tag=len(requests)))
    return requests


@FAST
@given(requests=requests_lists(), max_gap_bytes=st.integers(0, 30), data=st.data())
def test_every_request_is_served_by_one_bounded_batch(
    requests: list[RangeRequest], max_gap_bytes: int, data: st.DataObject
) -> None:
    # a bound near what merging two of the requests would read, half the time: the edge cases
    merged = {b.end - a.start for a in requests for b in requests if a.location == b.location and b.end > a.start}
    near = [size + delta for size in merged for delta in (-1, 0) if size + delta > 0]
    max_batch_bytes = data.draw(st.integers(1, 150) | (st.sampled_from(sorted(near)) if near else st.nothing()))
    batches = plan_read_batches(requests, max_batch_bytes=max_batch_bytes, max_gap_bytes=max_gap_bytes)
    served = [r for batch in batches for r in batch.requests]
    assert sorted(r.tag for r in served) == [r.tag for r in requests]  # each exactly once
    for batch in batches:
        assert batch.requests
        first, last = batch.requests[0], batch.requests[-1]
        assert (batch.start, batch.end) == (first.start, last.end)
        assert batch.nbytes == batch.end - batch.start
        # within the bound, unless a single request is larger than it
        assert batch.nbytes <= max_batch_bytes or len(batch.requests) == 1
        for before, after in itertools.pairwise(batch.requests):
            assert after.location == batch.location
            # sorted, disjoint (each request its own bytes of the read), gaps within the bound
            assert before.end <= after.start <= before.end + max_gap_bytes
        for request in batch.requests:
            assert batch.start <= request.start <= request.end <= batch.end
    for before, after in itertools.pairwise(batches):
        first = after.requests[0]
        if after.location == before.location and before.end <= first.start <= before.end + max_gap_bytes:
            # close enough and not overlapping: split only because the merged read was too large
            assert first.end - before.start > max_batch_bytes


@FAST
@given(requests=requests_lists(), max_batch_bytes=st.integers(1, 150), rng=st.randoms(use_true_random=False))
def test_batches_do_not_depend_on_request_order(
    requests: list[RangeRequest], max_batch_bytes: int, rng: random.Random
) -> None:
    shuffled = list(requests)
    rng.shuffle(shuffled)
    assert plan_read_batches(shuffled, max_batch_bytes=max_batch_bytes) == plan_read_batches(
        requests, max_batch_bytes=max_batch_bytes
    )
