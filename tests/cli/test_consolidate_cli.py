"""``snapshotkit info`` of an incremental snapshot (where its bytes are) and ``snapshotkit consolidate``."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
from _chain import assert_same, empty_like, take_chain
from _snapshots import assert_nothing_committed, flip_byte
from click.testing import CliRunner, Result

from cli._cli import INFO_BASE_KEYS, INFO_STORAGE_KEYS, check_schema, parse_json
from snapshotkit import Snapshot
from snapshotkit.cli import main

pytestmark = pytest.mark.usefixtures("clean_env")


def invoke(*args: str) -> Result:
    return CliRunner().invoke(main, [*args], catch_exceptions=False, env={"COLUMNS": "200"})


@pytest.fixture
def chain(tmp_path: Path) -> tuple[Path, dict[str, Any]]:
    run = tmp_path / "run"
    return run, take_chain(str(run))


def _piece_bytes(path: Path) -> tuple[int, dict[str, int]]:
    """Own bytes and bytes per base of the snapshot at ``path``, from its manifest (distinct pieces)."""
    seen: dict[tuple[str, tuple[int, int]], tuple[str | None, int]] = {}
    for entry in Snapshot(str(path)).metadata.manifest.values():
        for piece in getattr(entry, "pieces", None) or ([entry.piece] if hasattr(entry, "piece") else []):
            seen[(piece.address, piece.byte_range)] = (piece.base, piece.nbytes)
    per_base: dict[str, int] = {}
    for base, nbytes in seen.values():
        if base is not None:
            per_base[base] = per_base.get(base, 0) + nbytes
    return sum(n for b, n in seen.values() if b is None), per_base


def test_info_shows_stored_and_referenced_bytes(chain: tuple[Path, dict[str, Any]]) -> None:
    run, _ = chain
    own, per_base = _piece_bytes(run / "step_3")
    assert set(per_base) == {"../step_1", "../step_2"} and own > 0
    metadata = Snapshot(str(run / "step_3")).metadata
    result = invoke("info", str(run / "step_3"))
    assert result.exit_code == 0, result.stderr
    out = result.stdout
    assert f"snapshot id    {metadata.snapshot_id}" in out
    assert "incremental: " in out and "stored here" in out and "referenced in 2 bases" in out
    for base in ("step_1", "step_2"):
        line = next(line for line in out.splitlines() if line.startswith("base") and f"../{base} " in line)
        assert str(run / base) in line and metadata.bases[f"../{base}"] in line, line

    document = parse_json(invoke("info", str(run / "step_3"), "--json").stdout)
    check_schema(document, "snapshotkit.info/1")
    assert document["snapshot_id"] == metadata.snapshot_id
    storage = document["storage"]
    assert set(storage) == INFO_STORAGE_KEYS
    assert not storage["self_contained"]
    assert storage["stored_bytes"] == own
    assert storage["referenced_bytes"] == sum(per_base.values())
    assert all(set(base) == INFO_BASE_KEYS for base in storage["bases"])
    assert {b["location"]: (b["path"], b["snapshot_id"], b["bytes"]) for b in storage["bases"]} == {
        location: (str(run / location[3:]), metadata.bases[location], nbytes) for location, nbytes in per_base.items()
    }

    full = parse_json(invoke("info", str(run / "step_1"), "--json").stdout)["storage"]
    assert full == {
        "self_contained": True,
        "stored_bytes": _piece_bytes(run / "step_1")[0],
        "referenced_bytes": 0,
        "bases": [],
    }
    assert "self-contained" in invoke("info", str(run / "step_1")).stdout


def test_consolidate_then_delete_the_bases(chain: tuple[Path, dict[str, Any]], tmp_path: Path) -> None:
    run, state = chain
    own, per_base = _piece_bytes(run / "step_3")
    dst = tmp_path / "full" / "step_3"
    result = invoke("consolidate", str(run / "step_3"), str(dst), "--json", "--memory-budget", "400000")
    assert result.exit_code == 0, result.stderr
    document = parse_json(result.stdout)
    check_schema(document, "snapshotkit.consolidate/1")
    assert document["snapshot"] == str(dst) and document["bases"] == ["../step_1", "../step_2"]
    assert (document["bytes"], document["referenced_bytes"]) == (own + sum(per_base.values()), sum(per_base.values()))
    assert document["snapshot_id"] == Snapshot(str(dst)).metadata.snapshot_id
    assert document["data_objects"] == len(list((dst / "data").iterdir())) > 1
    shutil.rmtree(run)
    out = empty_like(state)
    Snapshot(str(dst)).restore(out)
    assert_same({k: dict(v) for k, v in out.items()}, {k: dict(v) for k, v in state.items()})
    assert parse_json(invoke("verify", str(dst), "--json").stdout)["ok"]
    assert "self-contained" in invoke("info", str(dst)).stdout

    text = invoke("consolidate", str(dst), str(tmp_path / "again"))
    assert text.exit_code == 0, text.stderr
    assert text.stdout.startswith(f"consolidated {dst} -> {tmp_path / 'again'}: ")
    assert "copied into 1 data object" in text.stdout  # nothing referenced: no base named


def test_consolidate_exit_statuses(chain: tuple[Path, dict[str, Any]], tmp_path: Path) -> None:
    run, _ = chain
    existing = invoke("consolidate", str(run / "step_3"), str(run / "step_2"))
    assert existing.exit_code == 2 and "never overwrites" in existing.stderr
    piece = Snapshot(str(run / "step_3")).metadata.manifest["0/m/b"].pieces[0]
    flip_byte(run / "step_1" / piece.location, piece.byte_range[0])
    damaged = invoke("consolidate", str(run / "step_3"), str(tmp_path / "copy"), "--json")
    assert damaged.exit_code == 1 and damaged.stdout == ""
    assert "checksum mismatch for logical path 'm/b'" in damaged.stderr
    assert_nothing_committed(tmp_path / "copy")
    missing = invoke("consolidate", str(run / "step_9"), str(tmp_path / "copy"))
    assert missing.exit_code == 2 and "no snapshot at" in missing.stderr
