"""``snapshotkit info SNAPSHOT``: the header, where the bytes are (the snapshot itself, or its bases
for an incremental one), totals by dtype and a tree of logical paths (manifest only)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import click
from rich.table import Table
from rich.text import Text
from rich.tree import Tree

from snapshotkit._format.document import SnapshotMetadata
from snapshotkit._inspect.root import refuse_stray_at_root
from snapshotkit._inspect.summary import (
    DtypeTotal,
    Leaf,
    StorageSplit,
    TreeNode,
    containers,
    dtype_totals,
    leaves,
    storage_split,
    tree,
)
from snapshotkit._lifecycle.catalog import MANAGER_KEY
from snapshotkit.cli._common import (
    EXIT_OK,
    Common,
    cell_text,
    command_options,
    compact_json,
    console,
    emit_json,
    format_bytes,
    format_number,
    is_plain,
    plural,
    print_lines,
    print_table,
)
from snapshotkit.snapshot import Snapshot

SCHEMA = "snapshotkit.info/1"


@click.command()
@click.argument("snapshot")
@click.option(
    "--depth",
    type=click.IntRange(min=1),
    default=3,
    show_default=True,
    help="Show the tree down to this many path components; deeper nodes are summed into their parent.",
)
@command_options
def info(snapshot: str, depth: int, *, common: Common) -> int:
    """Describe SNAPSHOT from its manifest, reading no data.

    The header (format and versions, snapshot id, when it was taken, world size, user metadata),
    where its bytes are (self-contained, or for an incremental snapshot: bytes stored in it and
    bytes referenced in each base, with the base's path and snapshot id), stored tensors by dtype
    (count and bytes), and the tree of logical paths down to --depth with each leaf's dtype, shape,
    bytes and sharding: replicated (stored once for every rank), per-rank (each rank its own) or
    sharded (a DTensor/ShardedTensor, with its shard count).

    A folder of step_<n> snapshots is described as one, also when a snapshot was taken into the
    folder itself (a stray beside the steps, which `snapshotkit ls` says how to move).
    """
    handle = Snapshot(snapshot, storage_options=common.storage_options)
    metadata = handle.metadata
    refuse_stray_at_root(handle.path, common.storage_options)
    found = leaves(metadata)
    nodes = tree(found, containers(metadata), depth)
    totals = dtype_totals(metadata)
    split = storage_split(metadata, handle.path)
    if common.json:
        emit_json(to_json(handle.path, metadata, found, totals, nodes, depth, split))
    else:
        _print(handle.path, metadata, found, totals, nodes, split)
    return EXIT_OK


def _leaf_json(leaf: Leaf | None) -> dict[str, Any]:
    if leaf is None:
        return {"dtype": None, "shape": None, "sharding": None, "ranks": None, "shards": None, "type": None}
    return {
        "dtype": leaf.dtype,
        "shape": list(leaf.shape) if leaf.shape is not None else None,
        "sharding": leaf.sharding,
        "ranks": list(leaf.ranks),
        "shards": leaf.shards,
        "type": leaf.detail,
    }


def to_json(
    path: str,
    metadata: SnapshotMetadata,
    found: list[Leaf],
    totals: list[DtypeTotal],
    nodes: list[TreeNode],
    depth: int,
    split: StorageSplit,
) -> dict[str, Any]:
    return {
        "schema": SCHEMA,
        "snapshot": path,
        "format_version": metadata.format_version,
        "snapshotkit_version": metadata.snapshotkit_version,
        "torch_version": metadata.torch_version,
        "created_at": metadata.created_at,
        "world_size": metadata.world_size,
        "user_metadata": metadata.user_metadata,
        "snapshot_id": metadata.snapshot_id,
        "storage": {
            "self_contained": split.self_contained,
            "stored_bytes": split.stored_bytes,
            "referenced_bytes": split.referenced_bytes,
            "bases": [
                {
                    "location": use.location,
                    "path": use.path,
                    "snapshot_id": use.snapshot_id,
                    "bytes": use.nbytes,
                    "pieces": use.pieces,
                }
                for use in split.bases
            ],
        },
        "totals": {
            "leaves": len(found),
            "bytes": sum(leaf.nbytes for leaf in found),
            "by_dtype": [{"dtype": t.dtype, "count": t.count, "bytes": t.nbytes} for t in totals],
        },
        "depth": depth,
        "nodes": [
            {
                "path": node.path,
                "depth": node.depth,
                "kind": node.kind,
                "leaf": node.leaf is not None,
                "leaves": node.leaves,
                "bytes": node.nbytes,
                "truncated": node.truncated,
                **_leaf_json(node.leaf),
            }
            for node in nodes
        ],
    }


def _sharding(leaf: Leaf, world_size: int) -> str:
    if leaf.sharding == "sharded":
        return f"sharded ({leaf.shards} shards)"
    if leaf.sharding == "replicated":
        return "replicated"
    if world_size == 1:
        return ""
    return f"per-rank ({len(leaf.ranks)} of {world_size} ranks)"


def _label(node: TreeNode, world_size: int, *, whole_path: bool = False) -> Text:
    """A tree node: its name (its whole logical path with ``whole_path``) and what it holds."""
    name = node.path if whole_path else node.path.rsplit("/", 1)[-1]
    leaf = node.leaf
    if leaf is None:
        text = Text(f"{name}/", style="bold")
        what = f"{node.kind}, {node.leaves} leaves, {format_bytes(node.nbytes)}"
        text.append(f"  {what}{', deeper levels summed' if node.truncated else ''}", style="dim")
        return text
    text = Text(name)
    if leaf.dtype is not None:
        parts = [f"{leaf.dtype} {list(leaf.shape or ())}", format_bytes(leaf.nbytes)]
    elif leaf.kind == "object":
        parts = [f"object {leaf.detail}", format_bytes(leaf.nbytes)]
    elif leaf.kind == "primitive":
        parts = [f"{leaf.detail}"]
    else:
        parts = [f"empty {leaf.kind}"]
    sharding = _sharding(leaf, world_size)
    text.append("  " + "  ".join(p for p in [*parts, sharding] if p), style="cyan")
    return text


def _storage_rows(split: StorageSplit) -> list[tuple[str, Text]]:
    if split.self_contained:
        return [("storage", Text(f"self-contained, {format_bytes(split.stored_bytes)} stored"))]
    rows = [
        (
            "storage",
            Text(
                f"incremental: {format_bytes(split.stored_bytes)} stored here, "
                f"{format_bytes(split.referenced_bytes)} referenced in {plural(len(split.bases), 'base')}"
            ),
        )
    ]
    for use in split.bases:
        text = f"{use.location} = {use.path}  id {use.snapshot_id}  {format_bytes(use.nbytes)} referenced"
        rows.append(("base", Text(f"{text} ({plural(use.pieces, 'piece')})")))
    return rows


def _print(
    path: str,
    metadata: SnapshotMetadata,
    found: list[Leaf],
    totals: list[DtypeTotal],
    nodes: list[TreeNode],
    split: StorageSplit,
) -> None:
    out = console()
    header = Table.grid(padding=(0, 2))
    header.add_column(style="bold")
    header.add_column()
    header.add_row("snapshot", Text(path))
    header.add_row("format", f"version {metadata.format_version}")
    header.add_row("snapshot id", metadata.snapshot_id or "- (format version 3 and older have none)")
    header.add_row("written by", f"snapshotkit {metadata.snapshotkit_version}, torch {metadata.torch_version}")
    header.add_row("created", metadata.created_at)
    header.add_row("world size", str(metadata.world_size))
    user = {key: value for key, value in metadata.user_metadata.items() if key != MANAGER_KEY}
    limit = None if is_plain(out) else 200
    header.add_row("user metadata", Text(compact_json(user, limit=limit) if user else "-"))
    record = metadata.user_metadata.get(MANAGER_KEY)
    if isinstance(record, Mapping):
        header.add_row("saved by", Text(_manager_text(record)))
    header.add_row("leaves", f"{len(found)} ({format_bytes(sum(leaf.nbytes for leaf in found))} of values)")
    for name, text in _storage_rows(split):
        header.add_row(name, text)
    print_table(out, header)
    if totals:
        table = Table(title="stored values by dtype", title_justify="left")
        table.add_column("dtype")
        table.add_column("count", justify="right")
        table.add_column("bytes", justify="right")
        for total in totals:
            table.add_row(total.dtype, str(total.count), f"{format_bytes(total.nbytes)} ({total.nbytes})")
        print_table(out, table)
    if is_plain(out):
        # One node a line, by its whole logical path (grep finds a path, not a last component).
        print_lines(out, [path, *(cell_text(_label(node, metadata.world_size, whole_path=True)) for node in nodes)])
        return
    root = Tree(Text(path, style="bold"))
    branches: dict[str, Tree] = {"": root}
    for node in nodes:
        parent = node.path.rsplit("/", 1)[0] if "/" in node.path else ""
        branches[node.path] = branches[parent].add(_label(node, metadata.world_size))
    out.print(root)


def _manager_text(record: Mapping[str, Any]) -> str:
    """``SnapshotManager, step 3000, loss=0.333333 (interval)``: the record a manager's save left."""
    metrics = record.get("metrics")
    named = [
        f"{name}={format_number(value) if isinstance(value, float) else value}"
        for name, value in (metrics.items() if isinstance(metrics, Mapping) else ())
    ]
    reason = f" ({record['reason']})" if record.get("reason") else ""
    return ", ".join(["SnapshotManager", f"step {record.get('step')}", *named]) + reason
