"""Resharding by columns: DTensors taken on 4 gloo ranks, restored on 2 and 3.

Two scenarios (``--scenarios``), each in the same run for both layouts below:

``columns`` (issue 17 item 7)
    ``--ranks`` (default 4) ranks take ``--tensors`` float32 DTensors of ``--tensor-bytes`` each
    (default 2 x 256 MiB, 8,192 columns... rows follow), ``[Shard(1)]``; then each of
    ``--restore-ranks`` (default 2,3) world sizes restores them into ``[Shard(1)]`` DTensors of
    its own.
``inproc`` (issue 27)
    The ``rows`` table's 4 ``Shard(0)`` boxes as ``LocalChunks`` in this one process (no ranks,
    one thread: far less noise on a shared machine), taken and restored into the same 4 boxes
    on the local disk, ``whole`` and ``split`` alternating: the take's staging copies and the
    restore's tile copies, measured alone. Not run by default.
``rows`` (issue 27)
    ``--ranks`` ranks take one float32 table of ``--rows-bytes`` (default 1 GiB, 4,096 columns:
    ``[65536, 4096]``, as ``bench_dist.py``'s reshard part) ``[Shard(0)]`` (FSDP); then it is
    restored into ``[Shard(1)]`` on half as many ranks, ``[Shard(0)]`` on half as many, and
    ``[Shard(0)]`` on as many (the resume of the same job: the restore time of the common case).

Two layouts, taken and restored in the same run, alternating, ``--repeat`` times:

* ``split`` (this version): a take stores each rank's column box as up to 8 column sub-boxes of at
  least 1 MiB, and each full-width (``Shard(0)``) box of at least 32 MiB as up to 8 column
  sub-boxes of at least 16 MiB (``snapshotkit._format.sharded.column_split``);
* ``whole`` (before): every box stored whole, as takes wrote before the split, by setting the
  private ``COLUMN_SPLIT_MAX_PARTS`` to 1 in the rank processes (benchmark only; not an option).

Reported per restoring rank: the data bytes it read over the bytes its local shard needs, and the
ranged reads it issued (counted by a storage wrapper around the real plugin: data-object reads,
the probe reads of one byte per data object included; an ``s3://`` read is one ranged GET); the
restore time; and the take time of each layout (the split stores strided column views, so the
take copies them into staging buffers: its cost shows there). ``--stores`` picks ``local`` (a
directory) and ``s3`` (a SeaweedFS server started here; skipped when ``weed`` is missing).

Usage::

    python benchmarks/bench_reshard.py --out benchmarks/results/bench_reshard-<date>.json
    python benchmarks/bench_reshard.py --quick --out /tmp/reshard.json   # 2 x 16 MiB and 128 MiB, seconds
"""

from __future__ import annotations

import statistics
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # _harness, also when imported by a test

from _harness import Record, cli, launch
from _harness import measure as M
from _harness import report as R

PRELOAD = ["torch", "torch.distributed", "snapshotkit"]
RANKS_TIMEOUT_S = 3600.0
COLUMNS = 8192
ROW_COLUMNS = 4096  # the rows scenario's table: [rows, 4096] float32
LAYOUTS = {"whole": 1, "split": None}  # COLUMN_SPLIT_MAX_PARTS in the rank processes (None: the default)


# --------------------------------------------------------------------------- counting reads


def _counting_plugin(inner: Any, counts: dict[str, int]) -> Any:
    """``inner`` (a real storage plugin) with its data-object reads counted into ``counts``."""
    from snapshotkit.storage import ByteRange, StoragePlugin

    class Counting(StoragePlugin):
        capabilities = inner.capabilities

        def _count(self, location: str, nbytes: int) -> None:
            if location.startswith("data/"):
                counts["requests"] += 1
                counts["bytes"] += nbytes

        async def write(self, location: str, data: Any) -> None:
            await inner.write(location, data)

        async def read(self, location: str, byte_range: ByteRange | None = None) -> Any:
            data = await inner.read(location, byte_range)
            self._count(location, memoryview(data).nbytes)
            return data

        async def read_into(self, location: str, start: int, buffers: Sequence[memoryview]) -> None:
            await inner.read_into(location, start, buffers)
            self._count(location, sum(b.nbytes for b in buffers))

        async def exists(self, location: str) -> bool:
            return bool(await inner.exists(location))

        async def write_exclusive(self, location: str, data: Any) -> None:
            await inner.write_exclusive(location, data)

        async def list(self, prefix: str = "") -> list[str]:
            return list(await inner.list(prefix))

        async def delete(self, location: str) -> None:
            await inner.delete(location)

        async def close(self) -> None:
            await inner.close()

    return Counting()


def _register_counting(counts: dict[str, int]) -> None:
    """``counted://<uri>``: the plugin of ``<uri>``, its data reads counted."""
    from snapshotkit.storage import register_storage_plugin
    from snapshotkit.storage._registry import url_to_storage_plugin

    def factory(root: str, options: Mapping[str, Any]) -> Any:
        return _counting_plugin(url_to_storage_plugin(root, options), counts)

    register_storage_plugin("counted", factory)


# --------------------------------------------------------------------------- the ranks


def _rank_main(spec: Record) -> Record:
    import torch

    torch.set_num_threads(1)
    with launch.process_group(spec):
        if spec.get("scenario") == "rows":
            return _take_rows_rank(spec) if spec["op"] == "take" else _restore_rows_rank(spec)
        return _take_rank(spec) if spec["op"] == "take" else _restore_rank(spec)


def _tensors(spec: Record, fill: bool) -> dict[str, Any]:
    import torch
    import torch.distributed as dist
    from torch.distributed.tensor import Shard, distribute_tensor

    mesh = dist.device_mesh.init_device_mesh("cpu", (spec["world"],))
    rows = spec["tensor_bytes"] // (4 * COLUMNS)
    out = {}
    for i in range(spec["tensors"]):
        if fill:
            full = torch.arange(rows * COLUMNS, dtype=torch.float32).reshape(rows, COLUMNS).add_(i)
        else:
            full = torch.zeros(rows, COLUMNS)
        out[f"w{i}"] = distribute_tensor(full, mesh, [Shard(1)])
        del full
    return out


def _take_rank(spec: Record) -> Record:
    import torch.distributed as dist

    from snapshotkit import Snapshot, StateDict
    from snapshotkit._format import sharded

    if spec["max_parts"] is not None:
        sharded.COLUMN_SPLIT_MAX_PARTS = spec["max_parts"]
    state = StateDict(**_tensors(spec, fill=True))
    dist.barrier()
    with M.Measure() as took:
        Snapshot.take(spec["path"], {"m": state}, storage_options=spec["options"])
    entry = Snapshot(spec["path"], storage_options=spec["options"]).get_manifest()["0/m/w0"]
    return {"seconds": took.time_s, "stored_boxes": len(entry.shards)}  # type: ignore[union-attr]


def _restore_rank(spec: Record) -> Record:
    import math

    import torch
    import torch.distributed as dist

    from snapshotkit import Snapshot, StateDict

    counts = {"requests": 0, "bytes": 0}
    _register_counting(counts)
    state = StateDict(**_tensors(spec, fill=False))
    needed = sum(math.prod(t.to_local().shape) * 4 for t in state.values())
    dist.barrier()
    with M.Measure() as took:
        Snapshot("counted://" + spec["path"], storage_options=spec["options"]).restore({"m": state})
    rows = spec["tensor_bytes"] // (4 * COLUMNS)
    exact = all(
        torch.equal(
            t.to_local(),
            torch.arange(rows * COLUMNS, dtype=torch.float32)
            .reshape(rows, COLUMNS)
            .add_(i)[:, _chunk(COLUMNS, spec["rank"], spec["world"])],
        )
        for i, t in enumerate(state.values())
    )
    return {
        "seconds": took.time_s,
        "needed_bytes": needed,
        "read_bytes": counts["bytes"],
        "requests": counts["requests"],
        "exact": exact,
    }


def _table_values(rows: slice, columns: slice) -> Any:
    """The rows scenario's table at ``[rows, columns]``: exact float32 values (below 2**24), every
    (row mod 4093, column) distinct, computed for any box without building the whole table."""
    import torch

    r = (torch.arange(rows.start, rows.stop) % 4093).to(torch.float32)
    c = torch.arange(columns.start, columns.stop).to(torch.float32)
    return r[:, None] * ROW_COLUMNS + c[None, :]


def _chunk(extent: int, rank: int, world: int) -> slice:
    """Rank ``rank``'s part of ``extent`` under ``Shard`` (torch's chunking: ceil-sized)."""
    chunk = -(-extent // world)
    return slice(min(rank * chunk, extent), min((rank + 1) * chunk, extent))


def _table(spec: Record, dim: int, fill: bool) -> Any:
    """This rank's ``Shard(dim)`` DTensor of the rows scenario's table (only its local box built)."""
    import torch
    import torch.distributed as dist
    from torch.distributed.tensor import DTensor, Shard

    mesh = dist.device_mesh.init_device_mesh("cpu", (spec["world"],))
    shape = (spec["rows_bytes"] // (4 * ROW_COLUMNS), ROW_COLUMNS)
    box = [slice(0, shape[0]), slice(0, shape[1])]
    box[dim] = _chunk(shape[dim], spec["rank"], spec["world"])
    local = _table_values(*box) if fill else torch.zeros(box[0].stop - box[0].start, box[1].stop - box[1].start)
    stride = (shape[1], 1)
    return DTensor.from_local(local, mesh, [Shard(dim)], run_check=False, shape=torch.Size(shape), stride=stride), box


def _take_rows_rank(spec: Record) -> Record:
    import torch.distributed as dist

    from snapshotkit import Snapshot, StateDict
    from snapshotkit._format import sharded

    if spec["max_parts"] is not None:
        sharded.COLUMN_SPLIT_MAX_PARTS = spec["max_parts"]
    table, _ = _table(spec, 0, fill=True)
    dist.barrier()
    with M.Measure() as took:
        Snapshot.take(spec["path"], {"m": StateDict(t=table)}, storage_options=spec["options"])
    entry = Snapshot(spec["path"], storage_options=spec["options"]).get_manifest()["0/m/t"]
    return {"seconds": took.time_s, "stored_boxes": len(entry.shards)}  # type: ignore[union-attr]


def _restore_rows_rank(spec: Record) -> Record:
    import torch
    import torch.distributed as dist

    from snapshotkit import Snapshot, StateDict

    counts = {"requests": 0, "bytes": 0}
    _register_counting(counts)
    table, box = _table(spec, spec["dim"], fill=False)
    needed = table.to_local().numel() * 4
    dist.barrier()
    with M.Measure() as took:
        Snapshot("counted://" + spec["path"], storage_options=spec["options"]).restore({"m": StateDict(t=table)})
    return {
        "seconds": took.time_s,
        "needed_bytes": needed,
        "read_bytes": counts["bytes"],
        "requests": counts["requests"],
        "exact": torch.equal(table.to_local(), _table_values(*box)),
    }


def measure_inproc(args: Any, scratch: Path) -> Record:
    """The ``inproc`` scenario: take and restore times of both layouts in this process."""
    import shutil
    import time

    import torch

    from snapshotkit import Snapshot, StateDict
    from snapshotkit._format import sharded
    from snapshotkit._format.sharded import Box, LocalChunks

    torch.set_num_threads(1)
    shape = (args.rows_bytes // (4 * ROW_COLUMNS), ROW_COLUMNS)
    quarter = shape[0] // 4
    boxes = [Box((i * quarter, 0), (quarter, ROW_COLUMNS)) for i in range(4)]
    held = tuple(
        (box, _table_values(slice(box.offsets[0], box.offsets[0] + quarter), slice(0, ROW_COLUMNS))) for box in boxes
    )
    into = tuple((box, torch.zeros(quarter, ROW_COLUMNS)) for box in boxes)
    saved = sharded.COLUMN_SPLIT_MAX_PARTS
    times: dict[str, dict[str, list[float]]] = {layout: {"take": [], "restore": []} for layout in LAYOUTS}
    try:
        for repeat in range(args.repeat):
            for layout, max_parts in LAYOUTS.items():
                sharded.COLUMN_SPLIT_MAX_PARTS = saved if max_parts is None else max_parts
                path = str(scratch / f"inproc-{layout}-{repeat}")
                start = time.perf_counter()
                Snapshot.take(path, {"m": StateDict(t=LocalChunks(torch.float32, shape, held))})
                taken = time.perf_counter()
                Snapshot(path).restore({"m": StateDict(t=LocalChunks(torch.float32, shape, into))})
                restored = time.perf_counter()
                if not all(torch.equal(a, b) for (_, a), (_, b) in zip(held, into, strict=True)):
                    raise RuntimeError(f"inproc {layout}: the restore is not bit-exact")
                times[layout]["take"].append(taken - start)
                times[layout]["restore"].append(restored - taken)
                shutil.rmtree(path)
                R.progress(f"[inproc] {layout} #{repeat}: take {taken - start:.2f} s, restore {restored - taken:.2f} s")
    finally:
        sharded.COLUMN_SPLIT_MAX_PARTS = saved
    out: Record = {
        layout: {op: {"seconds": t, "median_s": statistics.median(t)} for op, t in ops.items()}
        for layout, ops in times.items()
    }
    for op in ("take", "restore"):
        out[f"split_over_whole_{op}"] = out["split"][op]["median_s"] / out["whole"][op]["median_s"]
    return out


def _run(launcher: launch.Launcher, world: int, spec: Record) -> list[Record]:
    results = launcher.run_ranks(spec, world)
    failed = [r for r in results if r.get("ok") is False]
    if failed:
        raise RuntimeError(f"{spec['op']} on {world} ranks: {failed[0]['error']}\n{failed[0].get('traceback', '')}")
    return results


# --------------------------------------------------------------------------- stores


class _Store:
    """Where the snapshots go: a scratch directory, or a bucket of a SeaweedFS server."""

    def __init__(self, name: str, root: str, options: Record) -> None:
        self.name, self.root, self.options = name, root, options

    def path(self, tag: str) -> str:
        return f"{self.root}/{tag}"


def _stores(names: Sequence[str], scratch: Path, stack: Any) -> list[_Store]:
    stores = []
    for name in names:
        if name == "local":
            stores.append(_Store("local", str(scratch), {}))
        elif name == "s3":
            from snapshotkit.testing._servers import SeaweedS3Server, ServerUnavailable

            try:
                server = stack.enter_context(SeaweedS3Server())
            except ServerUnavailable as exc:
                R.progress(f"[s3] skipped: {exc}")
                continue
            server.create_bucket("reshard")
            stores.append(_Store("s3", "s3://reshard", server.storage_options()))
        else:
            raise SystemExit(f"unknown store {name!r}: local, s3")
    return stores


# --------------------------------------------------------------------------- measuring


def measure_store(args: Any, store: _Store, launcher: launch.Launcher) -> Record:
    """Every scenario of ``args.scenarios`` on ``store``: the columns one at the top level (as
    before), the rows one under ``rows``."""
    out: Record = {}
    scenarios = args.scenarios.split(",")
    if "columns" in scenarios:
        base = {"tensors": args.tensors, "tensor_bytes": args.tensor_bytes, "options": store.options}
        targets = [(str(world), world, {}) for world in args.restore_ranks]
        out.update(_measure(args, store, launcher, "columns", base, targets))
    if "rows" in scenarios:
        base = {"scenario": "rows", "rows_bytes": args.rows_bytes, "options": store.options}
        half = args.ranks // 2
        targets = [
            (f"shard1_{half}", half, {"dim": 1}),
            (f"shard0_{half}", half, {"dim": 0}),
            (f"shard0_{args.ranks}", args.ranks, {"dim": 0}),
        ]
        out["rows"] = _measure(args, store, launcher, "rows", base, targets)
    return out


def _measure(
    args: Any,
    store: _Store,
    launcher: launch.Launcher,
    scenario: str,
    base: Record,
    targets: Sequence[tuple[str, int, Record]],
) -> Record:
    runs: dict[str, Record] = {layout: {"take_s": [], "stored_boxes": 0, "restore": {}} for layout in LAYOUTS}
    for repeat in range(args.repeat):
        for layout, max_parts in LAYOUTS.items():  # interleaved: before, after, before, after...
            path = store.path(f"{scenario}-{layout}-{repeat}")
            taken = _run(launcher, args.ranks, {**base, "op": "take", "path": path, "max_parts": max_parts})
            runs[layout]["take_s"].append(max(r["seconds"] for r in taken))
            runs[layout]["stored_boxes"] = taken[0]["stored_boxes"]
            for label, world, extra in targets:
                restored = _run(launcher, world, {**base, **extra, "op": "restore", "path": path})
                runs[layout]["restore"].setdefault(label, []).append(restored)
                R.progress(
                    f"[{store.name}] {scenario} {layout} #{repeat} {args.ranks}->{label}: read/needed "
                    f"{sum(r['read_bytes'] for r in restored) / sum(r['needed_bytes'] for r in restored):.3f}, "
                    f"{sum(r['requests'] for r in restored)} requests, "
                    f"{max(r['seconds'] for r in restored):.2f} s"
                )
    out: Record = {}
    for layout, run in runs.items():
        rec: Record = {"stored_boxes_per_tensor": run["stored_boxes"], "take_s": run["take_s"]}
        rec["median_take_s"] = statistics.median(run["take_s"])
        for label, repeats in run["restore"].items():
            last = repeats[-1]  # reads are deterministic; times vary
            rec[f"restore_{label}"] = {
                "per_rank": [
                    {k: r[k] for k in ("needed_bytes", "read_bytes", "requests", "seconds", "exact")} for r in last
                ],
                "read_over_needed": sum(r["read_bytes"] for r in last) / sum(r["needed_bytes"] for r in last),
                "max_rank_read_over_needed": max(r["read_bytes"] / r["needed_bytes"] for r in last),
                "requests": sum(r["requests"] for r in last),
                "exact": all(r["exact"] for rs in repeats for r in rs),
                "seconds": [max(r["seconds"] for r in rs) for rs in repeats],
                "median_seconds": statistics.median(max(r["seconds"] for r in rs) for rs in repeats),
            }
        out[layout] = rec
    out["split_over_whole_take"] = out["split"]["median_take_s"] / out["whole"]["median_take_s"]
    out["split_over_whole_restore"] = {
        label: out["split"][f"restore_{label}"]["median_seconds"] / out["whole"][f"restore_{label}"]["median_seconds"]
        for label, _, _ in targets
    }
    return out


def _table_lines(title: str, ranks: int, res: Record, labels: Sequence[str]) -> list[str]:
    lines = [""]
    lines += R.table(
        f"{title}: layout<7|boxes/tensor>13|ranks>12|read/needed>12|max rank>9|requests>9|restore s>10|take s>8",
        [
            (
                layout,
                res[layout]["stored_boxes_per_tensor"],
                f"{ranks}->{label}",
                f"{r['read_over_needed']:.3f}x",
                f"{r['max_rank_read_over_needed']:.3f}x",
                r["requests"],
                f"{r['median_seconds']:.2f}",
                f"{res[layout]['median_take_s']:.2f}",
            )
            for layout in LAYOUTS
            for label in labels
            for r in [res[layout][f"restore_{label}"]]
        ],
    )
    lines.append(f"take, split over whole (median): {res['split_over_whole_take']:.2f}x")
    lines.append(
        "restore, split over whole (median): "
        + ", ".join(f"{label} {ratio:.2f}x" for label, ratio in res["split_over_whole_restore"].items())
    )
    return lines


def render(report: Record) -> str:
    lines = [R.machine_line(report["machine"], fs=False)]
    a = report["args"]
    scenarios = a["scenarios"].split(",")
    if "columns" in scenarios:
        lines.append(
            f"columns: {a['tensors']} x {R.fmt_bytes(a['tensor_bytes'])} float32 Shard(1) DTensors, {COLUMNS} "
            f"columns, taken on {a['ranks']} gloo ranks, restored into Shard(1) on {a['restore_ranks']}"
        )
    if "rows" in scenarios:
        lines.append(
            f"rows: a {R.fmt_bytes(a['rows_bytes'])} float32 [{a['rows_bytes'] // (4 * ROW_COLUMNS)}, {ROW_COLUMNS}] "
            f"Shard(0) table taken on {a['ranks']} gloo ranks, restored into Shard(1)/Shard(0) on {a['ranks'] // 2} "
            f"and Shard(0) on {a['ranks']}"
        )
    lines.append(f"{a['repeat']} repeats, layouts interleaved")
    if "inproc" in report:
        res = report["inproc"]
        lines.append("")
        lines.append("inproc (one process, 4 Shard(0) boxes as LocalChunks, local disk), medians:")
        for op in ("take", "restore"):
            w, sp = res["whole"][op], res["split"][op]
            lines.append(
                f"  {op}: whole {w['median_s']:.3f} s {[round(t, 2) for t in w['seconds']]}, split "
                f"{sp['median_s']:.3f} s {[round(t, 2) for t in sp['seconds']]}: {res[f'split_over_whole_{op}']:.3f}x"
            )
    for store, res in report["stores"].items():
        if "columns" in scenarios:
            lines += _table_lines(f"{store} columns", a["ranks"], res, [str(w) for w in a["restore_ranks"]])
        if "rows" in scenarios:
            labels = list(res["rows"]["split_over_whole_restore"])
            lines += _table_lines(f"{store} rows", a["ranks"], res["rows"], labels)
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    import contextlib

    ap = cli.BenchParser(__doc__, full_doc=True)
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--restore-ranks", type=lambda s: [int(x) for x in s.split(",")], default=[2, 3])
    ap.add_argument("--tensors", type=int, default=2)
    ap.add_argument("--tensor-bytes", type=cli.parse_size, default=256 * cli.MiB)
    ap.add_argument("--rows-bytes", type=cli.parse_size, default=cli.GiB)
    ap.add_argument("--scenarios", default="columns,rows")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--stores", default="local,s3")
    ap.add_argument("--scratch", default=None, help="directory for local snapshots (default: a temp dir)")
    ap.add_quick("2 x 16 MiB and 128 MiB, one repeat", tensor_bytes=16 * cli.MiB, rows_bytes=128 * cli.MiB, repeat=1)
    ap.add_out(stem="bench_reshard")
    args = ap.parse(argv)
    with cli.scratch_dir(args.scratch, "bench-reshard-") as scratch, contextlib.ExitStack() as stack:
        report = R.new_report("bench_reshard", scratch, args=vars(args))
        launcher = launch.Launcher("forkserver", RANKS_TIMEOUT_S, run=_rank_main, workdir=scratch, preload=PRELOAD)
        report["stores"] = {}
        if "inproc" in args.scenarios.split(","):
            report["inproc"] = measure_inproc(args, scratch)
        stores = [] if set(args.scenarios.split(",")) <= {"inproc"} else args.stores.split(",")
        for store in _stores(stores, scratch, stack):
            report["stores"][store.name] = measure_store(args, store, launcher)
        report["activity"] = R.other_activity()
        R.write_report(report, args.out, render(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
