"""The commands in process (click's test runner): text output, options, exit statuses, edge cases."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import pytest
import torch
from _snapshots import MANIFEST, flip_byte, piece_of, plant_snapshot_at
from click.testing import CliRunner, Result
from rich.console import Console

from cli._cli import check_schema, parse_json
from snapshotkit import Snapshot, SnapshotManager, StateDict
from snapshotkit.cli import _verify, main

GOLDEN_V2 = Path(__file__).resolve().parents[1] / "golden" / "v2" / "sharded"


def invoke(*args: str) -> Result:
    return CliRunner().invoke(main, [*args], catch_exceptions=False, env={"COLUMNS": "160"})


def test_ls_text(root: Path) -> None:
    flip_byte(root / "step_200" / MANIFEST, 120)
    result = invoke("ls", str(root))
    assert result.exit_code == 0, result.stderr
    for expected in ("complete", "damaged", "incomplete", "loss=0.01 (manual)", '{"lr":0.1}', "unknown"):
        assert expected in result.stdout, expected
    assert "4 snapshots: 2 complete" in result.stdout


def test_ls_edge_cases(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    assert invoke("ls", str(empty)).stdout.startswith("no step_<n> snapshots under")
    assert parse_json(invoke("ls", f"file://{empty}", "--json").stdout)["snapshots"] == []
    Snapshot.take(str(tmp_path / "snap"), {"m": StateDict(x=1)})
    assert "is itself a snapshot" in invoke("ls", str(tmp_path / "snap")).stdout
    result = invoke("ls", str(tmp_path / "absent"))
    assert result.exit_code == 2 and "no directory at" in result.stderr


def test_ls_and_info_report_a_snapshot_at_the_root_itself(tmp_path: Path) -> None:
    # Before: ls listed the steps and said nothing; info described the stray snapshot.
    root = tmp_path / "run"
    with SnapshotManager(str(root), preemption_signals=(), async_executor=None) as mgr:
        for step in (1, 2):
            mgr.save(step, {"m": StateDict(x=step)})
    plant_snapshot_at(root)
    result = invoke("ls", str(root))
    assert result.exit_code == 0
    assert "2 snapshots: 2 complete" in result.stdout
    assert f"warning: a snapshot sits at {root} itself ({root}/{MANIFEST} and {root}/data/)" in result.stdout
    assert f"snapshotkit consolidate {root} {root}/step_<n>" in result.stdout
    assert parse_json(invoke("ls", str(root), "--json").stdout)["snapshot_at_root"] is True
    result = invoke("info", str(root))
    assert result.exit_code == 2
    assert "is not a snapshot but a folder of 2 snapshots (step_1 ... step_2)" in result.stderr
    assert f"It also holds a stray snapshot at {str(root)!r} itself" in result.stderr
    assert f"`snapshotkit ls {root}`" in result.stderr


def test_info_text_and_depth(root: Path) -> None:
    result = invoke("info", str(root / "step_300"), "--depth", "2")
    assert result.exit_code == 0
    out = result.stdout
    expected_parts = ("version 5", "self-contained", "world size", '"lr":0.1', "float32", "0.weight", "[8, 4]")
    for expected in (*expected_parts, "deeper levels summed"):
        assert expected in out, expected
    nodes = parse_json(invoke("info", str(root / "step_300"), "--json", "--depth", "1").stdout)["nodes"]
    assert [(n["path"], n["truncated"]) for n in nodes] == [("model", True), ("optim", True), ("progress", True)]
    assert invoke("info", str(root / "step_300"), "--depth", "0").exit_code == 2


def test_info_of_a_sharded_snapshot() -> None:
    result = invoke("info", str(GOLDEN_V2), "--depth", "5")
    assert "sharded (2 shards)" in result.stdout and "replicated" in result.stdout
    assert "per-rank (2 of 2 ranks)" in result.stdout
    document = parse_json(invoke("info", str(GOLDEN_V2), "--json").stdout)
    check_schema(document, "snapshotkit.info/1")
    rows = next(n for n in document["nodes"] if n["path"] == "tables/rows")
    assert (rows["sharding"], rows["shards"], rows["ranks"], rows["shape"]) == ("sharded", 2, [0], [5, 6])


def test_show_values_of_every_kind(tmp_path: Path) -> None:
    state = {
        "s": StateDict(
            w=torch.tensor([[1.0, float("nan")], [float("inf"), -2.0]]),
            q=torch.quantize_per_tensor(torch.tensor([0.5, 1.0]), 0.5, 0, torch.qint8),
            c=torch.tensor([3 + 4j]),
            n=3,
            text="x" * 3000,
            things={"a": [1, 2]},
            obj={1, 2},
        )
    }
    Snapshot.take(str(tmp_path / "s"), state)
    path = str(tmp_path / "s")
    shown = parse_json(invoke("show", path, "s/w", "--json").stdout)
    assert shown["stats"] == {
        "count": 4,
        "finite": 2,
        "nan": 1,
        "inf": 1,
        "min": -2.0,
        "max": 1.0,
        "mean": -0.5,
        "std": pytest.approx(2.1213203435596424),
        "of_abs": False,
    }
    assert shown["first_values"] == [1.0, "nan", "inf", -2.0]  # JSON has no NaN: strings
    text = invoke("show", path, "s/w").stdout
    assert "min -2  max 1  mean -0.5" in text and "nan 1  inf 1" in text
    assert parse_json(invoke("show", path, "s/q", "--json").stdout)["stats"]["max"] == 1.0
    complex_ = parse_json(invoke("show", path, "s/c", "--json").stdout)
    assert complex_["stats"]["of_abs"] and complex_["stats"]["max"] == 5.0 and complex_["first_values"] == ["(3+4j)"]
    assert parse_json(invoke("show", path, "s/n", "--json").stdout)["repr"] == "3"
    long = parse_json(invoke("show", path, "s/text", "--json").stdout)
    assert long["truncated"] and len(long["repr"]) == 2003
    assert parse_json(invoke("show", path, "s/obj", "--json").stdout)["repr"] == "{1, 2}"
    assert parse_json(invoke("show", path, "s/things", "--json").stdout)["children"] == ["s/things/a"]
    assert "s/things/a/0" in invoke("show", path, "s/things/a").stdout


def test_show_finds_ranks_and_close_matches() -> None:
    assert parse_json(invoke("show", str(GOLDEN_V2), "1/progress/tag", "--json").stdout)["repr"] == "'rank 1'"
    columns = parse_json(invoke("show", str(GOLDEN_V2), "tables/columns", "--json", "--memory-budget", "16").stdout)
    assert columns["first_values"] == list(range(-10, 0)) and columns["shards"] == 2
    result = invoke("show", str(GOLDEN_V2), "tables/colums")
    assert result.exit_code == 2 and "close matches: 'tables/columns'" in result.stderr


def test_verify_text_lists_every_problem(root: Path) -> None:
    for logical_path in ("model/0.weight", "optim/state/0/momentum_buffer"):
        location, start, _ = piece_of(root / "step_300", logical_path)
        flip_byte(location, start)
    result = invoke("verify", str(root / "step_300"))
    assert result.exit_code == 1
    assert "model/0.weight" in result.stdout and "optim/state/0/momentum_buffer" in result.stdout
    assert "2 problems" in result.stdout and "DAMAGED" in result.stdout


def test_verify_shows_progress_on_a_terminal(root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    screen = io.StringIO()
    terminal = Console(file=screen, force_terminal=True, width=100)
    monkeypatch.setattr(_verify, "console", lambda: terminal)
    result = invoke("verify", str(root / "step_100"))
    assert result.exit_code == 0
    assert "verifying" in screen.getvalue() and "OK:" in screen.getvalue()


def test_diff_text_and_identical(root: Path) -> None:
    result = invoke("diff", str(root / "step_100"), str(root / "step_100"))
    assert result.exit_code == 0 and "identical: 0 added, 0 removed, 0 changed" in result.stdout
    result = invoke("diff", str(root / "step_100"), str(root / "step_300"), "--memory-budget", "1KiB")
    assert result.exit_code == 1
    assert "model/0.weight" in result.stdout and "progress/step" in result.stdout and "differ:" in result.stdout
    assert invoke("diff", str(root / "step_100"), str(root / "step_300"), "--atol", "-1").exit_code == 2


def test_prune_keeps_what_the_manager_would(root: Path) -> None:
    Snapshot.take(str(root / "step_50"), {"m": StateDict(x=1)})  # taken by hand: never pruned
    result = invoke("prune", str(root), "--keep-last", "1")
    assert result.exit_code == 0, result.stderr
    assert "deleted step 100" in result.stdout and "deleted step 200" in result.stdout
    assert "kept steps: 50, 300" in result.stdout
    assert sorted(p.name for p in root.iterdir()) == ["step_300", "step_400", "step_50"]
    best = parse_json(invoke("prune", str(root), "--keep-best", "1", "--best-metric", "loss", "--json").stdout)
    assert best["deleted"] == [] and [k["step"] for k in best["kept"]] == [50, 300]
    result = invoke("prune", str(root), "--keep-best", "1")
    assert result.exit_code == 2 and "needs best_metric" in result.stderr
    assert invoke("prune", str(root)).exit_code == 2


def test_cleanup_leaves_foreign_files_alone(root: Path) -> None:
    foreign = root / "step_500"
    foreign.mkdir()
    (foreign / "model.pt").write_bytes(b"not ours")
    dry = parse_json(invoke("cleanup", str(root), "--dry-run", "--json").stdout)
    check_schema(dry, "snapshotkit.cleanup/1")
    assert [r["step"] for r in dry["removed"]] == [400] and [r["step"] for r in dry["left_alone"]] == [500]
    assert (root / "step_400").exists()
    result = invoke("cleanup", str(root))
    assert "removed incomplete step 400" in result.stdout and "left alone step 500" in result.stdout
    assert not (root / "step_400").exists() and (foreign / "model.pt").exists()


def test_storage_options_and_budgets_are_parsed(root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[dict[str, Any]] = []
    budgets: list[int | None] = []

    def fake_verify(path: str, **kwargs: Any) -> Any:
        seen.append(kwargs["storage_options"])
        budgets.append(kwargs["memory_budget_bytes"])
        raise KeyboardInterrupt

    monkeypatch.setattr(_verify, "verify_snapshot", fake_verify)
    args = ("-o", "retry=3", "-o", 'endpoint_url="x"', "-o", "flag=true", "-o", "name=abc", "-o", "url=http://h:1")
    result = invoke("verify", str(root / "step_100"), *args, "--memory-budget", "2MiB")
    assert result.exit_code == 130 and "interrupted" in result.stderr
    assert seen == [{"retry": 3, "endpoint_url": "x", "flag": True, "name": "abc", "url": "http://h:1"}]
    assert budgets == [2 << 20]
    for bad in (("-o", "novalue"), ("--memory-budget", "0"), ("--memory-budget", "12 parsecs")):
        assert invoke("verify", str(root / "step_100"), *bad).exit_code == 2, bad


def test_errors_are_one_line_unless_debug(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    result = invoke("ls", "nosuchscheme://bucket/run", "--json")
    assert (result.exit_code, result.stdout) == (2, "")
    assert result.stderr.startswith("snapshotkit ls: error: no storage plugin for scheme 'nosuchscheme'")
    assert result.stderr.count("\n") == 1
    result = invoke("info", str(tmp_path / "absent"), "--debug")
    assert result.exit_code == 2 and "Traceback" in result.stderr and "SnapshotNotFoundError" in result.stderr

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("boom")

    monkeypatch.setattr(_verify, "verify_snapshot", broken)
    result = invoke("verify", str(tmp_path))
    assert result.exit_code == 2
    assert "RuntimeError: boom (unexpected: rerun with --debug" in result.stderr


def test_a_damaged_manifest(root: Path) -> None:
    flip_byte(root / "step_300" / MANIFEST, 150)
    result = invoke("info", str(root / "step_300"))
    assert result.exit_code == 1 and "integrity" in result.stderr  # damage found
    document = parse_json(invoke("verify", str(root / "step_300"), "--json").stdout)
    assert [p["kind"] for p in document["problems"]] == ["manifest"]


def test_help_and_version() -> None:
    result = invoke("--help")
    assert result.exit_code == 0
    for command in ("ls", "info", "show", "verify", "diff", "prune", "cleanup"):
        assert command in result.stdout
    assert invoke("--version").stdout.startswith("snapshotkit, version ")
