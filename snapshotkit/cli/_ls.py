"""``snapshotkit ls ROOT``: the ``step_<n>`` snapshots under a root, oldest first."""

from __future__ import annotations

import os
from typing import Any

import click
from rich.table import Table
from rich.text import Text

from snapshotkit._config import snapshot_path
from snapshotkit._format.entries import METADATA_FILENAME
from snapshotkit._format.steps import step_of
from snapshotkit._inspect.root import RootSummary, StepSummary, summarize_root
from snapshotkit.cli._common import (
    EXIT_ERROR,
    EXIT_OK,
    Common,
    command_options,
    compact_json,
    console,
    emit_json,
    is_plain,
    print_table,
)
from snapshotkit.cli._common import format_bytes as human

SCHEMA = "snapshotkit.ls/1"


@click.command()
@click.argument("root")
@command_options
def ls(root: str, *, common: Common) -> int:
    """List the step_<n> snapshots under ROOT (a SnapshotManager's root), oldest first.

    A snapshot at ROOT itself beside the steps (a take into ROOT instead of into a step) is
    reported after them, with how to move it into a step of its own.

    For each: step, status (complete, incomplete: a take that never committed, or damaged: the
    manifest fails its check), when it was taken, its size (manifest and data objects; unknown
    when incomplete), the metrics and reason a SnapshotManager saved with it, whether it is full
    or incremental and the snapshots it reads from (its bases), and the user metadata.
    """
    root = snapshot_path(root).rstrip("/")
    local = local_path(root)
    if local is not None and not os.path.isdir(local):
        click.echo(f"snapshotkit ls: error: no directory at {root!r}; check the path", err=True)
        return EXIT_ERROR
    summary = summarize_root(root, common.storage_options)
    if common.json:
        emit_json(to_json(summary))
    else:
        _print(summary)
    return EXIT_OK


def local_path(location: str) -> str | None:
    """The local directory a path or ``file://`` URI names; None for other schemes."""
    if location.lower().startswith("file://"):
        return location[len("file://") :]
    return None if "://" in location else location


def step_json(step: StepSummary) -> dict[str, Any]:
    return {
        "step": step.step,
        "path": step.path,
        "status": step.status,
        "complete": step.status == "complete",
        "created_at": step.created_at,
        "size_bytes": step.size_bytes,
        "metrics": step.metrics,
        "reason": step.reason,
        "user_metadata": step.user_metadata,
        "error": step.error,
        "kind": None if step.bases is None else "incremental" if step.bases else "full",
        "bases": None if step.bases is None else [_base_json(location) for location in step.bases],
    }


def _base_step(location: str) -> int | None:
    """The step of a base location ``"../step_<n>"`` (a sibling step snapshot), else None."""
    return step_of(location.removeprefix("../"))


def _base_json(location: str) -> dict[str, Any]:
    return {"location": location, "step": _base_step(location)}


def _base_text(step: StepSummary) -> str:
    if step.bases is None:
        return "-"
    if not step.bases:
        return "full"
    named = [f"step {n}" if (n := _base_step(location)) is not None else location for location in step.bases]
    return ", ".join(named)


def to_json(summary: RootSummary) -> dict[str, Any]:
    return {
        "schema": SCHEMA,
        "root": summary.root,
        "snapshots": [step_json(step) for step in summary.steps],
        "snapshot_at_root": summary.is_snapshot,
    }


def stray_warning(root: str) -> str:
    """What to say about a snapshot at ``root`` itself, beside its ``step_<n>`` snapshots."""
    return (
        f"warning: a snapshot sits at {root} itself ({root}/{METADATA_FILENAME} and {root}/data/), not in a "
        f"step: a take into the root instead of into {root}/step_<n>. No SnapshotManager counts, restores or "
        f"deletes it. To keep it, copy it into a step of its own: snapshotkit consolidate {root} {root}/step_<n>; "
        f"then remove it from the root: first {root}/{METADATA_FILENAME}, then {root}/data/"
    )


def _metric(name: str, value: float | None) -> str:
    return f"{name}={value:.6g}" if value is not None else f"{name}=nan"


def _print(summary: RootSummary) -> None:
    out = console()
    if not summary.steps:
        hint = f"; {summary.root!r} is itself a snapshot: try `snapshotkit info`" if summary.is_snapshot else ""
        out.print(Text(f"no step_<n> snapshots under {summary.root}{hint}"))
        return
    table = Table(title=Text(summary.root), title_justify="left", caption=Text(f"paths: {summary.root}/step_<step>"))
    table.add_column("step", justify="right", no_wrap=True)
    table.add_column("status", no_wrap=True)
    table.add_column("created (UTC)", no_wrap=True)
    table.add_column("size", justify="right", no_wrap=True)
    table.add_column("base", min_width=4)
    table.add_column("metrics (reason)", min_width=12)
    table.add_column("user metadata", overflow="fold", min_width=12)
    for step in summary.steps:
        metrics = " ".join(_metric(name, value) for name, value in (step.metrics or {}).items())
        if step.reason is not None:
            metrics = f"{metrics} ({step.reason})".strip()
        status = Text(step.status, style="green" if step.status == "complete" else "yellow")
        created = (step.created_at or "-").replace("+00:00", "").replace("T", " ")
        shown = compact_json(step.user_metadata, limit=None if is_plain(out) else 60)
        metadata = shown if step.user_metadata else step.error or "-"
        table.add_row(
            str(step.step),
            status,
            created,
            human(step.size_bytes),
            Text(_base_text(step)),
            Text(metrics or "-"),
            Text(metadata),
        )
    print_table(out, table)
    complete = [s for s in summary.steps if s.status == "complete"]
    total = sum(s.size_bytes or 0 for s in complete)
    others = len(summary.steps) - len(complete)
    tail = f", {others} not complete" if others else ""
    out.print(Text(f"{len(summary.steps)} snapshots: {len(complete)} complete ({human(total)}){tail}"))
    if summary.is_snapshot:
        out.print(Text(stray_warning(summary.root), style="yellow"))
