"""``snapshotkit prune ROOT`` and ``snapshotkit cleanup ROOT``: a SnapshotManager's retention and clean-up, on demand.

Both go through the manager's own housekeeping (:mod:`snapshotkit._lifecycle.janitor`), so they
delete exactly what a manager would: prune only snapshots a manager wrote (the record in their
user metadata), never the newest; cleanup only ``step_<n>`` directories without a manifest whose
every object is one a take writes. Deletion removes the manifest first.
"""

from __future__ import annotations

from typing import Any

import click
from rich.text import Text

from snapshotkit._config import snapshot_path
from snapshotkit._lifecycle.janitor import RootJanitor
from snapshotkit._lifecycle.retention import RetentionPolicy
from snapshotkit.cli._common import EXIT_OK, Common, command_options, console, emit_json, plural

PRUNE_SCHEMA = "snapshotkit.prune/1"
CLEANUP_SCHEMA = "snapshotkit.cleanup/1"


def _steps(janitor: RootJanitor, steps: list[int]) -> list[dict[str, Any]]:
    return [{"step": step, "path": janitor.path(step)} for step in steps]


@click.command()
@click.argument("root")
@click.option("--keep-last", type=click.IntRange(min=1), default=None, help="Keep the newest N snapshots.")
@click.option("--keep-every", type=click.IntRange(min=1), default=None, help="Also keep steps that are multiples of K.")
@click.option("--keep-best", type=click.IntRange(min=1), default=None, help="Also keep the best N by --best-metric.")
@click.option("--best-metric", default=None, help="The saved metric --keep-best ranks by (e.g. val_loss).")
@click.option("--best-mode", type=click.Choice(["min", "max"]), default="min", show_default=True)
@click.option("--dry-run", is_flag=True, help="List what would be deleted; delete nothing.")
@command_options
def prune(
    root: str,
    keep_last: int | None,
    keep_every: int | None,
    keep_best: int | None,
    best_metric: str | None,
    best_mode: str,
    dry_run: bool,
    *,
    common: Common,
) -> int:
    """Delete the snapshots under ROOT that SnapshotManager's retention would not keep.

    The policy is the manager's: keep the newest --keep-last, every step that is a multiple of
    --keep-every, the --keep-best best by --best-metric, and always the newest; and every snapshot
    that a kept one reads from (the base of an incremental snapshot). Only snapshots a
    SnapshotManager wrote are ever deleted (not ones taken by hand, nor anything else under ROOT).
    Incomplete snapshots are left to `snapshotkit cleanup`.
    """
    if keep_last is None and keep_best is None:
        raise click.UsageError(
            "give --keep-last N (and/or --keep-best N --best-metric NAME): without either, nothing is pruned"
        )
    policy = RetentionPolicy(keep_last, keep_every, keep_best, best_metric, best_mode)  # type: ignore[arg-type]
    janitor = RootJanitor(snapshot_path(root).rstrip("/"), common.storage_options)
    committed = janitor.listing().committed
    deleted = janitor.retain(policy, dry_run=dry_run)
    kept = [step for step in committed if step not in deleted]
    if common.json:
        emit_json(
            {
                "schema": PRUNE_SCHEMA,
                "root": janitor.root,
                "dry_run": dry_run,
                "deleted": _steps(janitor, deleted),
                "kept": _steps(janitor, kept),
            }
        )
        return EXIT_OK
    out = console()
    verb = "would delete" if dry_run else "deleted"
    for step in deleted:
        out.print(Text(f"{verb} step {step}: {janitor.path(step)}"))
    kept_text = ", ".join(map(str, kept)) or "none"
    out.print(Text(f"{len(deleted)} {'to delete' if dry_run else 'deleted'}; kept steps: {kept_text}"))
    return EXIT_OK


@click.command()
@click.argument("root")
@click.option("--dry-run", is_flag=True, help="List what would be removed; remove nothing.")
@command_options
def cleanup(root: str, dry_run: bool, *, common: Common) -> int:
    """Remove the incomplete snapshots under ROOT, as SnapshotManager(ROOT).cleanup() does.

    An incomplete snapshot is a step_<n> directory without a manifest: a take that never
    committed, or a deletion cut short. A directory that also holds objects a take does not
    write is left alone (and listed). Do not run this while a job is writing into ROOT: its
    take in flight looks incomplete until it commits.
    """
    janitor = RootJanitor(snapshot_path(root).rstrip("/"), common.storage_options)
    removed, listing = janitor.cleanup(None, dry_run=dry_run)
    left = [step for step in listing.incomplete if step not in removed]
    if common.json:
        emit_json(
            {
                "schema": CLEANUP_SCHEMA,
                "root": janitor.root,
                "dry_run": dry_run,
                "removed": _steps(janitor, removed),
                "left_alone": _steps(janitor, left),
            }
        )
        return EXIT_OK
    out = console()
    verb = "would remove" if dry_run else "removed"
    for step in removed:
        out.print(Text(f"{verb} incomplete step {step}: {janitor.path(step)}"))
    for step in left:
        out.print(Text(f"left alone step {step}: {janitor.path(step)} holds objects snapshotkit does not write"))
    out.print(Text(f"{plural(len(removed), 'incomplete snapshot')} {'to remove' if dry_run else 'removed'}"))
    return EXIT_OK
