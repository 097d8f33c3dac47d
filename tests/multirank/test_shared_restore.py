"""Replicated state is read once on restore: one rank reads each piece, the others receive it (real gloo ranks).

Each test restores on real ranks and checks the values bit for bit against a fresh copy of the
saved state, and the bytes each rank read from storage (``restore_finished`` events).
"""

from __future__ import annotations

import contextlib
import uuid
from pathlib import Path
from typing import Any

import pytest
import torch

from snapshotkit import Snapshot, StateDict, events
from snapshotkit.errors import ChecksumMismatchError
from snapshotkit.manifest import ObjectEntry, TensorEntry

from ._harness import run_ranks

pytestmark = [pytest.mark.timeout(120), pytest.mark.slow]

BUCKET = "snapshotkit-shared-restore"


def _replicated() -> StateDict:
    """The replicated state, the same on every rank: a tensor of several MiB (broadcast on its
    own), small tensors (packed into one broadcast), a strided destination and a pickled object."""
    torch.manual_seed(0)
    state = StateDict(big=torch.randn(3 << 18), strided=torch.randn(64, 48).t(), blob=set(range(300)))
    state.update({f"s{i}": torch.randn(100 + i) for i in range(20)})
    return state


def _wide() -> StateDict:
    """A second replicated state whose strided tensor (512 KiB) is larger than a small budget."""
    torch.manual_seed(1)
    return StateDict(wide=torch.randn(512, 256).t(), w=torch.randn(1000))


def _clobbered(state: StateDict) -> StateDict:
    """``state`` with every tensor zeroed in place (strided ones stay strided) and objects emptied."""
    for key, value in state.items():
        if isinstance(value, torch.Tensor):
            value.zero_()
        else:
            state[key] = type(value)()
    return state


def _equal(got: StateDict, want: StateDict) -> None:
    assert sorted(got) == sorted(want)
    for key, value in want.items():
        if isinstance(value, torch.Tensor):
            assert torch.equal(got[key], value), key
            assert got[key].stride() == value.stride(), key  # restored in place
        else:
            assert got[key] == value, key


def _take_and_restore(rank: int, world: int, path: str, keys: list[list[str]], kwargs: dict[str, Any]) -> Any:
    states = {"rep": _replicated, "wide": _wide}
    local = StateDict(x=torch.full((1000,), float(rank)))
    Snapshot.take(
        path, {**{k: f() for k, f in states.items()}, "own": local}, replicated=["rep/**", "wide/**"], **kwargs
    )
    mine = keys[rank % len(keys)]
    app_state: dict[str, Any] = {key: _clobbered(states[key]()) for key in mine}
    app_state["own"] = StateDict(x=torch.zeros(1000))
    seen: list[events.Event] = []
    events.subscribe(seen.append)
    Snapshot(path, storage_options=kwargs.get("storage_options")).restore(
        app_state, memory_budget_bytes=kwargs.get("memory_budget_bytes")
    )
    for key in mine:
        _equal(app_state[key], states[key]())
    assert torch.equal(app_state["own"]["x"], local["x"])
    (finished,) = [e for e in seen if e.kind == "restore_finished"]
    return {"read": finished.nbytes, "received": finished.received_bytes}


def _stored_bytes(path: str, storage_options: dict[str, Any] | None = None) -> dict[str, int]:
    """Bytes of the pieces stored for each top-level key (replicated ones once)."""
    out: dict[str, int] = {}
    for name, entry in Snapshot(path, storage_options=storage_options).get_manifest().items():
        key = name.split("/")[1]
        pieces = (
            entry.pieces if isinstance(entry, TensorEntry) else [entry.piece] if isinstance(entry, ObjectEntry) else []
        )
        out[key] = out.get(key, 0) + sum(p.nbytes for p in pieces)
    return out


#: On a local file system with every rank on one host, "auto" does not share (the page cache
#: already reads each byte once): tests of the mechanism on local paths ask for it explicitly.
ALWAYS = {"SNAPSHOTKIT_SHARE_REPLICATED_READS": "1"}


@pytest.mark.parametrize("share", ["1", "0", "auto"])
def test_replicated_state_is_read_once_and_restored_bit_exact(tmp_path: Path, share: str) -> None:
    path = str(tmp_path / "snap")
    world = 3
    results = run_ranks(
        world, _take_and_restore, path, [["rep"]], {}, env={"SNAPSHOTKIT_SHARE_REPLICATED_READS": share}, timeout=60
    )
    stored = _stored_bytes(path)
    read = sum(r["read"] for r in results)
    received = sum(r["received"] for r in results)
    own = stored["own"]  # each rank reads its own 4000 bytes
    if share == "1":
        assert stored["rep"] + own <= read <= 1.1 * stored["rep"] + own + 64  # + one-byte extent probes
        assert received == (world - 1) * stored["rep"]
        assert all(r["received"] > 0 for r in results)  # the pieces are spread over the ranks
    else:
        assert read >= world * stored["rep"] + own
        assert received == 0


def test_s3_reads_the_replicated_state_once(seaweed_s3_endpoint: str) -> None:
    boto3 = pytest.importorskip("boto3")
    client = boto3.client("s3", endpoint_url=seaweed_s3_endpoint)
    with contextlib.suppress(client.exceptions.BucketAlreadyOwnedByYou):
        client.create_bucket(Bucket=BUCKET)
    path = f"s3://{BUCKET}/{uuid.uuid4().hex}"
    options = {"storage_options": {"endpoint_url": seaweed_s3_endpoint}}
    env = {name: value for name, value in __import__("os").environ.items() if name.startswith("AWS_")}
    results = run_ranks(4, _take_and_restore, path, [["rep"]], options, env=env, timeout=90)
    stored = _stored_bytes(path, options["storage_options"])
    read = sum(r["read"] for r in results)
    assert read <= 1.1 * stored["rep"] + stored["own"] + 64
    assert sum(r["received"] for r in results) == 3 * stored["rep"]


def test_budget_smaller_than_a_piece(tmp_path: Path) -> None:
    # 256 KiB: the 3 MiB tensor is broadcast in sub-ranges straight into its destination; the
    # 512 KiB strided one cannot be (its bounce buffer would break the budget) and every rank
    # reads it itself, in budget-sized sub-ranges as without sharing.
    path = str(tmp_path / "snap")
    results = run_ranks(
        2, _take_and_restore, path, [["rep", "wide"]], {"memory_budget_bytes": 256 << 10}, env=ALWAYS, timeout=60
    )
    stored = _stored_bytes(path)
    wide = Snapshot(path).get_manifest()["0/wide/wide"]
    assert isinstance(wide, TensorEntry)
    shared_bytes = stored["rep"] + stored["wide"] - wide.nbytes
    assert sum(r["received"] for r in results) == shared_bytes
    assert sum(r["read"] for r in results) <= 1.1 * shared_bytes + 2 * wide.nbytes + stored["own"] + 64


def test_ranks_wanting_different_keys_share_only_the_common_ones(tmp_path: Path) -> None:
    path = str(tmp_path / "snap")
    keys = [["rep", "wide"], ["rep", "wide"], ["rep"]]  # rank 2 does not restore "wide"
    results = run_ranks(3, _take_and_restore, path, keys, {}, env=ALWAYS, timeout=60)
    stored = _stored_bytes(path)
    assert sum(r["received"] for r in results) == 2 * stored["rep"]
    read = sum(r["read"] for r in results)
    assert 2 * stored["wide"] + stored["rep"] <= read <= 2 * stored["wide"] + 1.1 * stored["rep"] + stored["own"] + 64


def _restore_damaged(rank: int, world: int, path: str) -> tuple[str, str]:
    try:
        Snapshot(path).restore({"rep": _clobbered(_replicated())})
    except Exception as exc:
        return type(exc).__name__, str(exc)
    return "nothing raised", ""


def test_a_damaged_replicated_piece_makes_every_rank_raise(tmp_path: Path) -> None:
    path = tmp_path / "snap"
    run_ranks(3, _take_and_restore, str(path), [["rep"]], {}, timeout=60)
    entry = Snapshot(str(path)).get_manifest()["0/rep/big"]
    assert isinstance(entry, TensorEntry)
    piece = entry.pieces[0]
    data = path / piece.location
    damaged = bytearray(data.read_bytes())
    damaged[piece.byte_range[0] + 1000] ^= 0xFF
    data.write_bytes(bytes(damaged))
    results = run_ranks(3, _restore_damaged, str(path), env=ALWAYS, timeout=60)
    for kind, message in results:
        assert kind == ChecksumMismatchError.__name__
        assert "'rep/big'" in message
    # one rank read the piece and found the damage; the two it would have sent it to say so
    assert sum("read it for the group" in message for _, message in results) == 2, results
