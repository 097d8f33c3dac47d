"""Agreeing on a preemption notice through a real ``torch.distributed`` store (``HashStore``,
``TCPStore``), one thread per rank: the round's answer, its schedule, its keys, its failures."""

from __future__ import annotations

import concurrent.futures
import dataclasses
import datetime
import gc
from collections.abc import Callable
from typing import Any, TypeVar

import pytest
import torch.distributed as dist

from snapshotkit._dist import Group
from snapshotkit._lifecycle.preemption import NoticeAgreement, PreemptionWatcher
from snapshotkit.errors import CollectiveTimeoutError, RankFailedError

T = TypeVar("T")


def on_ranks(world: int, work: Callable[[int], T]) -> list[T]:
    """``[work(rank) for each rank]``, every rank on its own thread at the same time."""
    with concurrent.futures.ThreadPoolExecutor(world) as pool:
        return list(pool.map(work, range(world)))


@pytest.mark.parametrize("world", [2, 3, 5])
def test_any_rank_flag_is_every_rank_answer_and_no_key_is_left(world: int) -> None:
    store = dist.HashStore()
    groups = [Group(rank, world, None, 10.0) for rank in range(world)]
    rounds = [[False] * world, [False] * (world - 1) + [True], [True] + [False] * (world - 1), [True] * world]
    for index, flags in enumerate(rounds):
        answers = on_ranks(
            world, lambda r, f=flags, i=index: groups[r].any_through_store(f[r], f"k/{i}", "testing", store)
        )
        assert answers == [any(flags)] * world
        assert store.num_keys() == 0  # the last rank done deleted the round's keys
    assert [(g.store_rounds, g.collectives) for g in groups] == [(len(rounds), 0)] * world


def test_one_rank_is_its_own_answer_without_a_store() -> None:
    group = Group(0, 1)
    assert group.any_through_store(True, "k", "testing") is True
    assert group.any_through_store(False, "k", "testing") is False
    assert group.store_rounds == 0


def test_a_rank_that_never_arrives_is_a_timeout_naming_the_step() -> None:
    store = dist.HashStore()
    with pytest.raises(CollectiveTimeoutError) as caught:
        Group(0, 2, None, 0.2).any_through_store(False, "k", "should_save(step=7): agreeing", store)
    message = str(caught.value)
    assert message.startswith("should_save(step=7): agreeing: rank 0 of 2 waited 0.2 s for the other ranks")
    assert "SNAPSHOTKIT_COLLECTIVE_TIMEOUT_SECONDS" in message


def test_a_store_that_went_away_is_a_rank_failure() -> None:
    server = dist.TCPStore("127.0.0.1", 0, 2, True, timeout=datetime.timedelta(seconds=5), wait_for_workers=False)
    client = dist.TCPStore("127.0.0.1", server.port, 2, False, timeout=datetime.timedelta(seconds=5))
    del server  # rank 0, which serves the store, exits
    gc.collect()
    with pytest.raises(RankFailedError, match=r"^should_save\(step=3\): rank 1 of 2 lost the process group's store"):
        Group(1, 2, None, 5.0).any_through_store(True, "k", "should_save(step=3)", client)


def _agreements(world: int, check_every: int, notice: tuple[int, int], calls: int) -> list[dict[str, Any]]:
    """Each rank's ``poll`` answers over ``calls`` calls; ``notice`` = (rank, call) it arrives before."""
    store = dist.HashStore()

    def run(rank: int) -> dict[str, Any]:
        group = Group(rank, world, None, 10.0)
        watcher = PreemptionWatcher(())
        agreement = NoticeAgreement(group, watcher, check_every, "run", store)
        answers = []
        for call in range(calls):
            if (rank, call) == notice:
                watcher.request()
            answers.append(agreement.poll(call + 1))
        return {"first": answers.index(True) if True in answers else None, "rounds": group.store_rounds}

    results = on_ranks(world, run)
    assert store.num_keys() == 0
    return results


@pytest.mark.parametrize(
    ("check_every", "notice_call", "agreed_call", "rounds"),
    [
        (10, 0, 0, 1),  # call 0 is a round: a notice from before the loop is seen at once
        (10, 1, 10, 2),  # just after a round: seen check_every calls later
        (10, 9, 10, 2),  # just before one
        (4, 5, 8, 3),  # rounds at calls 0, 4, 8; none after the agreement
        (1, 6, 6, 7),  # every call
    ],
)
def test_rounds_every_check_every_calls_agree_at_the_same_call(
    check_every: int, notice_call: int, agreed_call: int, rounds: int
) -> None:
    results = _agreements(3, check_every, (2, notice_call), 40)
    assert results == [{"first": agreed_call, "rounds": rounds}] * 3
    assert agreed_call - notice_call < check_every


def test_no_notice_means_one_round_every_check_every_calls() -> None:
    assert _agreements(2, 10, (-1, -1), 100) == [{"first": None, "rounds": 10}] * 2


@dataclasses.dataclass
class _GroupOn(Group):
    """A group whose default store is ``shared`` (a process group's store without the process group)."""

    shared: Any = None

    def store(self) -> Any:
        return self.shared


class _Unclonable(dist.Store):
    """A store written in Python that does not implement ``clone()``."""


def test_rounds_get_a_connection_of_their_own_or_share_one_that_cannot_be_cloned() -> None:
    server = dist.TCPStore("127.0.0.1", 0, 1, True, timeout=datetime.timedelta(seconds=5), wait_for_workers=False)
    own = _GroupOn(0, 2, shared=server).store_connection()
    assert own is not server
    own.set("k", "v")  # the same store, through another connection
    assert server.get("k") == b"v"
    unclonable = _Unclonable()
    assert _GroupOn(0, 2, shared=unclonable).store_connection() is unclonable
