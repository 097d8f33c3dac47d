"""Read-ahead hints of a restore (snapshotkit._restore.prefetch): what is hinted, and that a hint changes nothing."""

from __future__ import annotations

import itertools
import types
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import snapshotkit
from snapshotkit._restore.columns import column_rank_view
from snapshotkit._restore.prefetch import prefetch_ranges
from snapshotkit.errors import ChecksumMismatchError
from snapshotkit.storage import ByteRange
from snapshotkit.storage._fs import FSStoragePlugin


def _state(n: int, seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {f"t{i}": torch.rand(64 + i, generator=g) for i in range(n)}


def _take(tmp_path: Path) -> tuple[str, dict[str, dict[str, torch.Tensor]]]:
    state = {"a": _state(30, 1), "b": _state(20, 2)}
    path = str(tmp_path / "snap")
    snapshotkit.Snapshot.take(path, {k: snapshotkit.StateDict(v) for k, v in state.items()})
    return path, state


def _piece_bytes(path: str, key: str) -> list[tuple[str, int, int]]:
    manifest = snapshotkit.Snapshot(path).get_manifest()
    return [
        (p.location, *p.byte_range)
        for name, entry in manifest.items()
        if name.startswith(f"0/{key}/")
        for p in entry.pieces  # type: ignore[attr-defined]
    ]


def test_the_hint_covers_the_restored_keys_pieces_and_no_other_key(tmp_path: Path) -> None:
    path, _ = _take(tmp_path)
    view = column_rank_view(snapshotkit.Snapshot(path).metadata, 0)
    assert view is not None
    ranges = prefetch_ranges(view, ["a"], 1 << 40)
    for location, start, end in _piece_bytes(path, "a"):
        assert any(r.location == location and r.byte_range.start <= start and end <= r.byte_range.end for r in ranges)
    hinted = sum(r.byte_range.length for r in ranges)
    assert hinted < sum(end - start for _, start, end in _piece_bytes(path, "a") + _piece_bytes(path, "b"))


def test_the_hint_stops_at_the_budget(tmp_path: Path) -> None:
    path, _ = _take(tmp_path)
    view = column_rank_view(snapshotkit.Snapshot(path).metadata, 0)
    assert view is not None
    ranges = prefetch_ranges(view, ["a", "b"], 1000)
    assert sum(r.byte_range.length for r in ranges) == 1000
    assert prefetch_ranges(view, None, 1000) == ranges  # None: every tensor of the view
    assert prefetch_ranges(view, ["a"], 0) == []


def test_restore_hints_the_plugin_then_reads_and_verifies_as_before(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path, state = _take(tmp_path)
    hints: list[tuple[str, ByteRange]] = []

    async def record(self: FSStoragePlugin, location: str, byte_range: ByteRange) -> None:
        hints.append((location, byte_range))

    monkeypatch.setattr(FSStoragePlugin, "prefetch", record)
    out = {k: {n: torch.empty_like(t) for n, t in v.items()} for k, v in state.items()}
    snapshotkit.Snapshot(path).restore({"a": snapshotkit.StateDict(out["a"])})
    assert hints
    assert all(torch.equal(out["a"][n], t) for n, t in state["a"].items())


def test_a_failing_hint_does_not_fail_the_restore(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path, state = _take(tmp_path)

    async def fail(self: FSStoragePlugin, location: str, byte_range: ByteRange) -> None:
        raise OSError("no read-ahead here")

    monkeypatch.setattr(FSStoragePlugin, "prefetch", fail)
    out = {n: torch.empty_like(t) for n, t in state["b"].items()}
    snapshotkit.Snapshot(path).restore({"b": snapshotkit.StateDict(out)})
    assert all(torch.equal(out[n], t) for n, t in state["b"].items())


def test_a_damaged_byte_still_fails_with_the_hint(tmp_path: Path) -> None:
    path, state = _take(tmp_path)
    location, start, _ = _piece_bytes(path, "a")[3]
    with open(Path(path) / location, "r+b") as f:
        f.seek(start + 5)
        byte = f.read(1)
        f.seek(start + 5)
        f.write(bytes([byte[0] ^ 0xFF]))
    out = {n: torch.empty_like(t) for n, t in state["a"].items()}
    with pytest.raises(ChecksumMismatchError, match="a/"):
        snapshotkit.Snapshot(path).restore({"a": snapshotkit.StateDict(out)})


_piece = st.tuples(st.integers(0, 2), st.integers(0, 20_000), st.integers(0, 6_000), st.booleans())


@settings(max_examples=150, deadline=None)
@given(
    entries=st.lists(st.tuples(st.sampled_from(["a", "b"]), st.lists(_piece, min_size=1, max_size=3)), max_size=12),
    budget=st.integers(0, 60_000),
)
def test_hinted_ranges_cover_the_wanted_pieces_in_read_order_up_to_the_budget(
    entries: list[tuple[str, list[tuple[int, int, int, bool]]]], budget: int
) -> None:
    offsets, location, start, length, base = [0], [], [], [], []
    for _, pieces in entries:
        for loc, s, n, other in pieces:
            location.append(loc)
            start.append(s)
            length.append(n)
            base.append(1 if other else 0)
        offsets.append(len(location))
    columns = types.SimpleNamespace(
        piece_offsets=np.array(offsets, dtype=np.int64),
        location=np.array(location, dtype=np.int64),
        start=np.array(start, dtype=np.int64),
        length=np.array(length, dtype=np.int64),
        base=np.array(base, dtype=np.int64),
        locations=["x0", "x1", "x2"],
    )
    view = types.SimpleNamespace(columns=columns, slots={f"{key}/{i}": i for i, (key, _) in enumerate(entries)})
    ranges = prefetch_ranges(view, ["a"], budget)  # type: ignore[arg-type]
    wanted = sorted(
        (loc, s, s + n) for key, pieces in entries if key == "a" for loc, s, n, other in pieces if not other and n > 0
    )
    total = sum(n for _, s, n in ((loc, s, e - s) for loc, s, e in wanted))
    assert sum(r.byte_range.length for r in ranges) <= budget
    keys = [(int(r.location[1:]), r.byte_range.start) for r in ranges]
    assert keys == sorted(keys)  # the order the reads come in
    for a, b in itertools.pairwise(ranges):  # no byte hinted twice
        assert a.location != b.location or a.byte_range.end < b.byte_range.start
    covered = 0
    for loc, s, e in wanted:  # every wanted byte is hinted, until the budget runs out
        inside = [r for r in ranges if r.location == f"x{loc}" and r.byte_range.start <= s < r.byte_range.end]
        if inside:
            covered += 1
            if budget >= total + 20 * 4096 * len(wanted):
                assert e <= inside[0].byte_range.end
    if budget >= total + 20 * 4096 * len(wanted):
        assert covered == len(wanted)
    for r in ranges:  # nothing hinted that no wanted piece touches
        assert any(f"x{loc}" == r.location and s < r.byte_range.end and r.byte_range.start < e for loc, s, e in wanted)


def test_an_incremental_restore_hints_only_its_own_objects(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    state = _state(10, 3)
    snapshotkit.Snapshot.take(str(tmp_path / "s1"), {"a": snapshotkit.StateDict(state)})
    changed = dict(state, t0=state["t0"] + 1)
    snapshotkit.Snapshot.take(str(tmp_path / "s2"), {"a": snapshotkit.StateDict(changed)}, base=str(tmp_path / "s1"))
    hints: list[tuple[str, str]] = []

    async def record(self: FSStoragePlugin, location: str, byte_range: ByteRange) -> None:
        hints.append((str(self.root), location))

    monkeypatch.setattr(FSStoragePlugin, "prefetch", record)
    out = {n: torch.empty_like(t) for n, t in changed.items()}
    snapshotkit.Snapshot(str(tmp_path / "s2")).restore({"a": snapshotkit.StateDict(out)})
    assert all(torch.equal(out[n], t) for n, t in changed.items())
    assert hints
    assert {root for root, _ in hints} == {str(tmp_path / "s2")}
    assert all(not location.startswith("..") for _, location in hints)
