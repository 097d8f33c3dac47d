"""Copies of one rank's local snapshot to another rank (``_tier/transfer.py``), on real gloo ranks.

Four ranks play two nodes (ranks 0-1 and 2-3), each node a root directory of its own: every rank
snapshots its own state under its node's root, replicates it to the rank two further on, and a
node that lost its root is served back. A damaged or missing source, a small chunk size and a
peer lost midway are checked on both sides.
"""

from __future__ import annotations

import itertools
import os
import shutil
import time
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from multirank._harness import run_ranks

from snapshotkit import Snapshot, StateDict
from snapshotkit._dist import Group, own_process_group
from snapshotkit._tier import receive as receive_module
from snapshotkit._tier import transfer as transfer_module
from snapshotkit._tier.transfer import Transfer, TransferOutcome, is_incoming, send_and_receive
from snapshotkit.errors import CollectiveTimeoutError, ConfigError, InvalidArgumentError, RankFailedError

STEP = 1
WORLD = 4
#: How long each wait for a peer may last in these tests (a lost peer is seen well before).
TIMEOUT_S = 20.0


def _root(base: str, rank: int) -> Path:
    """The local root of ``rank``'s node: two ranks per node."""
    return Path(base, f"node{rank // 2}")


def _copy(base: str, step: int, owner: int, holder: int) -> Path:
    return _root(base, holder) / f"step_{step}" / f"rank_{owner}"


def _source(base: str) -> Any:
    return lambda t: _copy(base, t.step, t.owner, t.sender)


def _target(base: str) -> Any:
    return lambda t: _copy(base, t.step, t.owner, t.receiver)


def _state(rank: int) -> dict[str, Any]:
    generator = torch.Generator().manual_seed(rank)
    return {
        "w": torch.rand(40, 30, generator=generator),  # 4,800 bytes: several chunks of 1,000
        "ids": torch.arange(rank, rank + 100, dtype=torch.int64),
        "note": f"rank {rank}",
    }


def _take_own(base: str, rank: int) -> None:
    Snapshot.take(str(_copy(base, STEP, rank, rank)), {"s": StateDict(_state(rank))}, pg=own_process_group())


def _restores_bit_exact(path: Path, rank: int) -> bool:
    blank = StateDict({"w": torch.zeros(40, 30), "ids": torch.zeros(100, dtype=torch.int64), "note": ""})
    Snapshot(str(path), pg=own_process_group()).restore({"s": blank})
    expected = _state(rank)
    return (
        blank["note"] == expected["note"]
        and all(blank[k].dtype == expected[k].dtype for k in ("w", "ids"))
        and all(torch.equal(blank[k].view(torch.uint8), expected[k].view(torch.uint8)) for k in ("w", "ids"))
    )


def _summary(outcomes: list[TransferOutcome]) -> list[tuple[Transfer, bool, str]]:
    return [(o.transfer, o.ok, o.reason) for o in outcomes]


# ------------------------------------------------------------------ replicate, lose a node, serve back


def _replicate_and_serve(rank: int, world: int, base: str, chunk_bytes: int) -> dict[str, Any]:
    _take_own(base, rank)
    pg = dist.new_group(backend="gloo")
    kwargs: dict[str, Any] = {"chunk_bytes": chunk_bytes, "timeout_s": TIMEOUT_S}
    replicate = [Transfer(STEP, r, r, (r + 2) % world) for r in range(world)]
    replicated = send_and_receive(pg, rank, replicate, _source(base), _target(base), **kwargs)
    again = send_and_receive(pg, rank, replicate, _source(base), _target(base), **kwargs)  # targets held
    dist.barrier(group=pg)
    if rank == 0:
        shutil.rmtree(_root(base, 2))  # node 1 (ranks 2, 3) lost its local root
    dist.barrier(group=pg)
    serve = [Transfer(STEP, r, (r + 2) % world, r) for r in (2, 3)]
    served = send_and_receive(pg, rank, serve, _source(base), _target(base), **kwargs)
    return {
        "replicated": _summary(replicated),
        "again": _summary(again),
        "served": _summary(served),
        "own": _restores_bit_exact(_copy(base, STEP, rank, rank), rank),
        # node 0 still holds node 1's replicas (node 1's replicas of node 0 went with its root)
        "replica": rank >= 2 or _restores_bit_exact(_copy(base, STEP, (rank + 2) % world, rank), (rank + 2) % world),
    }


@pytest.mark.slow
@pytest.mark.timeout(180)
@pytest.mark.parametrize("chunk_bytes", [16 << 20, 1000])
def test_replicas_go_to_the_other_node_and_serve_a_lost_one_back_bit_exact(tmp_path: Path, chunk_bytes: int) -> None:
    results = run_ranks(WORLD, _replicate_and_serve, str(tmp_path), chunk_bytes)
    sizes = [p.stat().st_size for p in _copy(str(tmp_path), STEP, 0, 0).rglob("*") if p.is_file()]
    assert chunk_bytes > max(sizes) or max(sizes) > 3 * chunk_bytes  # the small chunk cuts files in several
    replicate = [Transfer(STEP, r, r, (r + 2) % WORLD) for r in range(WORLD)]
    serve = [Transfer(STEP, r, (r + 2) % WORLD, r) for r in (2, 3)]
    for rank, result in enumerate(results):
        mine = [(t, True, "") for t in replicate if rank in (t.sender, t.receiver)]
        assert result["replicated"] == result["again"] == mine
        assert result["served"] == [(t, True, "") for t in serve if rank in (t.sender, t.receiver)]
        assert result["own"] and result["replica"], rank
    assert not [p for p in tmp_path.rglob("*") if is_incoming(p.name)]


# ------------------------------------------------------------------ a damaged or missing source


def _damaged_and_missing(rank: int, world: int, base: str) -> list[tuple[Transfer, bool, str]]:
    _take_own(base, rank)
    if rank == 0:  # one flipped byte in a data object of the copy it sends
        data = sorted(_copy(base, STEP, 0, 0).joinpath("data").iterdir())[0]
        raw = bytearray(data.read_bytes())
        raw[0] ^= 0x01
        data.write_bytes(raw)
    pg = dist.new_group(backend="gloo")
    transfers = [
        Transfer(STEP, 0, 0, 2),  # damaged
        Transfer(STEP + 6, 1, 1, 3),  # no such step
        Transfer(STEP, 3, 3, 1),  # intact, after the failures
    ]
    return _summary(send_and_receive(pg, rank, transfers, _source(base), _target(base), timeout_s=TIMEOUT_S))


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_damaged_copy_and_a_missing_source_fail_without_a_target_and_the_round_goes_on(tmp_path: Path) -> None:
    results = run_ranks(WORLD, _damaged_and_missing, str(tmp_path))
    damaged = results[2][0]
    assert results[0] == [damaged]
    assert not damaged[1] and "verification" in damaged[2] and "checksum" in damaged[2], damaged
    missing = results[3][0]
    assert results[1][0] == missing
    assert not missing[1] and "no snapshot" in missing[2], missing
    assert results[1][1] == results[3][1] == (Transfer(STEP, 3, 3, 1), True, "")
    node1 = _root(str(tmp_path), 2)
    assert sorted(p.name for p in node1.iterdir()) == [f"step_{STEP}"]  # nothing of step 7
    assert sorted(p.name for p in (node1 / f"step_{STEP}").iterdir()) == ["rank_2", "rank_3"]


def _flipped_in_transit(rank: int, world: int, base: str) -> list[tuple[Transfer, bool, str]]:
    _take_own(base, rank)
    pg = dist.new_group(backend="gloo")  # every rank's snapshot is taken
    if rank == 2:  # one bit of the first data chunk flips between the sender's disk and the receiver's
        manifest_chunks = -(-(_copy(base, STEP, 0, 0) / ".snapshot_metadata").stat().st_size // 1024)
        original = Group.receive_from
        body = itertools.count()

        def flipping(self: Group, tensor: Any, peer: int, what: str) -> None:
            original(self, tensor, peer, what)
            if tensor.untyped_storage().nbytes() == 1024 and next(body) == manifest_chunks:
                tensor[0] ^= 0x10

        Group.receive_from = flipping  # type: ignore[method-assign]  # in this rank's process only
    transfers = [Transfer(STEP, 0, 0, 2), Transfer(STEP, 1, 1, 3)]
    outcomes = send_and_receive(
        pg, rank, transfers, _source(base), _target(base), chunk_bytes=1024, timeout_s=TIMEOUT_S
    )
    return _summary(outcomes)


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_chunk_damaged_in_transit_is_caught_on_arrival_and_no_copy_is_placed(tmp_path: Path) -> None:
    results = run_ranks(WORLD, _flipped_in_transit, str(tmp_path))
    damaged = results[2][0]
    assert results[0] == [damaged]
    assert damaged[0] == Transfer(STEP, 0, 0, 2)
    assert not damaged[1] and "verification" in damaged[2] and "checksum mismatch" in damaged[2], damaged
    assert results[1] == results[3] == [(Transfer(STEP, 1, 1, 3), True, "")]
    step_dir = _root(str(tmp_path), 2) / f"step_{STEP}"
    assert sorted(p.name for p in step_dir.iterdir()) == ["rank_1", "rank_2", "rank_3"]  # no rank_0, no incoming


# ------------------------------------------------------------------ a peer lost midway


def _lost_midway(rank: int, world: int, base: str, dying: int) -> dict[str, Any]:
    _take_own(base, rank)
    pg = dist.new_group(backend="gloo")
    if rank == dying:
        # Gone after its 3rd message of the transfer (header length, header, first 512-byte
        # chunk): no exception, no clean-up, its sockets closed by the kernel, as for kill -9
        # (a non-zero exit would make the harness stop the surviving ranks too).
        method = "send_to" if dying == 0 else "receive_from"
        original = getattr(Group, method)
        calls = itertools.count(1)

        def dying_call(self: Group, tensor: Any, peer: int, what: str) -> None:
            if next(calls) == 4:
                os._exit(0)
            original(self, tensor, peer, what)

        setattr(Group, method, dying_call)  # in this rank's process only
    start = time.monotonic()
    try:
        send_and_receive(
            pg, rank, [Transfer(STEP, 0, 0, 2)], _source(base), _target(base), chunk_bytes=512, timeout_s=TIMEOUT_S
        )
    except (RankFailedError, CollectiveTimeoutError) as exc:
        return {"error": type(exc).__name__, "seconds": time.monotonic() - start}
    return {"error": None}


@pytest.mark.slow
@pytest.mark.timeout(120)
@pytest.mark.parametrize("dying", [0, 2], ids=["sender", "receiver"])
def test_a_peer_lost_midway_raises_our_error_and_leaves_no_target(tmp_path: Path, dying: int) -> None:
    results = run_ranks(WORLD, _lost_midway, str(tmp_path), dying, missing_ok=True)
    assert results[dying] is None
    survivor = 2 if dying == 0 else 0
    assert results[survivor]["error"] in ("RankFailedError", "CollectiveTimeoutError"), results
    assert results[survivor]["seconds"] < TIMEOUT_S + 5
    assert all(results[r] == {"error": None} for r in (1, 3))
    step_dir = _copy(str(tmp_path), STEP, 0, 2).parent
    left = sorted(p.name for p in step_dir.iterdir())
    incoming = [name for name in left if is_incoming(name)]
    assert [name for name in left if name not in incoming] == ["rank_2", "rank_3"]  # no rank_0
    if dying == 0:  # the surviving receiver removed its incoming copy
        assert incoming == []
    else:  # the receiver died with its incoming copy, which the clean-up recognizes
        assert len(incoming) == 1 and incoming[0].startswith("rank_0.incoming-")


def _peer_never_comes(rank: int, world: int, base: str) -> Any:
    pg = dist.new_group(backend="gloo")
    store = dist.distributed_c10d._get_default_store()
    if rank != 2:  # rank 0 stays alive but never sends: it waits until rank 2 gave up
        store.wait(["gave-up"])
        return "absent"
    start = time.monotonic()
    try:
        send_and_receive(pg, rank, [Transfer(STEP, 0, 0, 2)], _source(base), _target(base), timeout_s=1.0)
    except CollectiveTimeoutError as exc:
        return ("timed out", time.monotonic() - start) if "waited 1 s for rank 0" in str(exc) else str(exc)
    finally:
        store.set("gave-up", "1")
    return "no error"


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_peer_that_never_comes_makes_the_other_time_out_with_our_error(tmp_path: Path) -> None:
    results = run_ranks(WORLD, _peer_never_comes, str(tmp_path))
    assert [results[r] for r in (0, 1, 3)] == ["absent"] * 3
    assert results[2][0] == "timed out" and 1.0 <= results[2][1] < 10, results
    assert not list(tmp_path.iterdir())


# ------------------------------------------------------------------ without ranks


def test_is_incoming_recognizes_only_incoming_copies() -> None:
    assert is_incoming("rank_3.incoming-0123456789abcdef")
    for name in ("rank_3", "rank_3.incoming-", "rank_3.incoming-0123", ".incoming-0123456789abcdef", "step_1"):
        assert not is_incoming(name), name


def test_arguments_are_checked_before_anything_is_sent(tmp_path: Path) -> None:
    def where(t: Transfer) -> Path:
        return tmp_path / "x"

    with pytest.raises(ConfigError, match="same rank"):
        send_and_receive(None, 0, [Transfer(1, 0, 0, 0)], where, where, timeout_s=1)
    with pytest.raises(ConfigError, match="outside"):
        send_and_receive(None, 0, [Transfer(1, 0, 0, 1)], where, where, timeout_s=1)
    with pytest.raises(ConfigError, match="rank is 1"):
        send_and_receive(None, 1, [], where, where, timeout_s=1)
    with pytest.raises(ConfigError, match="chunk_bytes"):
        send_and_receive(None, 0, [], where, where, chunk_bytes=0, timeout_s=1)
    with pytest.raises(ConfigError, match="timeout_s"):
        send_and_receive(None, 0, [], where, where, timeout_s=float("inf"))
    with pytest.raises(InvalidArgumentError, match="Transfer"):
        send_and_receive(None, 0, [(1, 0, 0, 1)], where, where, timeout_s=1)  # type: ignore[list-item]
    assert send_and_receive(None, 0, [], where, where, timeout_s=1) == []
    assert not (tmp_path / "x").exists()


@pytest.mark.parametrize(
    "files",
    [
        [["/etc/passwd", 1]],
        [["../step_2/x", 1]],
        [["data/../../x", 1]],
        [["data//x", 1]],
        [["./x", 1]],
        [["data\\x", 1]],
        [["x", -1]],
        [["x", True]],
        [["x", 1], ["x", 1]],
        [["x"]],
        "x",
        [],  # no manifest
        [["data/x", 1], [".snapshot_metadata", 3]],  # the manifest not first: nothing to check the data against
    ],
)
def test_a_file_list_that_could_leave_the_copy_is_refused(files: object) -> None:
    accepted, reason = receive_module.checked_files(files)
    assert accepted == [] and "nothing was written" in reason


def test_a_plain_file_list_is_accepted() -> None:
    files = [[".snapshot_metadata", 3], ["data/0_00000_ab", 10]]
    assert receive_module.checked_files(files) == ([(".snapshot_metadata", 3), ("data/0_00000_ab", 10)], "")


def test_a_snapshot_holding_a_symlink_is_not_sent(tmp_path: Path) -> None:
    source = tmp_path / "snap"
    Snapshot.take(str(source), {"s": StateDict({"x": torch.ones(3)})})
    files, reason = transfer_module._listing(source)
    assert files[0][0] == ".snapshot_metadata" and not reason  # first: the receiver checks the rest against it
    (source / "data" / "link").symlink_to(tmp_path)
    files, reason = transfer_module._listing(source)
    assert files == [] and f"holds {source / 'data' / 'link'}, which is not a regular file" in reason
