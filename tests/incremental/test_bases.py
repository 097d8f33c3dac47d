"""An incremental snapshot's bases: deleted, replaced, damaged, outside the folder, not snapshots,
chains whose middle snapshot goes away, and crafted manifests whose references try to leave the
folder."""

from __future__ import annotations

import copy
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from _snapshots import assert_nothing_committed, flip_byte, load_manifest_json, write_manifest_json

from snapshotkit import Snapshot, StateDict
from snapshotkit.errors import (
    BaseSnapshotError,
    ChecksumMismatchError,
    ConfigError,
    ManifestError,
    SnapshotNotFoundError,
    UnsafeLocationError,
)
from snapshotkit.verify import verify_snapshot

from ._incremental import CHUNK_BYTES, SMALL_PIECES, assert_bit_exact, pieces, referenced

NUMEL = 4 * CHUNK_BYTES // 4  # float32: four full pieces


@pytest.fixture(autouse=True)
def _small_pieces(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in SMALL_PIECES.items():
        monkeypatch.setenv(name, value)


def make_state() -> dict[str, Any]:
    return {"s": StateDict(big=torch.arange(NUMEL, dtype=torch.float32), small=torch.ones(4), step=1)}


@pytest.fixture
def pair(tmp_path: Path) -> tuple[Path, Path, dict[str, Any]]:
    """A full snapshot ``a`` and ``b`` taken against it (three of big's four pieces referenced)."""
    state = make_state()
    Snapshot.take(str(tmp_path / "a"), state)
    state["s"]["big"][-1] = -1.0
    state["s"]["small"].add_(1)
    state["s"]["step"] = 2
    Snapshot.take(str(tmp_path / "b"), state, base=str(tmp_path / "a"))
    assert referenced(str(tmp_path / "b"), "s/big") == ["../a", "../a", "../a", None]
    return tmp_path / "a", tmp_path / "b", copy.deepcopy(dict(state["s"]))


def restore_errors(b: Path) -> list[BaseSnapshotError]:
    """What restore and read_object of ``s/big`` raise (a BaseSnapshotError, before restore writes)."""
    raised = []
    target = make_state()
    for attempt in (lambda: Snapshot(str(b)).restore(target), lambda: Snapshot(str(b)).read_object("s/big")):
        with pytest.raises(BaseSnapshotError) as info:
            attempt()
        raised.append(info.value)
    assert torch.equal(target["s"]["big"], torch.arange(NUMEL, dtype=torch.float32)), "restore overwrote first"
    return raised


def test_deleted_base(pair: tuple[Path, Path, dict[str, Any]]) -> None:
    a, b, expected = pair
    shutil.rmtree(a)
    for exc in restore_errors(b):
        assert "'../a'" in str(exc) and "'s/big'" in str(exc) and "deleted" in str(exc)
    # what the base does not hold still reads
    assert_bit_exact(Snapshot(str(b)).read_object("s/small"), expected["small"])
    report = verify_snapshot(str(b))
    assert not report.ok
    assert {p.logical_path for p in report.problems} == {"s/big"}
    assert all(p.location.startswith("../a/") and "deleted" in p.message for p in report.problems)


def test_replaced_base(pair: tuple[Path, Path, dict[str, Any]]) -> None:
    a, b, _ = pair
    old_id = Snapshot(str(a)).metadata.snapshot_id
    shutil.rmtree(a)
    new_id = Snapshot.take(str(a), make_state()).metadata.snapshot_id  # the same content, another snapshot
    assert old_id != new_id
    for exc in restore_errors(b):
        assert old_id in str(exc) and new_id in str(exc) and "replaced" in str(exc) and "'s/big'" in str(exc)
    report = verify_snapshot(str(b))
    assert not report.ok and all("replaced" in p.message for p in report.problems)


def test_damaged_base_manifest(pair: tuple[Path, Path, dict[str, Any]]) -> None:
    a, b, _ = pair
    flip_byte(a / ".snapshot_metadata", 200)
    for exc in restore_errors(b):
        assert "'../a'" in str(exc) and "damaged" in str(exc)
    # regression: verify used to read the base's data objects without checking the base, and said ok
    report = verify_snapshot(str(b))
    assert not report.ok
    assert {p.logical_path for p in report.problems} == {"s/big"}
    assert all("damaged" in p.message for p in report.problems)


def test_damaged_base_data_object(pair: tuple[Path, Path, dict[str, Any]]) -> None:
    a, b, _ = pair
    piece = pieces(str(b), "s/big")[1]
    assert piece.base == "../a"
    flip_byte(a / piece.location, piece.byte_range[0] + 7)
    with pytest.raises(ChecksumMismatchError, match="'s/big'"):
        Snapshot(str(b)).read_object("s/big")
    with pytest.raises(ChecksumMismatchError, match="'s/big'"):
        Snapshot(str(b)).restore(make_state())
    report = verify_snapshot(str(b))
    assert [(p.logical_path, p.kind, p.location) for p in report.problems] == [
        ("s/big", "checksum", f"../a/{piece.location}")
    ]


def test_base_outside_the_folder_is_refused_before_writing(tmp_path: Path) -> None:
    Snapshot.take(str(tmp_path / "x" / "a"), make_state())
    target = tmp_path / "y" / "b"
    with pytest.raises(ConfigError, match="folder that holds"):
        Snapshot.take(str(target), make_state(), base=str(tmp_path / "x" / "a"))
    assert_nothing_committed(target)
    # a folder whose name only starts like the target's folder is another folder
    with pytest.raises(ConfigError, match="folder that holds"):
        Snapshot.take(str(tmp_path / "x2" / "b"), make_state(), base=str(tmp_path / "x" / "a"))
    assert_nothing_committed(tmp_path / "x2" / "b")


def test_base_below_the_folder(tmp_path: Path) -> None:
    state = make_state()
    Snapshot.take(str(tmp_path / "old" / "a"), state)
    b = Snapshot.take(str(tmp_path / "b"), state, base=str(tmp_path / "old" / "a"))
    assert referenced(b, "s/big") == ["../old/a"] * 4
    assert_bit_exact(Snapshot(str(tmp_path / "b")).read_object("s"), dict(state["s"]))


@pytest.mark.parametrize("kind", ["missing", "empty folder", "incomplete"])
def test_base_that_is_not_a_snapshot(tmp_path: Path, kind: str) -> None:
    base = tmp_path / "a"
    if kind == "empty folder":
        base.mkdir()
    elif kind == "incomplete":
        Snapshot.take(str(base), make_state())
        (base / ".snapshot_metadata").unlink()
    with pytest.raises(SnapshotNotFoundError):
        Snapshot.take(str(tmp_path / "b"), make_state(), base=str(base))
    assert_nothing_committed(tmp_path / "b")


def test_references_never_chain_and_the_middle_snapshot_can_go(tmp_path: Path) -> None:
    state = {
        "s": StateDict(kept=torch.arange(NUMEL, dtype=torch.float32), moving=torch.zeros(NUMEL, dtype=torch.float32))
    }
    Snapshot.take(str(tmp_path / "a"), state)
    state["s"]["moving"].fill_(1.0)
    b = Snapshot.take(str(tmp_path / "b"), state, base=str(tmp_path / "a"))
    assert referenced(b, "s/kept") == ["../a"] * 4 and referenced(b, "s/moving") == [None] * 4
    state["s"]["moving"].fill_(2.0)  # nothing of b's own bytes is left in c
    expected = copy.deepcopy(dict(state["s"]))
    c = Snapshot.take(str(tmp_path / "c"), state, base=str(tmp_path / "b"))
    assert referenced(c, "s/kept") == ["../a"] * 4  # a's bytes, named directly
    assert referenced(c, "s/moving") == [None] * 4
    assert set(c.metadata.bases) == {"../a"}
    shutil.rmtree(tmp_path / "b")
    assert_bit_exact(Snapshot(str(tmp_path / "c")).read_object("s"), expected)
    target = {"s": StateDict(kept=torch.zeros(NUMEL), moving=torch.zeros(NUMEL))}
    Snapshot(str(tmp_path / "c")).restore(target)
    assert_bit_exact(dict(target["s"]), expected)
    assert verify_snapshot(str(tmp_path / "c")).ok


BAD_BASES = ["../../x", "/abs", "../", "../a/../../x", "..\\a", "a", "../a/", "../."]


def _craft(b: Path, base: str, *, header: bool) -> None:
    document = load_manifest_json(b)
    for piece in document["manifest"]["0/s/big"]["pieces"]:
        if "base" in piece:
            piece["base"] = base
    if header:
        document["bases"] = {base: next(iter(document["bases"].values()))}
    write_manifest_json(b, document)


@pytest.mark.parametrize("header", [True, False], ids=["in-header-and-piece", "in-piece"])
@pytest.mark.parametrize("base", BAD_BASES)
def test_crafted_base_location_is_refused(
    pair: tuple[Path, Path, dict[str, Any]], tmp_path: Path, base: str, header: bool
) -> None:
    _, b, _ = pair
    _craft(b, base, header=header)
    with pytest.raises((UnsafeLocationError, ManifestError)) as info:
        Snapshot(str(b)).read_object("s/big")
    assert repr(base) in str(info.value) or base in str(info.value)
    with pytest.raises((UnsafeLocationError, ManifestError)):
        Snapshot(str(b)).restore(make_state())


def test_crafted_reference_to_a_base_the_header_does_not_list(pair: tuple[Path, Path, dict[str, Any]]) -> None:
    a, b, _ = pair
    shutil.copytree(a, a.parent / "other")  # a real snapshot, but not one b was taken against
    _craft(b, "../other", header=False)
    with pytest.raises((BaseSnapshotError, ManifestError), match="other"):
        Snapshot(str(b)).read_object("s/big")


def test_crafted_base_with_the_snapshots_own_id(pair: tuple[Path, Path, dict[str, Any]]) -> None:
    _, b, _ = pair
    document = load_manifest_json(b)
    document["bases"] = {"../a": document["snapshot_id"]}
    write_manifest_json(b, document)
    with pytest.raises(ManifestError, match="own id"):
        _ = Snapshot(str(b)).metadata


def test_a_take_never_copies_a_reference_to_a_base_that_is_gone(
    pair: tuple[Path, Path, dict[str, Any]],
) -> None:
    # Before: taking against b after a was deleted copied b's references to a into c, which
    # committed a snapshot that could never be read.
    a, b, expected = pair
    shutil.rmtree(a)
    state = {"s": StateDict(**copy.deepcopy(expected))}
    c = a.parent / "c"
    Snapshot.take(str(c), state, base=str(b))
    assert referenced(str(c), "s/big") == [None, None, None, "../b"]  # a's bytes written again, b's referenced
    assert list(Snapshot(str(c)).metadata.bases) == ["../b"]
    target = make_state()
    Snapshot(str(c)).restore(target)
    assert_bit_exact(dict(target["s"]), expected)


def test_a_take_never_copies_a_reference_to_a_replaced_base(pair: tuple[Path, Path, dict[str, Any]]) -> None:
    a, b, expected = pair
    shutil.rmtree(a)
    Snapshot.take(str(a), make_state())  # the same bytes under the same name, another snapshot id
    c = a.parent / "c"
    Snapshot.take(str(c), {"s": StateDict(**copy.deepcopy(expected))}, base=str(b))
    assert "../a" not in Snapshot(str(c)).metadata.bases
    target = make_state()
    Snapshot(str(c)).restore(target)
    assert_bit_exact(dict(target["s"]), expected)
