"""Each command through the console entry (``python -m snapshotkit``), in a fresh interpreter.

Every spawn imports torch (1-2 s), so there is about one per command and each checks as much as
it sensibly can; the many smaller cases (text output, options, edge cases) run in process, through
click's test runner, in ``test_commands.py``.
"""

from __future__ import annotations

import contextlib
import uuid
from pathlib import Path

import pytest
from _snapshots import flip_byte, piece_of

from cli._cli import (
    CHANGE_KEYS,
    CHECKOUT,
    INFO_NODE_KEYS,
    LS_SNAPSHOT_KEYS,
    PROBLEM_KEYS,
    check_schema,
    parse_json,
    run_cli,
)

pytestmark = pytest.mark.slow


def test_the_console_script_is_declared() -> None:
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    project = tomllib.loads((CHECKOUT / "pyproject.toml").read_text())["project"]
    assert project["scripts"]["snapshotkit"] == "snapshotkit.cli:main"
    assert any(d.startswith("click") for d in project["dependencies"])
    assert any(d.startswith("rich") for d in project["dependencies"])


def test_ls(root: Path) -> None:
    done = run_cli("ls", str(root), "--json")
    assert done.returncode == 0, done.stderr
    document = parse_json(done.stdout)
    check_schema(document, "snapshotkit.ls/1")
    assert document["root"] == str(root)
    snapshots = document["snapshots"]
    assert [(s["step"], s["status"], s["complete"]) for s in snapshots] == [
        (100, "complete", True),
        (200, "complete", True),
        (300, "complete", True),
        (400, "incomplete", False),
    ]
    for snapshot in snapshots:
        assert set(snapshot) == LS_SNAPSHOT_KEYS
    first = snapshots[0]
    on_disk = sum(f.stat().st_size for f in (root / "step_100").rglob("*") if f.is_file())
    assert first["size_bytes"] == on_disk and first["path"] == f"{root}/step_100"
    assert (first["metrics"], first["reason"], first["user_metadata"]) == ({"loss": 0.01}, "manual", {"lr": 0.1})
    assert snapshots[3]["size_bytes"] is None and snapshots[3]["created_at"] is None
    assert (first["kind"], first["bases"]) == ("full", []) and snapshots[3]["kind"] is None


def test_info_and_show_json(root: Path) -> None:
    done = run_cli("info", str(root / "step_300"), "--json")
    assert done.returncode == 0, done.stderr
    document = parse_json(done.stdout)
    check_schema(document, "snapshotkit.info/1")
    assert document["world_size"] == 1 and document["user_metadata"]["lr"] == 0.1
    nodes = {node["path"]: node for node in document["nodes"]}
    assert all(set(node) == INFO_NODE_KEYS for node in nodes.values())
    weight = nodes["model/0.weight"]
    described = (weight["dtype"], weight["shape"], weight["bytes"], weight["sharding"])
    assert described == ("float32", [8, 4], 128, "per_rank")
    assert document["totals"]["by_dtype"][0]["dtype"] == "float32"

    done = run_cli("show", str(root / "step_300"), "model/0.weight", "--json", "--memory-budget", "64", "--count", "3")
    assert done.returncode == 0, done.stderr
    shown = parse_json(done.stdout)
    assert shown["schema"] == "snapshotkit.show/1"
    tensor_keys = {"dtype", "shape", "numel", "shards", "stats", "first_values"}
    assert set(shown) == {"schema", "snapshot", "logical_path", "kind", "bytes", *tensor_keys}
    assert (shown["kind"], shown["dtype"], shown["shape"], shown["numel"]) == ("tensor", "float32", [8, 4], 32)
    assert set(shown["stats"]) == {"count", "finite", "nan", "inf", "min", "max", "mean", "std", "of_abs"}
    assert shown["stats"]["count"] == 32 and len(shown["first_values"]) == 3


def test_verify_a_healthy_and_a_corrupt_snapshot(root: Path) -> None:
    done = run_cli("verify", str(root / "step_300"), "--json")
    assert done.returncode == 0, done.stderr
    document = parse_json(done.stdout)
    check_schema(document, "snapshotkit.verify/1")
    assert document["ok"] and document["problems"] == [] and document["pieces_checked"] > 0

    location, start, _ = piece_of(root / "step_300", "model/2.weight")
    flip_byte(location, start + 3)
    done = run_cli("verify", str(root / "step_300"), "--json")
    assert done.returncode == 1
    problems = parse_json(done.stdout)["problems"]
    assert [(p["logical_path"], p["kind"]) for p in problems] == [("model/2.weight", "checksum")]
    assert set(problems[0]) == PROBLEM_KEYS


def test_show_and_diff_on_a_corrupt_snapshot_fail(root: Path) -> None:
    location, start, _ = piece_of(root / "step_200", "model/0.bias")
    flip_byte(location, start)
    done = run_cli("show", str(root / "step_200"), "model/0.bias", "--json")
    assert (done.returncode, done.stdout) == (1, "")
    assert "checksum mismatch" in done.stderr and "model/0.bias" in done.stderr and "Traceback" not in done.stderr
    done = run_cli("diff", str(root / "step_100"), str(root / "step_200"))
    assert done.returncode == 1 and "checksum mismatch" in done.stderr and "snapshotkit verify" in done.stderr


def test_diff(root: Path) -> None:
    done = run_cli("diff", str(root / "step_100"), str(root / "step_200"), "--json", "--atol", "1e-9")
    assert done.returncode == 1, done.stderr  # they differ
    document = parse_json(done.stdout)
    check_schema(document, "snapshotkit.diff/1")
    assert not document["identical"] and document["added"] == [] and document["removed"] == []
    changed = {c["logical_path"]: c for c in document["changed"]}
    assert all(set(c) == CHANGE_KEYS for c in changed.values())
    assert changed["progress/step"]["what"] == "value"
    assert changed["model/0.weight"]["what"] == "values" and changed["model/0.weight"]["max_abs_diff"] > 0


def test_prune_and_cleanup(root: Path) -> None:
    done = run_cli("prune", str(root), "--keep-last", "1", "--dry-run", "--json")
    assert done.returncode == 0, done.stderr
    document = parse_json(done.stdout)
    check_schema(document, "snapshotkit.prune/1")
    assert [d["step"] for d in document["deleted"]] == [100, 200] and document["dry_run"]
    assert (root / "step_100" / ".snapshot_metadata").exists()
    done = run_cli("cleanup", str(root))
    assert done.returncode == 0, done.stderr
    assert "removed incomplete step 400" in done.stdout and not (root / "step_400").exists()


def test_usage_and_access_errors(tmp_path: Path) -> None:
    missing = tmp_path / "absent"
    done = run_cli("info", str(missing), "--json")
    assert (done.returncode, done.stdout) == (2, "")
    # one line: the library's message (what is there, what to do), no traceback
    assert done.stderr.count("\n") == 1 and done.stderr.startswith(
        f"snapshotkit info: error: no snapshot at '{missing}'"
    )
    assert "nothing exists there" in done.stderr and "check the path" in done.stderr
    done = run_cli("verify", str(missing), "--no-such-option")
    assert done.returncode == 2 and "No such option" in done.stderr


def test_ls_and_verify_on_s3(seaweed_s3_endpoint: str, tmp_path: Path) -> None:
    boto3 = pytest.importorskip("boto3")
    bucket = "snapshotkit-cli"
    client = boto3.client("s3", endpoint_url=seaweed_s3_endpoint)
    with contextlib.suppress(client.exceptions.BucketAlreadyOwnedByYou):
        client.create_bucket(Bucket=bucket)
    root = f"s3://{bucket}/{uuid.uuid4().hex}"
    option = f"endpoint_url={seaweed_s3_endpoint}"
    _take_on(root, seaweed_s3_endpoint)
    done = run_cli("ls", root, "--json", "--storage-option", option)
    assert done.returncode == 0, done.stderr
    snapshots = parse_json(done.stdout)["snapshots"]
    assert [(s["step"], s["status"], s["metrics"]) for s in snapshots] == [(5, "complete", {"loss": 0.5})]
    assert snapshots[0]["size_bytes"] > 4000
    done = run_cli("verify", f"{root}/step_5", "--json", "-o", option)
    assert done.returncode == 0, done.stderr
    assert parse_json(done.stdout)["ok"]
    # export from s3:// to a local file, and import that file back into s3://
    exported = tmp_path / "state.pt"
    done = run_cli("export", f"{root}/step_5", str(exported), "--to", "torch", "-o", option)
    assert done.returncode == 0, done.stderr
    done = run_cli("import", str(exported), f"{root}/imported", "--json", "-o", option)
    assert done.returncode == 0, done.stderr
    assert "m/w" in parse_json(done.stdout)["logical_paths"]
    import torch

    from snapshotkit import Snapshot

    back = Snapshot(f"{root}/imported", storage_options={"endpoint_url": seaweed_s3_endpoint}).read_object("m/w")
    assert torch.equal(back, torch.arange(1000.0))


def _take_on(root: str, endpoint: str) -> None:
    import torch

    from snapshotkit import SnapshotManager, StateDict

    with SnapshotManager(root, storage_options={"endpoint_url": endpoint}, preemption_signals=()) as mgr:
        mgr.save(5, {"m": StateDict(w=torch.arange(1000.0))}, metrics={"loss": 0.5})


def test_import_a_torch_file_and_refuse_what_is_missing(tmp_path: Path) -> None:
    import torch

    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    source = tmp_path / "model.pt"
    torch.save({"model": model.state_dict(), "epoch": 3}, source)
    out = tmp_path / "imported"
    done = run_cli("import", str(source), str(out), "--json")
    assert done.returncode == 0, done.stderr
    document = parse_json(done.stdout)
    check_schema(document, "snapshotkit.import/1")
    assert document["source_format"] == "torch" and document["snapshot"] == str(out)
    assert "model/weight" in document["logical_paths"]

    from snapshotkit import Snapshot

    fresh = torch.nn.Linear(4, 3)
    Snapshot(str(out)).restore({"model": fresh})
    assert torch.equal(fresh.weight, model.weight) and torch.equal(fresh.bias, model.bias)

    again = run_cli("import", str(source), str(out))  # never overwrites a snapshot
    assert again.returncode == 2 and "already" in again.stderr
    missing = run_cli("import", str(tmp_path / "nothing.pt"), str(tmp_path / "x"))
    assert missing.returncode == 2 and missing.stdout == ""
    wrong = run_cli("import", str(source), str(tmp_path / "y"), "--from", "parquet")
    assert wrong.returncode == 2


def test_export_to_safetensors_loads_into_the_model(tmp_path: Path) -> None:
    import torch
    from safetensors.torch import load_file

    from snapshotkit import Snapshot, StateDict

    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    Snapshot.take(str(tmp_path / "snap"), {"model": model, "progress": StateDict(step=7)})
    out = tmp_path / "model.safetensors"
    done = run_cli(
        "export", str(tmp_path / "snap"), str(out), "--to", "safetensors", "--select", "model/**",
        "--strip-prefix", "model/", "--json",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    document = parse_json(done.stdout)
    check_schema(document, "snapshotkit.export/1")
    assert document["format"] == "safetensors" and document["tensors_written"] == 2
    fresh = torch.nn.Linear(4, 3)
    fresh.load_state_dict(load_file(out))
    assert torch.equal(fresh.weight, model.weight)

    everything = run_cli("export", str(tmp_path / "snap"), str(tmp_path / "all.safetensors"), "--to", "safetensors")
    assert everything.returncode == 0, everything.stderr
    assert "skipped 1 value" in everything.stdout and "'progress/step'" in everything.stdout  # never dropped silently
    again = run_cli("export", str(tmp_path / "snap"), str(out), "--to", "safetensors")
    assert again.returncode == 2 and out.exists()
    missing = run_cli("export", str(tmp_path / "nothing"), str(tmp_path / "x.pt"), "--to", "torch")
    assert missing.returncode == 2


def test_export_of_a_corrupt_snapshot_exits_1_and_writes_nothing(tmp_path: Path) -> None:
    import torch

    from snapshotkit import Snapshot, StateDict

    Snapshot.take(str(tmp_path / "snap"), {"m": StateDict(w=torch.arange(1000.0))})
    data_object, start, _ = piece_of(tmp_path / "snap", "m/w")
    flip_byte(data_object, start)
    out = tmp_path / "out.safetensors"
    done = run_cli("export", str(tmp_path / "snap"), str(out), "--to", "safetensors")
    assert done.returncode == 1, done.stderr
    assert "m/w" in done.stderr and "snapshotkit verify" in done.stderr
    assert not out.exists()
