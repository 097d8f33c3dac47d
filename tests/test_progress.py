"""Seeing what happens: one INFO line per take and restore, DEBUG lines per phase, and the opt-in
progress bar (``progress=True``; on a terminal by default in the CLI)."""

from __future__ import annotations

import io
import logging
import re
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from rich.console import Console

from snapshotkit import Snapshot, StateDict
from snapshotkit._runtime import progress as progress_module
from snapshotkit._runtime.progress import ByteProgress
from snapshotkit.cli import main
from snapshotkit.cli._common import Common, show_progress
from snapshotkit.convert import consolidate_snapshot, export_snapshot, import_snapshot
from snapshotkit.errors import InvalidArgumentError

MIB = 1 << 20
_CSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def _state() -> dict[str, StateDict]:
    # 4 MiB of float32 in one tensor, and a small one: the bar's total is the data objects' bytes.
    return {"model": StateDict(w=torch.arange(MIB, dtype=torch.float32), b=torch.ones(3))}


def _frames(text: str) -> list[str]:
    """What a terminal shows, frame by frame: control sequences gone, split at carriage returns."""
    return [frame.strip() for frame in re.split(r"[\r\n]", _CSI.sub("", text)) if frame.strip()]


@pytest.fixture
def screen(monkeypatch: pytest.MonkeyPatch) -> io.StringIO:
    """Bars drawn at once into a string, as a terminal would get them."""
    out = io.StringIO()
    monkeypatch.setattr(progress_module, "DELAY_S", 0.0)
    monkeypatch.setattr(progress_module, "_console", lambda: Console(file=out, force_terminal=True, width=200))
    return out


def _final(screen: io.StringIO, verb: str) -> str:
    frames = [frame for frame in _frames(screen.getvalue()) if frame.startswith(verb)]
    assert frames, screen.getvalue()
    return frames[-1]


def _done_of_total(frame: str) -> tuple[float, float]:
    match = re.search(r"([0-9.]+)/([0-9.]+) MiB ([0-9.]+) (KiB|MiB|GiB)/s", frame)
    assert match is not None, frame
    return float(match.group(1)), float(match.group(2))


def test_take_async_take_and_restore_draw_their_bar_to_the_end(tmp_path: Path, screen: io.StringIO) -> None:
    Snapshot.take(str(tmp_path / "a"), _state(), progress=True)
    final = _final(screen, "taking")
    assert str(tmp_path / "a") in final and _done_of_total(final) == (4.0, 4.0)

    Snapshot.async_take(str(tmp_path / "b"), _state(), progress=True).wait()
    final = _final(screen, "writing (async_take)")
    assert str(tmp_path / "b") in final and _done_of_total(final) == (4.0, 4.0)

    Snapshot(str(tmp_path / "a")).restore(_state(), progress=True)
    final = _final(screen, "restoring")
    assert str(tmp_path / "a") in final and _done_of_total(final) == (4.0, 4.0)


def test_a_quick_operation_draws_no_bar(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    out = io.StringIO()
    monkeypatch.setattr(progress_module, "_console", lambda: Console(file=out, force_terminal=True))
    Snapshot.take(str(tmp_path / "a"), _state(), progress=True)  # well under DELAY_S (2 s)
    Snapshot(str(tmp_path / "a")).restore(_state(), progress=True)
    assert out.getvalue() == ""


def test_no_bar_without_progress(tmp_path: Path, screen: io.StringIO) -> None:
    Snapshot.take(str(tmp_path / "a"), _state())
    Snapshot(str(tmp_path / "a")).restore(_state())
    assert screen.getvalue() == ""


def test_a_bar_closed_before_its_delay_never_appears() -> None:
    out = io.StringIO()
    bar = ByteProgress("copying", enabled=True, total_bytes=10, delay_s=60, console=Console(file=out))
    bar.advance(10)
    bar.close()
    assert out.getvalue() == ""


def test_a_bar_without_a_total_ends_showing_what_it_did() -> None:
    out = io.StringIO()
    with ByteProgress("copying", enabled=True, delay_s=0, console=Console(file=out, force_terminal=True)) as bar:
        bar.advance(MIB)
        bar.advance(MIB)
    assert _done_of_total(_frames(out.getvalue())[-1]) == (2.0, 2.0)


def test_the_verify_callback_shape_sets_done_and_total() -> None:
    out = io.StringIO()
    with ByteProgress("verifying", enabled=True, delay_s=0, console=Console(file=out, force_terminal=True)) as bar:
        bar(MIB, 4 * MIB)
    assert _done_of_total(_frames(out.getvalue())[-1]) == (1.0, 4.0)


@pytest.mark.parametrize("value", ["yes", 1, None])
def test_progress_must_be_a_bool_before_anything_is_written(tmp_path: Path, value: object) -> None:
    target = tmp_path / "a"
    with pytest.raises(TypeError, match="progress must be True"):
        Snapshot.take(str(target), _state(), progress=value)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match=r"Snapshot\.async_take: progress"):
        Snapshot.async_take(str(target), _state(), progress=value)  # type: ignore[arg-type]
    assert not target.exists()
    Snapshot.take(str(target), _state())
    with pytest.raises(InvalidArgumentError, match=r"Snapshot\.restore: progress"):
        Snapshot(str(target)).restore(_state(), progress=value)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match="consolidate_snapshot: progress"):
        consolidate_snapshot(str(target), str(tmp_path / "c"), progress=value)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match="export_snapshot: progress"):
        export_snapshot(str(target), tmp_path / "e.pt", to="torch", progress=value)  # type: ignore[arg-type]
    torch.save({"w": torch.ones(2)}, tmp_path / "src.pt")
    with pytest.raises(InvalidArgumentError, match="import_snapshot: progress"):
        import_snapshot(tmp_path / "src.pt", str(tmp_path / "i"), progress=value)  # type: ignore[arg-type]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a", "src.pt"]


def test_the_converters_draw_their_bars(tmp_path: Path, screen: io.StringIO) -> None:
    Snapshot.take(str(tmp_path / "a"), _state())
    consolidate_snapshot(str(tmp_path / "a"), str(tmp_path / "c"), progress=True)
    assert _done_of_total(_final(screen, "consolidating")) == (4.0, 4.0)
    export_snapshot(str(tmp_path / "a"), tmp_path / "e.safetensors", to="safetensors", progress=True)
    assert _done_of_total(_final(screen, "exporting")) == (4.0, 4.0)
    import_snapshot(tmp_path / "e.safetensors", str(tmp_path / "i"), progress=True)
    assert str(tmp_path / "i") in _final(screen, "taking")


def test_the_cli_shows_the_bar_when_asked_and_not_by_default_off_a_terminal(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(progress_module, "DELAY_S", 0.0)
    Snapshot.take(str(tmp_path / "a"), _state())
    runner = CliRunner()
    result = runner.invoke(main, ["export", str(tmp_path / "a"), str(tmp_path / "e.pt"), "--to", "torch", "--progress"])
    assert result.exit_code == 0, result.output
    assert "exporting" in result.stderr and "4.0/4.0 MiB" in result.stderr
    result = runner.invoke(main, ["consolidate", str(tmp_path / "a"), str(tmp_path / "c")])
    assert result.exit_code == 0, result.output
    assert "consolidating" not in result.stderr  # CliRunner's stderr is no terminal


def test_show_progress_defaults_to_a_terminal_and_not_json() -> None:
    text, as_json = Common(False, {}, False), Common(True, {}, False)
    assert show_progress(True, as_json) is True and show_progress(False, text) is False
    assert show_progress(None, as_json) is False
    assert show_progress(None, text) is Console(stderr=True).is_terminal


def test_one_info_line_per_take_and_restore_and_debug_lines_per_phase(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.DEBUG, logger="snapshotkit"):
        Snapshot.take(str(tmp_path / "a"), _state())
        Snapshot.async_take(str(tmp_path / "b"), _state()).wait()
        Snapshot(str(tmp_path / "a")).restore(_state())
    infos = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO]
    number = r"[0-9]+\.[0-9]+"
    assert len(infos) == 3, infos
    summary = rf"3 entries, 4\.00 MiB in {number} s \({number} GiB/s\), rank 0 of 1"
    assert re.fullmatch(rf"took snapshot {re.escape(str(tmp_path / 'a'))}: {summary}", infos[0]), infos[0]
    blocked = rf", caller blocked {number} s"
    assert re.fullmatch(rf"took snapshot {re.escape(str(tmp_path / 'b'))}: {summary}{blocked}", infos[1]), infos[1]
    assert re.fullmatch(rf"restored snapshot {re.escape(str(tmp_path / 'a'))}: {summary}", infos[2]), infos[2]
    debug = [(r.name, r.getMessage()) for r in caplog.records if r.levelno == logging.DEBUG]
    phases = [
        re.fullmatch(rf"(take|restore) {re.escape(str(tmp_path / 'a'))}: (\w+) {number} s", message).groups()
        for name, message in debug
        if name in {"snapshotkit.take", "snapshotkit.restore"} and str(tmp_path / "a") in message
    ]
    assert phases == [
        ("take", "plan"),
        ("take", "stage"),
        ("take", "write"),
        ("take", "commit"),
        ("restore", "plan"),
        ("restore", "fetch"),
        ("restore", "load"),
    ]
