"""``snapshotkit show SNAPSHOT LOGICAL_PATH``: one value; for a tensor, statistics streamed under the budget."""

from __future__ import annotations

import math
from typing import Any

import click
from rich.table import Table
from rich.text import Text

from snapshotkit._config import Config
from snapshotkit._format.entries import (
    DictEntry,
    Entry,
    ListEntry,
    ObjectEntry,
    PrimitiveEntry,
    ShardedTensorEntry,
    TensorEntry,
)
from snapshotkit._format.serialization import dtype_from_name
from snapshotkit._inspect.reader import SnapshotReader
from snapshotkit._inspect.stats import StatsAccumulator, is_numeric, stream_stats, tensor_stats
from snapshotkit._inspect.summary import entry_kind, entry_nbytes
from snapshotkit._plan.flatten import join_path
from snapshotkit._restore.plan import close_matches, rank_view
from snapshotkit.cli._common import (
    EXIT_OK,
    Common,
    command_options,
    console,
    emit_json,
    format_bytes,
    format_number,
    memory_budget_option,
    print_table,
)
from snapshotkit.errors import LogicalPathNotFoundError
from snapshotkit.snapshot import Snapshot

SCHEMA = "snapshotkit.show/1"
_REPR_CHARS = 2000


@click.command()
@click.argument("snapshot")
@click.argument("logical_path")
@memory_budget_option
@click.option(
    "--count", type=click.IntRange(min=0), default=10, show_default=True, help="How many first values to show."
)
@command_options
def show(snapshot: str, logical_path: str, memory_budget_bytes: int | None, count: int, *, common: Common) -> int:
    """Show the value at LOGICAL_PATH of SNAPSHOT (e.g. model/layer1.weight; 1/optim/step for rank 1's).

    A tensor: dtype, shape, min/max/mean/std (float64, over finite elements; of |x| for complex
    dtypes), NaN and Inf counts, and the first --count values. Raw and sharded tensors are read
    piece by piece under --memory-budget, whatever their size; a tensor stored through torch.save
    (quantized, sparse) is read whole. An object or primitive: its repr (truncated). A
    container: its children. Objects load with weights_only=True.
    """
    handle = Snapshot(snapshot, storage_options=common.storage_options)
    entry = _resolve(handle, logical_path)
    document: dict[str, Any] = {
        "schema": SCHEMA,
        "snapshot": handle.path,
        "logical_path": logical_path,
        "kind": entry_kind(entry),
        "bytes": entry_nbytes(entry),
    }
    if isinstance(entry, (TensorEntry, ShardedTensorEntry)):
        shards = len(entry.shards) if isinstance(entry, ShardedTensorEntry) else None
        document.update(dtype=entry.dtype, shape=list(entry.shape), numel=math.prod(entry.shape), shards=shards)
        stats = _tensor_stats(handle, logical_path, entry, memory_budget_bytes, count, common)
        document["stats"] = _stats_json(stats) if stats is not None else None
        document["first_values"] = [_scalar(v) for v in stats.first_values()] if stats is not None else None
    elif isinstance(entry, (ObjectEntry, PrimitiveEntry)):
        value = (
            entry.value
            if isinstance(entry, PrimitiveEntry)
            else handle.read_object(logical_path, memory_budget_bytes=memory_budget_bytes)
        )
        text = repr(value)
        document.update(
            type=entry.value_type if isinstance(entry, PrimitiveEntry) else entry.obj_type,
            repr=text if len(text) <= _REPR_CHARS else text[:_REPR_CHARS] + "...",
            truncated=len(text) > _REPR_CHARS,
        )
    else:
        keys = (
            entry.keys if isinstance(entry, DictEntry) else range(entry.length) if isinstance(entry, ListEntry) else ()
        )
        prefix = logical_path.rstrip("/")
        document["children"] = [join_path(prefix, key) for key in keys]
    if common.json:
        emit_json(document)
    else:
        _print(document)
    return EXIT_OK


def _resolve(handle: Snapshot, logical_path: str) -> Entry:
    """The entry ``read_object`` would read for ``logical_path`` (``"<rank>/..."`` picks a rank's view)."""
    metadata = handle.metadata
    view = rank_view(metadata, 0)
    if logical_path in view:
        return view[logical_path]
    head, _, rest = logical_path.partition("/")
    if head.isdigit() and rest and rest in (prefixed := rank_view(metadata, int(head))):
        return prefixed[rest]
    raise LogicalPathNotFoundError(
        f"logical path {logical_path!r} is not in the snapshot at {handle.path!r}{close_matches(logical_path, view)}. "
        f"List the paths with `snapshotkit info {handle.path}`"
    )


def _tensor_stats(
    handle: Snapshot,
    logical_path: str,
    entry: TensorEntry | ShardedTensorEntry,
    memory_budget_bytes: int | None,
    count: int,
    common: Common,
) -> StatsAccumulator | None:
    if isinstance(entry, TensorEntry) and entry.serializer != "raw":
        return tensor_stats(handle.read_object(logical_path, memory_budget_bytes=memory_budget_bytes), count)
    if not is_numeric(dtype_from_name(entry.dtype)):
        return None
    config = Config.resolve(memory_budget_bytes=memory_budget_bytes, verify_checksums=True)
    with SnapshotReader(handle.path, common.storage_options, config, bases=handle.metadata.bases) as reader:
        return stream_stats(reader, logical_path, entry, count)


def _stats_json(stats: StatsAccumulator) -> dict[str, Any]:
    found = stats.result()
    return {
        "count": found.count,
        "finite": found.finite,
        "nan": found.nan,
        "inf": found.inf,
        "min": found.minimum,
        "max": found.maximum,
        "mean": found.mean,
        "std": found.std,
        "of_abs": found.of_abs,
    }


def _scalar(value: Any) -> Any:
    return value if isinstance(value, (bool, int, float)) else str(value)


def _print(document: dict[str, Any]) -> None:
    out = console()
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold")
    grid.add_column()
    grid.add_row("logical path", Text(document["logical_path"]))
    kind = document["kind"]
    if "dtype" in document:
        shards = f", {document['shards']} shards" if document["shards"] is not None else ""
        grid.add_row(kind, f"{document['dtype']} {document['shape']} ({document['numel']} elements{shards})")
        grid.add_row("stored", f"{format_bytes(document['bytes'])} ({document['bytes']} bytes)")
        stats = document["stats"]
        if stats is None:
            grid.add_row("values", f"dtype {document['dtype']} has no numeric value to summarize")
        else:
            of = " (of |x|)" if stats["of_abs"] else ""
            grid.add_row(
                f"stats{of}",
                "  ".join(f"{name} {format_number(stats[name])}" for name in ("min", "max", "mean", "std")),
            )
            grid.add_row("non-finite", f"nan {stats['nan']}  inf {stats['inf']}  (of {stats['count']})")
            first = document["first_values"]
            more = " ..." if len(first) < document["numel"] else ""
            grid.add_row(f"first {len(first)}", Text(", ".join(_short(v) for v in first) + more))
    elif "repr" in document:
        grid.add_row(kind, Text(document["type"]))
        if kind == "object":
            grid.add_row("stored", f"{format_bytes(document['bytes'])} ({document['bytes']} bytes)")
        grid.add_row("value", Text(document["repr"]))
    else:
        children = document["children"]
        grid.add_row(kind, f"{len(children)} children")
        for child in children[:50]:
            grid.add_row("", Text(child))
        if len(children) > 50:
            grid.add_row("", f"... and {len(children) - 50} more")
    print_table(out, grid)


def _short(value: Any) -> str:
    return format_number(value) if isinstance(value, float) else str(value)
