"""The process's staging budget and the buffer pools it charges (``_runtime/staging.py``)."""

from __future__ import annotations

import gc
import threading

import pytest

from snapshotkit._runtime.staging import BufferPool, StagingBudget

MIB = 1 << 20


class Buffer:
    """A stand-in buffer with a size (what pools hold: tensors and segments have one too)."""

    def __init__(self, size: int) -> None:
        self.size = size


def test_reservations_of_every_caller_share_the_budget() -> None:
    budget = StagingBudget()
    budget.take(3 * MIB, 4 * MIB)
    assert not budget.try_take(2 * MIB, 4 * MIB)  # another take's staging: 3 + 2 > 4
    other = threading.Thread(target=budget.take, args=(2 * MIB, 4 * MIB))
    other.start()
    assert budget.wait_for_waiting(1, timeout_s=30)
    budget.give(3 * MIB)
    other.join()
    assert budget.reserved_bytes == 2 * MIB
    assert budget.peak_held_bytes == 3 * MIB


def test_a_reservation_larger_than_the_budget_waits_for_the_others_then_runs_alone() -> None:
    budget = StagingBudget()
    budget.take(MIB, 2 * MIB)
    waiting = threading.Thread(target=budget.take, args=(8 * MIB, 2 * MIB))
    waiting.start()
    assert budget.wait_for_waiting(1, timeout_s=30)
    budget.give(MIB)
    waiting.join()
    assert budget.reserved_bytes == 8 * MIB
    assert not budget.try_take(1, 2 * MIB)  # nothing else while it runs
    budget.give(8 * MIB)
    assert budget.try_take(1, 2 * MIB)


def test_a_free_buffer_stays_charged_and_the_next_reservation_of_its_size_claims_it() -> None:
    budget = StagingBudget()
    pool = BufferPool(budget)
    budget.take(MIB, 4 * MIB, pool)
    assert pool.get(MIB) is None  # nothing free: the writer makes one
    buffer = Buffer(MIB)
    pool.add(buffer)
    pool.put(MIB, buffer)
    budget.give(MIB)
    assert (budget.reserved_bytes, budget.pooled_bytes) == (0, MIB)
    budget.take(MIB, 4 * MIB, pool)
    assert (budget.reserved_bytes, budget.pooled_bytes) == (MIB, 0)
    assert pool.get(MIB) is buffer
    assert budget.peak_held_bytes == MIB


def test_free_buffers_are_evicted_to_make_room_and_a_pool_never_keeps_more_than_the_budget() -> None:
    budget = StagingBudget()
    budget.resize(4 * MIB)
    discarded: list[Buffer] = []
    pool = BufferPool(budget, discarded.append)
    assert pool.preallocate({MIB: 4}, Buffer) == 4 * MIB
    budget.take(2 * MIB, 4 * MIB, pool)  # no free 2 MiB buffer: two 1 MiB ones make room
    assert len(discarded) == 2
    assert budget.held_bytes == 4 * MIB
    big = Buffer(2 * MIB)
    pool.add(big)
    budget.resize(3 * MIB)  # a smaller budget: one more free buffer goes
    assert len(discarded) == 3
    pool.put(2 * MIB, big)  # 2 reserved + 1 pooled = 3: it fits
    budget.give(2 * MIB)
    assert big not in discarded
    budget.resize(2 * MIB)
    assert budget.held_bytes <= 2 * MIB
    assert pool.allocated_bytes == budget.pooled_bytes <= 2 * MIB


def test_a_buffer_that_does_not_fit_any_more_is_freed_when_given_back() -> None:
    budget = StagingBudget()
    discarded: list[Buffer] = []
    pool = BufferPool(budget, discarded.append)
    budget.take(8 * MIB, 2 * MIB, pool)  # larger than the budget: runs alone
    buffer = Buffer(8 * MIB)
    pool.add(buffer)
    pool.put(8 * MIB, buffer)
    budget.give(8 * MIB)
    assert discarded == [buffer]
    assert pool.allocated == [] and budget.held_bytes == 0


def test_preallocating_stops_at_the_budget_and_leaves_reserved_bytes_alone() -> None:
    budget = StagingBudget()
    budget.resize(4 * MIB)
    pool = BufferPool(budget)
    budget.take(MIB, 4 * MIB)  # another take's staging holds 1 MiB
    assert pool.preallocate({MIB: 8}, Buffer) == 3 * MIB
    assert pool.preallocate({16 * MIB: 1}, Buffer) == 0  # larger than the budget: never pooled
    assert budget.held_bytes == 4 * MIB


def test_a_pool_dropped_without_closing_gives_its_free_bytes_back() -> None:
    budget = StagingBudget()
    budget.resize(4 * MIB)
    pool = BufferPool(budget)
    pool.preallocate({MIB: 2}, Buffer)
    assert budget.pooled_bytes == 2 * MIB
    del pool
    gc.collect()
    assert budget.pooled_bytes == 0


def test_closing_a_pool_uncharges_it_and_returns_every_buffer() -> None:
    budget = StagingBudget()
    budget.resize(4 * MIB)
    discarded: list[Buffer] = []
    pool = BufferPool(budget, discarded.append)
    pool.preallocate({MIB: 1}, Buffer)
    budget.take(2 * MIB, 4 * MIB, pool)
    in_use = Buffer(2 * MIB)
    pool.add(in_use)
    assert len(pool.close()) == 2
    assert budget.pooled_bytes == 0
    pool.put(2 * MIB, in_use)  # given back after the close: freed, not kept
    budget.give(2 * MIB)
    assert discarded == [in_use] and budget.held_bytes == 0


def test_the_budget_must_be_positive() -> None:
    with pytest.raises(ValueError, match="positive"):
        StagingBudget().resize(0)


def test_a_smaller_budget_evicts_what_the_last_take_pooled_even_when_a_buffer_is_reused() -> None:
    budget = StagingBudget()
    budget.resize(8 * MIB)
    pool = BufferPool(budget)
    pool.preallocate({MIB: 8}, Buffer)
    budget.take(MIB, 2 * MIB, pool)  # claims a free 1 MiB buffer; the rest no longer fits
    assert pool.get(MIB) is not None
    assert budget.held_bytes <= 2 * MIB
    assert budget.peak_held_bytes == 8 * MIB  # what the earlier, larger budget held
