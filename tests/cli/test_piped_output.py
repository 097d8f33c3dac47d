"""Piped text output is data: never wrapped, truncated or padded, one record per line; and every
command speaks the command line's words (its arguments and commands, not Python's)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from _snapshots import flip_byte, piece_of
from click.testing import CliRunner, Result

from cli._cli import CHECKOUT
from snapshotkit import Snapshot, SnapshotManager, StateDict
from snapshotkit.cli import main
from snapshotkit.convert import export_snapshot
from snapshotkit.errors import ExportExistsError

# A logical path of 180 characters, and metrics, metadata and values longer than a terminal line.
LAYER = "encoder_block_with_a_rather_descriptive_name_" * 3
LONG_PATH = f"optim/state/{LAYER}/exp_avg"
METRIC = "validation_perplexity_on_the_held_out_split_of_the_corpus"
NOTE = "a note of the experiment that does not fit in eighty columns, " * 3


def invoke(*args: str) -> Result:
    """A command in process, its stdout not a terminal (as in a pipe), 80 columns."""
    return CliRunner().invoke(main, [*args], catch_exceptions=False, env={"COLUMNS": "80"})


def _state(step: int, gone: bool) -> dict[str, StateDict]:
    optim = {"state": {LAYER: {"exp_avg": torch.full((3,), float(step))}}}
    extra = {"only_in_step_1": torch.zeros(2)} if not gone else {"only_in_step_2": torch.ones(2)}
    return {"optim": StateDict(**optim), "progress": StateDict(step=step, **extra)}


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A manager's root: step_1 and step_2, which differ in a value, an added and a removed path."""
    root = tmp_path_factory.mktemp("piped") / "run"
    with SnapshotManager(str(root), preemption_signals=()) as mgr:
        for step in (1, 2):
            mgr.save(step, _state(step, gone=step == 2), metrics={METRIC: 1.0 / 3 + step}, metadata={"note": NOTE})
    return root


def check_plain(result: Result, *wholes: str) -> list[str]:
    """Every line of stdout ends in no space and each of ``wholes`` is on one line; the lines."""
    assert result.exit_code in (0, 1), result.output
    lines = result.stdout.splitlines()
    assert lines, "no output"
    assert [line for line in lines if line != line.rstrip()] == []
    for whole in wholes:
        assert any(whole in line for line in lines), (whole, result.stdout)
    return lines


def test_every_command_prints_whole_lines_when_piped(run: Path, tmp_path: Path) -> None:
    step_1, step_2 = str(run / "step_1"), str(run / "step_2")
    metric = f"{METRIC}={1.0 / 3 + 2:.6g}"
    note = f'"note":"{NOTE}"'
    check_plain(invoke("ls", str(run)), metric, note)
    check_plain(invoke("info", step_2, "--depth", "9"), LONG_PATH, note)
    check_plain(invoke("show", step_2, LONG_PATH), LONG_PATH)
    check_plain(invoke("show", step_2, f"optim/state/{LAYER}"), LONG_PATH)
    check_plain(invoke("verify", step_2), step_2)
    diff = check_plain(invoke("diff", step_1, step_2), LONG_PATH, "- progress/only_in_step_1")
    assert [line.split("\t")[0] for line in diff if "exp_avg" in line] == [LONG_PATH]  # grep finds it whole
    check_plain(invoke("prune", str(run), "--keep-last", "1", "--dry-run"), f"{run}/step_1")
    check_plain(invoke("cleanup", str(run), "--dry-run"))
    out = tmp_path / ("exported_" + "x" * 100 + ".pt")
    check_plain(invoke("export", step_2, str(out), "--to", "torch"), str(out))
    imported = invoke("import", str(out), str(tmp_path / "imported"), "--from", "torch")
    check_plain(imported, str(tmp_path / "imported"))
    check_plain(invoke("consolidate", step_2, str(tmp_path / "copy")), str(tmp_path / "copy"))
    help_lines = check_plain(invoke("--help"))
    assert any(line.split()[:1] == ["consolidate"] for line in help_lines)

    damaged = tmp_path / "damaged"
    shutil.copytree(step_2, damaged)
    data, offset, _ = piece_of(damaged, LONG_PATH)
    flip_byte(data, offset)
    lines = check_plain(invoke("verify", str(damaged)), LONG_PATH)
    row = next(line for line in lines if line.startswith(LONG_PATH))
    assert row.split("\t")[1] == "checksum" and row.endswith("The snapshot is corrupt")  # the whole message


def test_a_table_is_one_tab_separated_record_a_line(run: Path) -> None:
    lines = check_plain(invoke("ls", str(run)))
    header = lines.index("step\tstatus\tcreated (UTC)\tsize\tbase\tmetrics (reason)\tuser metadata")
    rows = [line.split("\t") for line in lines[header + 1 : header + 3]]
    assert [(row[0], row[1], row[4]) for row in rows] == [("1", "complete", "full"), ("2", "complete", "full")]
    assert rows[1][5] == f"{METRIC}={1.0 / 3 + 2:.6g} (manual)"
    info = check_plain(invoke("info", str(run / "step_2"), "--depth", "9"))
    assert f"{LONG_PATH}  float32 [3]  12 B" in info  # a tree node by its whole logical path


def test_the_console_entry_piped_through_grep(run: Path) -> None:
    command = [sys.executable, "-m", "snapshotkit", "diff", str(run / "step_1"), str(run / "step_2")]
    env = {"PYTHONPATH": str(CHECKOUT), "COLUMNS": "60", "PATH": "/usr/bin:/bin"}
    diff = subprocess.run(command, capture_output=True, text=True, env=env, timeout=120, check=False)
    assert diff.returncode == 1, diff.stderr
    grep = subprocess.run(["grep", "exp_avg"], input=diff.stdout, capture_output=True, text=True, check=True)
    assert grep.stdout.split("\t")[0] == LONG_PATH


def test_diff_heads_removed_and_added_as_it_heads_changed(run: Path) -> None:
    lines = check_plain(invoke("diff", str(run / "step_1"), str(run / "step_2")))
    removed, added, changed = (lines.index(h) for h in ("removed (only in A)", "added (only in B)", "changed"))
    assert lines[removed + 1] == "- progress/only_in_step_1"
    assert lines[added + 1] == "+ progress/only_in_step_2"
    assert removed < added < changed


def test_info_shows_the_users_metadata_not_the_managers_record(run: Path) -> None:
    lines = check_plain(invoke("info", str(run / "step_2")))
    assert f'user metadata  {{"note":"{NOTE}"}}' in lines
    assert f"saved by       SnapshotManager, step 2, {METRIC}={1.0 / 3 + 2:.6g} (manual)" in lines
    assert not any("snapshotkit.manager" in line for line in lines)


def test_an_export_counts_the_values_it_skips(tmp_path: Path) -> None:
    values = {f"value_{i:02d}": i for i in range(31)}
    Snapshot.take(str(tmp_path / "snap"), {"model": StateDict(w=torch.zeros(2)), "extra": StateDict(**values)})
    result = invoke("export", str(tmp_path / "snap"), str(tmp_path / "a.safetensors"), "--to", "safetensors")
    lines = check_plain(result, "skipped 31 values (not a tensor (an int): safetensors holds tensors only):")
    assert len(lines) == 3 and "'extra/value_00', 'extra/value_01'" in lines[1] and "and 26 more" in lines[1]
    assert lines[2] == "31 values skipped in all; --verbose lists each one"
    verbose = invoke("export", str(tmp_path / "snap"), str(tmp_path / "b.safetensors"), "--to", "safetensors", "-v")
    skipped = [line for line in check_plain(verbose) if line.startswith("skipped extra/value_")]
    assert len(skipped) == 31


def test_errors_name_the_command_lines_arguments_and_commands(run: Path, tmp_path: Path) -> None:
    step_2 = str(run / "step_2")
    (tmp_path / "taken.pt").write_bytes(b"")
    errors = {
        "export": invoke("export", step_2, str(tmp_path / "taken.pt"), "--to", "torch").stderr,
        "import": invoke("import", str(tmp_path / "taken.pt"), step_2).stderr,
        "consolidate": invoke("consolidate", step_2, step_2).stderr,
        "info": invoke("info", str(run)).stderr,
        "show": invoke("show", str(run), "optim").stderr,
    }
    errors["import-unknown"] = invoke("import", str(tmp_path / "taken.pt"), str(tmp_path / "new")).stderr
    torch.save({"w": torch.zeros(1)}, tmp_path / "model.pt")
    errors["import"] = invoke("import", str(tmp_path / "model.pt"), step_2).stderr
    errors["import-from"] = invoke("import", str(tmp_path / "model.pt"), str(tmp_path / "new"), "--from", "dcp").stderr
    damaged = tmp_path / "damaged"
    shutil.copytree(step_2, damaged)
    data, offset, _ = piece_of(damaged, LONG_PATH)
    flip_byte(data, offset)
    errors["damaged"] = invoke("show", str(damaged), LONG_PATH).stderr
    assert "The snapshot is corrupt; restore from another snapshot. Run `snapshotkit verify`" in errors["damaged"]
    assert "(--from one of dcp, safetensors, torch, torchsnapshot)" in errors["import-unknown"]
    assert f"--from dcp was given, but {tmp_path / 'model.pt'} is not a dcp checkpoint" in errors["import-from"]
    assert (
        errors["export"].rstrip().endswith("an export never overwrites. Give OUT a new path (one that holds nothing)")
    )
    assert errors["import"].rstrip().endswith("Give OUT a new path (one that holds nothing)")
    assert errors["consolidate"].rstrip().endswith("Give DST a new path (one that holds nothing)")
    assert f"Name one of them, e.g. `snapshotkit info {step_2}`; `snapshotkit ls {run}` lists them" in errors["info"]
    assert f"Name one of them, e.g. {step_2!r}" in errors["show"]
    for message in errors.values():
        for python in (" dst", "the take", "Snapshot(", "SnapshotManager(", "app_state", "verify_checksums", "source="):
            assert python not in message, (python, message)

    leftover = tmp_path / "with_leftover"
    shutil.copytree(run, leftover)
    (leftover / "step_3" / "data").mkdir(parents=True)
    (leftover / "step_3" / "data" / "0_00000_0123abcd").write_bytes(b"partial")
    message = invoke("verify", str(leftover / "step_3")).stderr
    assert f"(`snapshotkit cleanup {leftover}` removes them)" in message and "SnapshotManager" not in message


def test_the_python_api_keeps_its_words_and_carries_the_advice(run: Path, tmp_path: Path) -> None:
    (tmp_path / "taken.pt").write_bytes(b"")
    with pytest.raises(ExportExistsError) as info:
        export_snapshot(str(run / "step_2"), str(tmp_path / "taken.pt"), to="torch")
    assert str(info.value).endswith("Choose another dst")
    advice = info.value.advice
    assert advice is not None and advice.action == "new_destination"
    assert str(info.value).startswith(advice.problem) and advice.paths == (str(tmp_path / "taken.pt"),)


def test_a_reader_that_stops_early_ends_the_command_quietly(tmp_path: Path) -> None:
    """``snapshotkit info SNAP | head -1``: no BrokenPipeError message, status 141 (as SIGPIPE)."""
    Snapshot.take(str(tmp_path / "snap"), {"m": StateDict(**{f"value_{i:04d}_{'y' * 90}": i for i in range(2000)})})
    command = [sys.executable, "-m", "snapshotkit", "info", str(tmp_path / "snap"), "--depth", "3"]
    env = {"PYTHONPATH": str(CHECKOUT), "PATH": "/usr/bin:/bin"}
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env) as proc:
        assert proc.stdout is not None and proc.stderr is not None
        assert proc.stdout.readline().startswith(b"snapshot ")
        proc.stdout.close()  # more than a pipe's buffer is still to come
        errors = proc.stderr.read()
        assert proc.wait(timeout=120) == 141
    assert errors == b""
