"""``snapshotkit export SNAPSHOT OUT`` and ``snapshotkit import SRC OUT``: snapshots out to, and
checkpoints in from, torch.save, safetensors, DCP (and torchsnapshot, in).

Thin faces of :func:`snapshotkit.convert.export_snapshot` and
:func:`snapshotkit.convert.import_snapshot`. Nothing is unpickled beyond tensors and plain values
unless ``--unsafe`` is given (``weights_only=False``, for snapshots and sources you trust).
"""

from __future__ import annotations

from collections.abc import Sequence

import click
from rich.text import Text

from snapshotkit._format.foreign import SOURCE_FORMATS
from snapshotkit._text import first_few
from snapshotkit.cli._common import (
    EXIT_OK,
    Common,
    byte_size,
    command_options,
    console,
    emit_json,
    format_bytes,
    memory_budget_option,
    plural,
    progress_option,
    show_progress,
)
from snapshotkit.convert import export_snapshot, import_snapshot

IMPORT_SCHEMA = "snapshotkit.import/1"
EXPORT_SCHEMA = "snapshotkit.export/1"
#: Skipped paths named without --verbose (the rest are counted).
_SHOWN_SKIPPED = 5


@click.command()
@click.argument("snapshot")
@click.argument("out")
@click.option(
    "--to", "to", type=click.Choice(["torch", "safetensors", "dcp"]), required=True, help="The format to write."
)
@click.option(
    "--select",
    multiple=True,
    metavar="GLOB",
    help="Only the logical paths matching this glob (repeatable; e.g. 'model/**').",
)
@click.option("--strip-prefix", default=None, help="Removed from the start of every selected path (e.g. 'model/').")
@click.option(
    "--max-shard-bytes",
    default=None,
    metavar="BYTES",
    callback=byte_size,
    help="safetensors: write Hugging Face shards of at most this size and model.safetensors.index.json.",
)
@click.option(
    "--config",
    "config",
    default=None,
    metavar="PATH",
    type=click.Path(exists=True, path_type=str),
    help="safetensors: the model's config.json (or its directory); OUT becomes a directory that transformers' "
    "from_pretrained loads (config.json, weights, tied copies left out as save_pretrained does).",
)
@click.option("--unsafe", is_flag=True, help="Unpickle arbitrary stored objects (weights_only=False).")
@click.option("--verbose", "-v", is_flag=True, help="List every skipped value (default: a count and the first few).")
@memory_budget_option
@progress_option
@command_options
def export(
    snapshot: str,
    out: str,
    to: str,
    select: tuple[str, ...],
    strip_prefix: str | None,
    max_shard_bytes: int | None,
    config: str | None,
    unsafe: bool,
    verbose: bool,
    memory_budget_bytes: int | None,
    progress: bool | None,
    *,
    common: Common,
) -> int:
    """Write SNAPSHOT as a torch.save file, safetensors file(s) or a DCP directory at OUT (a local
    path that does not exist yet), for torch.load, safetensors / Hugging Face loaders or
    torch.distributed.checkpoint.load; with --config, a directory for transformers' from_pretrained.
    Values a format cannot hold are skipped: counted by reason, the first few named (--verbose lists
    each)."""
    if config is not None and to != "safetensors":
        raise click.BadOptionUsage(
            "config", f"--config writes the safetensors weights from_pretrained loads; use --to safetensors, not {to}"
        )
    report = export_snapshot(
        snapshot,
        out,
        to=to,
        select=list(select) or None,
        strip_prefix=strip_prefix,
        max_shard_bytes=max_shard_bytes,
        storage_options=common.storage_options,
        memory_budget_bytes=memory_budget_bytes,
        weights_only=not unsafe,
        progress=show_progress(progress, common),
        config=config,
    )
    if common.json:
        emit_json(
            {
                "schema": EXPORT_SCHEMA,
                "format": report.format,
                "files": list(report.files),
                "tensors_written": report.tensors_written,
                "bytes_written": report.bytes_written,
                "skipped": [{"logical_path": path, "reason": reason} for path, reason in report.skipped],
            }
        )
        return EXIT_OK
    out_console = console()
    out_console.print(
        Text(
            f"exported {snapshot} -> {out} as {report.format}: {plural(report.tensors_written, 'tensor')}, "
            f"{format_bytes(report.bytes_written)} in {plural(len(report.files), 'file')}"
        )
    )
    if verbose:
        for path, reason in report.skipped:
            out_console.print(Text(f"skipped {path}: {reason}"))
    else:
        for line in skipped_summary(report.skipped):
            out_console.print(Text(line))
    return EXIT_OK


def skipped_summary(skipped: Sequence[tuple[str, str]]) -> list[str]:
    """One line per distinct reason: how many values were skipped for it, and the first few paths
    (``--verbose`` lists every path instead)."""
    by_reason: dict[str, list[str]] = {}
    for path, reason in skipped:
        by_reason.setdefault(reason, []).append(path)
    lines = [
        f"skipped {plural(len(paths), 'value')} ({reason}): {first_few(paths, _SHOWN_SKIPPED)}"
        for reason, paths in by_reason.items()
    ]
    if len(skipped) > _SHOWN_SKIPPED:
        lines.append(f"{plural(len(skipped), 'value')} skipped in all; --verbose lists each one")
    return lines


@click.command(name="import")
@click.argument("src")
@click.argument("out")
@click.option(
    "--from",
    "source",
    type=click.Choice(sorted(SOURCE_FORMATS)),
    default=None,
    help="The source's format (default: detected from its files).",
)
@click.option(
    "--key",
    default="model",
    show_default=True,
    help="The app_state key a safetensors file (or a bare state dict) goes under.",
)
@click.option(
    "--unsafe",
    is_flag=True,
    help="Unpickle arbitrary objects of the source (weights_only=False): only for sources you trust.",
)
@click.option("--verbose", "-v", is_flag=True, help="List every skipped value (default: a count and the first few).")
@memory_budget_option
@progress_option
@command_options
def import_(
    src: str,
    out: str,
    source: str | None,
    key: str,
    unsafe: bool,
    verbose: bool,
    memory_budget_bytes: int | None,
    progress: bool | None,
    *,
    common: Common,
) -> int:
    """Convert the checkpoint SRC (a torch.save file, a safetensors file or Hugging Face sharded
    directory, a DCP checkpoint, a torchsnapshot snapshot) into a snapshot at OUT.

    OUT may be any URL snapshotkit writes to (--storage-option applies to it); it must not hold a
    snapshot yet. The result restores with Snapshot(OUT).restore({...}) like any snapshot.
    """
    report = import_snapshot(
        src,
        out,
        source=source,
        key=key,
        storage_options=common.storage_options,
        memory_budget_bytes=memory_budget_bytes,
        weights_only=not unsafe,
        progress=show_progress(progress, common),
    )
    if common.json:
        emit_json(
            {
                "schema": IMPORT_SCHEMA,
                "source_format": report.source_format,
                "source": report.source,
                "snapshot": report.path,
                "logical_paths": list(report.logical_paths),
                "bytes": report.nbytes,
                "seconds": report.seconds,
                "skipped_paths": list(report.skipped_paths),
            }
        )
        return EXIT_OK
    out_console = console()
    out_console.print(
        Text(
            f"imported {report.source_format} checkpoint {report.source} -> {report.path}: "
            f"{plural(len(report.logical_paths), 'logical path')}, {format_bytes(report.nbytes)} "
            f"in {report.seconds:.2f} s"
        )
    )
    skipped = report.skipped_paths
    if verbose or len(skipped) <= _SHOWN_SKIPPED:
        for path in skipped:
            out_console.print(Text(f"skipped: {path}"))
    else:
        shown = first_few(skipped, _SHOWN_SKIPPED)
        out_console.print(Text(f"skipped {plural(len(skipped), 'path')}: {shown}; --verbose lists each one"))
    return EXIT_OK
