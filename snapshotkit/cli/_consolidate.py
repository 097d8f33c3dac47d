"""``snapshotkit consolidate SRC DST``: a self-contained copy of a snapshot (incremental or not).

A thin face of :func:`snapshotkit.convert.consolidate_snapshot`; what it reports comes from the
manifests of the source and of the copy (:func:`~snapshotkit._inspect.summary.storage_split`).
"""

from __future__ import annotations

import time

import click
from rich.text import Text

from snapshotkit._inspect.pieces import data_object_bytes
from snapshotkit._inspect.summary import storage_split
from snapshotkit.cli._common import (
    EXIT_OK,
    Common,
    command_options,
    console,
    emit_json,
    format_bytes,
    memory_budget_option,
    plural,
    progress_option,
    show_progress,
)
from snapshotkit.convert import consolidate_snapshot
from snapshotkit.snapshot import Snapshot

SCHEMA = "snapshotkit.consolidate/1"


@click.command()
@click.argument("src")
@click.argument("dst")
@memory_budget_option
@progress_option
@command_options
def consolidate(src: str, dst: str, memory_budget_bytes: int | None, progress: bool | None, *, common: Common) -> int:
    """Copy the snapshot SRC to DST as a self-contained snapshot: every piece, its own and those an
    incremental SRC references in its bases, is copied (checksums verified) into DST, which then
    needs no base. DST may be any URL snapshotkit writes to and must not hold a snapshot yet; a
    failed copy commits nothing there. --storage-option applies to SRC, its bases and DST."""
    started_s = time.perf_counter()
    source = Snapshot(src, storage_options=common.storage_options)
    split = storage_split(source.metadata, source.path)
    copy = consolidate_snapshot(
        src,
        dst,
        storage_options=common.storage_options,
        memory_budget_bytes=memory_budget_bytes,
        progress=show_progress(progress, common),
    )
    objects = data_object_bytes(copy.metadata)
    seconds = time.perf_counter() - started_s
    if common.json:
        emit_json(
            {
                "schema": SCHEMA,
                "source": source.path,
                "snapshot": copy.path,
                "snapshot_id": copy.metadata.snapshot_id,
                "bytes": split.stored_bytes + split.referenced_bytes,
                "referenced_bytes": split.referenced_bytes,
                "bases": [use.location for use in split.bases],
                "data_objects": len(objects),
                "seconds": seconds,
            }
        )
        return EXIT_OK
    copied = format_bytes(split.stored_bytes + split.referenced_bytes)
    origin = (
        f" ({format_bytes(split.referenced_bytes)} of it from {plural(len(split.bases), 'base')}: "
        f"{', '.join(use.location for use in split.bases)})"
        if split.bases
        else ""
    )
    console().print(
        Text(
            f"consolidated {source.path} -> {copy.path}: {copied} copied{origin} into "
            f"{plural(len(objects), 'data object')} in {seconds:.2f} s; snapshot id {copy.metadata.snapshot_id}"
        )
    )
    return EXIT_OK
