"""Multi-rank benchmark: replicated write balance, resharding read volume, planning at scale.

Three parts, all in one run (``--parts`` selects):

``replicated``
    ``--ranks`` (default 4) gloo ranks on this machine hold the same DDP-wrapped model of
    ``--model-bytes`` (default 1 GiB, 64 MiB linear layers) and take one snapshot. Reported:
    total bytes written (target: the model size within 1%), each rank's share (target:
    ``1/ranks`` +- 5 points), and the take time next to one process taking the same model
    alone (same disk, same budget).

``reshard``
    ``--ranks`` ranks take a ``--dtensor-bytes`` (default 1 GiB) float32 DTensor sharded on
    dim 0; then half as many ranks restore it (``Shard(0)`` and, for the record, ``Shard(1)``
    targets). Reported per restoring rank: bytes read from storage (``/proc/self/io``
    ``rchar``, which includes the manifest) over the bytes that rank's shard needs (target
    for ``Shard(0)``: at most 1.1x).

``planning``
    Simulated, no processes: ``--planning-ranks`` (default 64,256,1024) ranks x
    ``--planning-entries`` (default 1,000) entries each (half replicated, half rank-local),
    timing :func:`snapshotkit._plan.decide.decide` (partitioning) plus
    :func:`snapshotkit._plan.merge.merge_results` (the manifest merge) on one core. Target: under
    2 s at 1,024 x 1,000, and no worse than O(n log n) growth.

Usage::

    python benchmarks/bench_dist.py --out benchmarks/results/bench_dist-<date>.json
    python benchmarks/bench_dist.py --model-bytes 64MiB --dtensor-bytes 64MiB \
        --planning-ranks 8,16 --planning-entries 100 --out /tmp/smoke.json    # a few seconds
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # _harness, also when imported by a test

from _harness import Record, cli, launch
from _harness import measure as M
from _harness import report as R

LAYER_BYTES = 64 * cli.MiB
# Rank processes are forked from a server that has these imported, one gloo group per run.
PRELOAD = ["torch", "torch.distributed", "snapshotkit"]
RANKS_TIMEOUT_S = 3600.0


# --------------------------------------------------------------------------- launching ranks


def _rank_main(spec: Record) -> Record:
    import torch

    torch.set_num_threads(1)
    with launch.process_group(spec):
        return PARTS[spec["part"]](spec["rank"], spec["world"], spec)


def run_ranks(launcher: launch.Launcher, world: int, part: str, args: Record) -> list[Record]:
    """``part`` on ``world`` ranks, each rank's result; raises if any rank failed."""
    results = launcher.run_ranks({**args, "part": part}, world)
    failed = [r for r in results if r.get("ok") is False]
    if failed:
        raise RuntimeError(f"{part} on {world} ranks: {failed[0]['error']}\n{failed[0].get('traceback', '')}")
    return results


# --------------------------------------------------------------------------- replicated


def _model(model_bytes: int) -> Any:
    import torch

    side = int(math.sqrt(LAYER_BYTES // 4))
    layers = max(1, model_bytes // (side * side * 4))
    torch.manual_seed(0)
    with torch.no_grad():
        return torch.nn.Sequential(*(torch.nn.Linear(side, side, bias=False) for _ in range(layers)))


def _replicated_rank(rank: int, world: int, args: Record) -> Record:
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    from snapshotkit import Snapshot

    model = DistributedDataParallel(_model(args["model_bytes"]))
    dist.barrier()
    with M.Measure() as take:
        Snapshot.take(args["path"], {"model": model}, memory_budget_bytes=args["budget"])
    dist.barrier()
    return {"seconds": take.time_s}


def _single_take(path: str, model_bytes: int, budget: int) -> float:
    from snapshotkit import Snapshot

    model = _model(model_bytes)
    with M.Measure() as take:
        Snapshot.take(path, {"model": model}, memory_budget_bytes=budget)
    return take.time_s


def part_replicated(args: argparse.Namespace, scratch: Path, launcher: launch.Launcher) -> Record:
    model_bytes = int(args.model_bytes)
    path = str(scratch / "replicated")
    results = run_ranks(
        launcher, args.ranks, "replicated", {"path": path, "model_bytes": model_bytes, "budget": args.budget}
    )
    per_rank = dict.fromkeys(range(args.ranks), 0)
    for name in os.listdir(Path(path, "data")):
        per_rank[int(name.split("_")[0])] += os.path.getsize(Path(path, "data", name))
    total = sum(per_rank.values())
    stored = sum(p.numel() * p.element_size() for p in _model(model_bytes).parameters())
    shutil.rmtree(path)
    single_path = str(scratch / "single")
    single = _single_take(single_path, model_bytes, args.budget)
    shutil.rmtree(single_path)
    multi = max(r["seconds"] for r in results)
    return {
        "ranks": args.ranks,
        "model_bytes": stored,
        "written_bytes": total,
        "written_over_model": total / stored,
        "share_per_rank": [per_rank[r] / total for r in range(args.ranks)],
        "take_seconds_multi_rank": multi,
        "take_seconds_one_process": single,
        "multi_over_single": multi / single,
    }


# --------------------------------------------------------------------------- reshard


def _dtensor_shape(nbytes: int) -> tuple[int, int]:
    cols = 4096
    return (max(8, nbytes // (4 * cols)), cols)


def _reshard_rank(rank: int, world: int, args: Record) -> Record:
    """Take the table sharded on dim 0 or, given a ``dim``, restore it sharded on that dim."""
    import torch
    import torch.distributed as dist
    from torch.distributed.tensor import Shard, distribute_tensor

    from snapshotkit import Snapshot, StateDict

    mesh = dist.device_mesh.init_device_mesh("cpu", (world,))
    rows, cols = args["shape"]
    if args.get("dim") is None:
        torch.manual_seed(0)
        full = torch.randn(rows, cols) if rank == 0 else torch.empty(rows, cols)
        table = distribute_tensor(full, mesh, [Shard(0)])
        del full
        Snapshot.take(args["path"], {"t": StateDict(w=table)}, memory_budget_bytes=args["budget"])
        return {}
    table = distribute_tensor(torch.empty(rows, cols), mesh, [Shard(args["dim"])])
    needed = table.to_local().numel() * 4
    os.sync()
    with M.Measure(io=True) as restore:
        Snapshot(args["path"]).restore({"t": StateDict(w=table)}, memory_budget_bytes=args["budget"])
    return {"needed_bytes": needed, "read_bytes": restore.io_delta["rchar"], "seconds": restore.time_s}


def part_reshard(args: argparse.Namespace, scratch: Path, launcher: launch.Launcher) -> Record:
    shape = _dtensor_shape(int(args.dtensor_bytes))
    path = str(scratch / "dtensor")
    base = {"path": path, "shape": shape, "budget": args.budget}
    run_ranks(launcher, args.ranks, "reshard", base)
    out: Record = {"shape": shape, "saved_ranks": args.ranks, "restored_ranks": args.ranks // 2}
    for dim in (0, 1):
        results = run_ranks(launcher, args.ranks // 2, "reshard", {**base, "dim": dim})
        out[f"shard{dim}"] = {
            "per_rank": results,
            "max_read_over_needed": max(r["read_bytes"] / r["needed_bytes"] for r in results),
        }
    shutil.rmtree(path)
    return out


# --------------------------------------------------------------------------- planning at scale


def _simulated(ranks: int, entries: int) -> tuple[list[Any], list[Any]]:
    """Per-rank descriptions and results: half the entries replicated (same on every rank),
    half rank-local optimizer state."""
    from snapshotkit._plan.leaves import LeafSignature, RankInfo
    from snapshotkit._plan.merge import RankResult
    from snapshotkit.manifest import Piece, TensorEntry

    half = entries // 2
    weight = LeafSignature("tensor", "float32", (256, 256), "raw", 256 * 256 * 4)
    replicated = {f"model/layer{i}.weight": weight for i in range(half)}
    total_bytes = half * 256 * 256 * 4 + half * 4096
    infos = [RankInfo("/ckpt", ("model/**",), replicated, {}, total_bytes, "bench") for _ in range(ranks)]
    checksum = "crc32c:00000000"
    results = []
    for rank in range(ranks):
        piece = (Piece(f"data/{rank}_0", (0, 4096), checksum),)
        local = {f"{rank}/optim/state/{i}": TensorEntry("float32", (1024,), "raw", piece) for i in range(half)}
        results.append(RankResult(dict(local), {}))
    return infos, results


def part_planning(args: argparse.Namespace) -> Record:
    from snapshotkit._plan.decide import decide
    from snapshotkit._plan.merge import merge_results
    from snapshotkit.manifest import Piece

    rows = []
    for ranks in [int(r) for r in args.planning_ranks.split(",")]:
        infos, results = _simulated(ranks, args.planning_entries)
        with M.Measure() as deciding:
            decision = decide(infos, chunk_bytes=16 * cli.MiB)
        # every rank reports the pieces of replicated leaves it was given
        for key, owner in decision.owner.items():
            results[owner].shared[key] = Piece(f"data/{owner}_1", (0, 1), "crc32c:00000000")
        with M.Measure() as merging:
            manifest = merge_results(results, decision, {})
        total_entries = ranks * args.planning_entries
        rows.append(
            {
                "ranks": ranks,
                "entries_per_rank": args.planning_entries,
                "total_entries": total_entries,
                "decide_seconds": deciding.cpu_s,
                "merge_seconds": merging.cpu_s,
                "total_seconds": deciding.cpu_s + merging.cpu_s,
                "manifest_entries": len(manifest),
            }
        )
    for row in rows:
        n = row["total_entries"]
        row["seconds_per_n_log_n"] = row["total_seconds"] / (n * math.log2(n))
    return {"rows": rows}


PARTS = {"replicated": _replicated_rank, "reshard": _reshard_rank}


def render(report: Record) -> str:
    lines = []
    if "planning" in report:
        lines.append("planning (one core):")
        for row in report["planning"]["rows"]:
            lines.append(
                f"  {row['ranks']:>5} ranks x {row['entries_per_rank']} entries: "
                f"decide {row['decide_seconds']:.3f} s"
                f" + merge {row['merge_seconds']:.3f} s = {row['total_seconds']:.3f} s"
                f" ({row['seconds_per_n_log_n'] * 1e9:.1f} ns per n log2 n)"
            )
    if "replicated" in report:
        r = report["replicated"]
        shares = ", ".join(f"{s:.1%}" for s in r["share_per_rank"])
        lines.append(
            f"replicated DDP model {R.fmt_bytes(r['model_bytes'])} on {r['ranks']} ranks: wrote "
            f"{R.fmt_bytes(r['written_bytes'])} ({r['written_over_model']:.4f}x the model), shares {shares}; "
            f"take {r['take_seconds_multi_rank']:.2f} s vs one process {r['take_seconds_one_process']:.2f} s "
            f"({r['multi_over_single']:.2f}x)"
        )
    if "reshard" in report:
        r = report["reshard"]
        for dim in (0, 1):
            entry = r[f"shard{dim}"]
            reads = ", ".join(
                f"{R.fmt_bytes(x['read_bytes'])}/{R.fmt_bytes(x['needed_bytes'])}" for x in entry["per_rank"]
            )
            lines.append(
                f"reshard {r['saved_ranks']} -> {r['restored_ranks']} ranks, Shard(0) -> Shard({dim}): read/needed "
                f"per rank {reads}; max {entry['max_read_over_needed']:.3f}x"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = cli.BenchParser(__doc__, full_doc=True)
    ap.add_argument("--parts", default="replicated,reshard,planning")
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--model-bytes", type=cli.parse_size, default=cli.GiB)
    ap.add_argument("--dtensor-bytes", type=cli.parse_size, default=cli.GiB)
    ap.add_argument("--budget", type=cli.parse_size, default=256 * cli.MiB)
    ap.add_argument("--planning-ranks", default="64,256,1024")
    ap.add_argument("--planning-entries", type=int, default=1000)
    ap.add_argument("--scratch", default=None, help="directory for snapshots (default: a temp dir)")
    ap.add_out(help="write the JSON report here")
    args = ap.parse(argv)
    parts = args.parts.split(",")
    with cli.scratch_dir(args.scratch, "bench-dist-") as scratch:
        report = R.new_report("bench_dist", scratch, args=vars(args))
        launcher = launch.Launcher("forkserver", RANKS_TIMEOUT_S, run=_rank_main, workdir=scratch, preload=PRELOAD)
        for part, measure_part in (
            ("planning", lambda: part_planning(args)),
            ("replicated", lambda: part_replicated(args, scratch, launcher)),
            ("reshard", lambda: part_reshard(args, scratch, launcher)),
        ):
            if part in parts:
                with M.Measure() as took:
                    report[part] = measure_part()
                R.progress(f"[{part}] done in {took.time_s:.1f} s")
    R.write_report(report, args.out, render(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
