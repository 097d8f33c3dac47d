"""``snapshotkit import SRC OUT``: another library's checkpoint in, a snapshot out.

A thin face of :func:`snapshotkit.convert.import_snapshot`: the source's format is detected
unless ``--from`` names it; nothing from the source is unpickled beyond tensors and plain values
unless ``--unsafe`` is given (``weights_only=False``, for sources you trust).
"""

from __future__ import annotations

import click
from rich.text import Text

from snapshotkit._format.foreign import SOURCE_FORMATS
from snapshotkit.cli._common import (
    EXIT_OK,
    Common,
    command_options,
    console,
    emit_json,
    format_bytes,
    memory_budget_option,
    plural,
)
from snapshotkit.convert import import_snapshot

IMPORT_SCHEMA = "snapshotkit.import/1"


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
@memory_budget_option
@command_options
def import_(
    src: str, out: str, source: str | None, key: str, unsafe: bool, memory_budget_bytes: int | None, *, common: Common
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
    for path in report.skipped_paths:
        out_console.print(Text(f"skipped: {path}"))
    return EXIT_OK
