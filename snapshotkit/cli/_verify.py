"""``snapshotkit verify SNAPSHOT``: read every stored byte, check every checksum, list every problem."""

from __future__ import annotations

from typing import Any

import click
from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn, TransferSpeedColumn
from rich.table import Table
from rich.text import Text

from snapshotkit.cli._common import (
    EXIT_FOUND,
    EXIT_OK,
    Common,
    command_options,
    console,
    emit_json,
    format_bytes,
    memory_budget_option,
    plural,
    print_table,
)
from snapshotkit.verify import VerifyReport, verify_snapshot

SCHEMA = "snapshotkit.verify/1"


@click.command()
@click.argument("snapshot")
@memory_budget_option
@command_options
def verify(snapshot: str, memory_budget_bytes: int | None, *, common: Common) -> int:
    """Read every stored byte of SNAPSHOT and check every checksum.

    Every damaged piece is listed by logical path (bad checksum, truncated or missing data
    object, a manifest that fails its integrity check), not just the first. Exit status 1 when
    anything is damaged. A progress bar (bytes, rate, time left) shows on a terminal, unless
    --json.
    """
    out = console()
    if common.json or not out.is_terminal:
        report = verify_snapshot(
            snapshot, storage_options=common.storage_options, memory_budget_bytes=memory_budget_bytes
        )
    else:
        columns = (
            TextColumn("verifying"),
            BarColumn(),
            DownloadColumn(binary_units=True),
            TransferSpeedColumn(),
            TimeRemainingColumn(),
        )
        with Progress(*columns, console=out, transient=True) as progress:
            task = progress.add_task("verify", total=None)

            def advance(done_bytes: int, total_bytes: int) -> None:
                progress.update(task, completed=done_bytes, total=total_bytes)

            report = verify_snapshot(
                snapshot,
                storage_options=common.storage_options,
                memory_budget_bytes=memory_budget_bytes,
                progress=advance,
            )
    if common.json:
        emit_json(to_json(report))
    else:
        _print(report)
    return EXIT_OK if report.ok else EXIT_FOUND


def to_json(report: VerifyReport) -> dict[str, Any]:
    return {
        "schema": SCHEMA,
        "snapshot": report.path,
        "ok": report.ok,
        "bytes_checked": report.bytes_checked,
        "pieces_checked": report.pieces_checked,
        "problems": [problem._asdict() for problem in report.problems],
    }


def _print(report: VerifyReport) -> None:
    out = console()
    checked = f"{plural(report.pieces_checked, 'piece')}, {format_bytes(report.bytes_checked)} read and checksummed"
    if report.ok:
        out.print(Text(f"OK: {report.path}: {checked}", style="green"))
        return
    table = Table(title=Text(f"{report.path}: {plural(len(report.problems), 'problem')}"), title_justify="left")
    table.add_column("logical path", overflow="fold")
    table.add_column("kind", no_wrap=True)
    table.add_column("location", overflow="fold")
    table.add_column("message", overflow="fold")
    for problem in report.problems:
        table.add_row(Text(problem.logical_path or "-"), problem.kind, Text(problem.location), Text(problem.message))
    print_table(out, table)
    out.print(Text(f"DAMAGED: {report.path}: {checked}; restore from another snapshot", style="red"))
