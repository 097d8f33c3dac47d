"""Claimed sizes are proven before memory is allocated for them.

A manifest (damaged and resealed, or crafted) can claim pieces far larger than the data
objects that hold them. A restore checks each claim against the object's real size before it
allocates, so the error is a :class:`TruncatedDataError` naming the logical path, never an
allocation of the claimed size. The scenarios run in a child process whose address space is
capped at 1 GiB above its baseline: an allocation of the claimed size would fail there with a
different error.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from _snapshots import load_manifest_json, take_basic, write_manifest_json

from snapshotkit import Snapshot, StateDict
from snapshotkit.errors import ManifestError

pytestmark = pytest.mark.usefixtures("clean_env")

LIMITED_CHILD = Path(__file__).parent / "_limited_child.py"


def run_capped(snapshot: Path, calls: list[str], timeout_s: float = 120) -> list[dict[str, str]]:
    """Run ``calls`` (``"restore"``, ``"read_object:<path>"``) on ``snapshot`` in a capped child."""
    # One malloc arena per thread would reserve 64 MiB of address space each: keep to two.
    env = {**os.environ, "MALLOC_ARENA_MAX": "2"}
    done = subprocess.run(
        [sys.executable, str(LIMITED_CHILD), str(snapshot), *calls],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    results: list[dict[str, str]] = json.loads(done.stdout.splitlines()[-1])
    return results


@pytest.mark.slow
@pytest.mark.parametrize("claimed_bytes", [2 << 30, 1 << 40], ids=["2GiB", "1TiB"])
def test_a_piece_larger_than_its_data_object_is_refused_before_allocating(tmp_path: Path, claimed_bytes: int) -> None:
    path = tmp_path / "snap"
    take_basic(path)
    document = load_manifest_json(path)
    entry = document["manifest"]["0/extras/w"]
    start = entry["pieces"][0]["byte_range"][0]
    entry["shape"] = [claimed_bytes // 4]
    entry["pieces"] = [{**entry["pieces"][0], "byte_range": [start, start + claimed_bytes]}]
    write_manifest_json(path, document)

    results = run_capped(path, ["restore:extras", "read_object:extras/w", "read_object:extras"])
    for result in results:
        assert result["error"] == "TruncatedDataError", result
        assert "'extras/w'" in result["message"]
        assert entry["pieces"][0]["location"] in result["message"]


@pytest.mark.slow
def test_an_object_piece_larger_than_its_data_object_is_refused_before_allocating(tmp_path: Path) -> None:
    path = tmp_path / "snap"
    Snapshot.take(str(path), {"extras": StateDict(tags={3, 1, 2})})
    document = load_manifest_json(path)
    piece = document["manifest"]["0/extras/tags"]["piece"]
    piece["byte_range"] = [piece["byte_range"][0], piece["byte_range"][0] + (3 << 30)]
    write_manifest_json(path, document)
    results = run_capped(path, ["read_object:extras/tags", "restore:extras"])
    for result in results:
        assert result["error"] == "TruncatedDataError", results
        assert "'extras/tags'" in result["message"]


def test_pieces_reused_across_tensors_of_another_shape_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "snap"
    take_basic(path)
    document = load_manifest_json(path)
    w = document["manifest"]["0/extras/w"]
    document["manifest"]["0/extras"]["keys"].extend(["v1", "v2"])
    document["manifest"]["0/extras/v1"] = {**w, "shape": [2, 4]}
    document["manifest"]["0/extras/v2"] = {**w, "shape": [4, 2]}
    write_manifest_json(path, document)
    with pytest.raises(ManifestError, match="reused across tensors"):
        Snapshot(str(path)).read_object("extras")
    with pytest.raises(ManifestError, match="reused across tensors"):
        Snapshot(str(path)).restore({"extras": StateDict()})


def test_tied_tensors_still_share_one_allocation(tmp_path: Path) -> None:
    path = tmp_path / "snap"
    shared = torch.arange(6.0)
    Snapshot.take(str(path), {"sd": StateDict(a=shared, b=shared)})
    loaded = Snapshot(str(path)).read_object("sd")
    assert loaded["a"].data_ptr() == loaded["b"].data_ptr()
