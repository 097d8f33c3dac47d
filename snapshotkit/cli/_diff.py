"""``snapshotkit diff A B``: logical paths added, removed and changed, tensor values within a tolerance."""

from __future__ import annotations

import dataclasses
from typing import Any

import click
from rich.table import Table
from rich.text import Text

from snapshotkit.cli._common import (
    EXIT_FOUND,
    EXIT_OK,
    Common,
    command_options,
    console,
    emit_json,
    format_number,
    memory_budget_option,
    print_table,
)
from snapshotkit.diff import DiffReport, diff_snapshots

SCHEMA = "snapshotkit.diff/1"


@click.command()
@click.argument("a")
@click.argument("b")
@click.option("--atol", type=click.FloatRange(min=0), default=0.0, show_default=True, help="Absolute tolerance.")
@click.option("--rtol", type=click.FloatRange(min=0), default=0.0, show_default=True, help="Relative tolerance (of B).")
@memory_budget_option
@command_options
def diff(a: str, b: str, atol: float, rtol: float, memory_budget_bytes: int | None, *, common: Common) -> int:
    """Compare snapshot A with snapshot B; exit status 1 when they differ.

    Logical paths only B has (added), only A has (removed), and those whose kind, dtype, shape
    or value differ (changed; for tensors: how many elements differ beyond
    |a - b| <= atol + rtol * |b|, and the largest |a - b|). Values are read tensor by tensor
    under --memory-budget with every checksum verified; objects are compared by their stored
    bytes, never unpickled.
    """
    report = diff_snapshots(
        a, b, atol=atol, rtol=rtol, storage_options=common.storage_options, memory_budget_bytes=memory_budget_bytes
    )
    if common.json:
        emit_json(to_json(report))
    else:
        _print(report)
    return EXIT_OK if report.identical else EXIT_FOUND


def to_json(report: DiffReport) -> dict[str, Any]:
    return {
        "schema": SCHEMA,
        "a": report.a,
        "b": report.b,
        "atol": report.atol,
        "rtol": report.rtol,
        "identical": report.identical,
        "compared": report.compared,
        "added": list(report.added),
        "removed": list(report.removed),
        "changed": [dataclasses.asdict(change) for change in report.changed],
    }


def _print(report: DiffReport) -> None:
    out = console()
    for heading, paths, sign, style in (
        ("removed (only in A)", report.removed, "-", "red"),
        ("added (only in B)", report.added, "+", "green"),
    ):
        if paths:
            out.print(Text(heading, style="italic"))
            for path in paths:
                out.print(Text(f"{sign} {path}", style=style))
    if report.changed:
        table = Table(title="changed", title_justify="left")
        table.add_column("logical path", overflow="fold")
        table.add_column("what", no_wrap=True)
        table.add_column("A -> B", overflow="fold")
        table.add_column("differing", justify="right", no_wrap=True)
        table.add_column("max |a-b|", justify="right", no_wrap=True)
        for change in report.changed:
            sides = change.a if change.what == "values" else f"{change.a} -> {change.b}"
            differing = "-" if change.mismatched is None else str(change.mismatched)
            largest = format_number(change.max_abs_diff)
            table.add_row(Text(change.logical_path), change.what, Text(sides), differing, largest)
        print_table(out, table)
    verdict = "identical" if report.identical else "differ"
    counts = f"{len(report.added)} added, {len(report.removed)} removed, {len(report.changed)} changed"
    tolerance = f" (atol={report.atol:g}, rtol={report.rtol:g})" if report.atol or report.rtol else ""
    out.print(Text(f"{verdict}: {counts} of {report.compared} paths both hold{tolerance}"))
