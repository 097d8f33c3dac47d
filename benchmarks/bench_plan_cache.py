"""Repeated takes of one structure: planning from scratch against a reused plan, in the same run.

Two parts (``--parts`` selects):

``single``
    One process holds ``--count`` (default 20,000) small float32 tensors, ``--objects`` objects
    whose serialized size changes every take, and a step counter. Each repetition is a fresh
    process taking ``--takes`` snapshots in a row, alternating a take whose plan cache was
    emptied first (``full``: what every take cost before) with a take of the unchanged structure
    (``reused``). Reported per kind (medians): planning time (the prepare phase after describing
    the state: agreeing, exchanging, deciding, laying out; ``PreparedTake.plan_s``), describing
    time, whole take time; the ratio reused/full of planning (target <= 0.20); and the cost of the
    structure digest alone (``structure_digest`` on the described state) against describing.

``ranks``
    ``--ranks`` (default 4) gloo ranks hold a mixed state (``--rank-entries`` replicated tensors,
    a ``Shard(0)`` DTensor per 100 of them, rank-local tensors and objects) and take ``--takes``
    snapshots. Every ``torch.distributed`` collective a rank makes in the prepare phase is counted
    with its bytes (tensor payloads sent), with the prepare time, first take against later ones
    (target: one collective of a few bytes per later take).

Usage::

    python benchmarks/bench_plan_cache.py --out benchmarks/results/bench_plan_cache-<date>.json
    python benchmarks/bench_plan_cache.py --quick --out /tmp/smoke.json
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # _harness, also when imported by a test

from _harness import cli, launch
from _harness import measure as M
from _harness import report as R

PARTS = ("single", "ranks")
COLLECTIVES = ("all_reduce", "all_gather", "broadcast", "all_gather_object", "broadcast_object_list", "barrier")


# --------------------------------------------------------------------------- single process


def _single_state(count: int, tensor_bytes: int, objects: int, step: int) -> dict[str, Any]:
    import torch

    generator = torch.Generator().manual_seed(step)
    state: dict[str, Any] = {
        f"p{i:06d}": torch.rand(max(1, tensor_bytes // 4), generator=generator) for i in range(count)
    }
    for i in range(objects):
        state[f"o{i:03d}"] = set(range(step * 10 + i))  # serialized size changes every take
    state["step"] = step
    return state


def single_child(spec: dict[str, Any]) -> dict[str, Any]:
    """One repetition, in this (fresh) process: ``takes`` takes alternating full and reused."""
    import torch

    from snapshotkit import Snapshot, StateDict
    from snapshotkit._plan.digest import structure_digest
    from snapshotkit._take import engine, plan_cache
    from snapshotkit._take.collect import describe_state

    torch.set_num_threads(1)
    prepared: list[Any] = []
    real = engine.prepare_take

    def recording(*args: Any, **kwargs: Any) -> Any:
        prepared.append(real(*args, **kwargs))
        return prepared[-1]

    engine.prepare_take = recording  # type: ignore[assignment]
    runs = []
    for take in range(spec["takes"]):
        state = _single_state(spec["count"], spec["tensor_bytes"], spec["objects"], take)
        if take % 2 == 0:
            plan_cache.forget()  # this take plans from scratch, like every take before the cache
        path = f"{spec['dir']}/take{take}"
        started = time.perf_counter()
        Snapshot.take(path, {"m": StateDict(state)})
        take_s = time.perf_counter() - started
        last = prepared[-1]
        runs.append(
            {
                "kind": "reused" if last.plan_reused else "full",
                "plan_s": last.plan_s,
                "describe_s": last.describe_s,
                "take_s": take_s,
            }
        )
        if take == spec["takes"] - 1:  # the written snapshot holds this take's values
            target = StateDict(
                {k: torch.empty_like(v) if isinstance(v, torch.Tensor) else None for k, v in state.items()}
            )
            Snapshot(path).restore({"m": target})
            ok = all(
                torch.equal(target[k], v) if isinstance(v, torch.Tensor) else target[k] == v for k, v in state.items()
            )
            runs[-1]["restored_ok"] = ok
        subprocess.run(["rm", "-rf", path], check=True)
    local = describe_state({"m": _single_state(spec["count"], spec["tensor_bytes"], spec["objects"], 0)})
    digests = []
    for _ in range(5):
        started = time.perf_counter()
        structure_digest(local, [], rank=0, world_size=1)
        digests.append(time.perf_counter() - started)
    return {"ok": all(r.get("restored_ok", True) for r in runs), "runs": runs, "digest_s": M.median(digests)}


def part_single(args: Any, scratch: Path) -> dict[str, Any]:
    reps = []
    for rep in range(args.repeats):
        spec = {k: getattr(args, k) for k in ("count", "tensor_bytes", "objects", "takes")} | {"dir": str(scratch)}
        cmd = [sys.executable, __file__, "--child-single", json.dumps(spec)]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.op_timeout)
        if proc.returncode != 0:
            raise RuntimeError(f"single repetition failed:\n{proc.stderr[-3000:]}")
        rec = json.loads(proc.stdout.strip().splitlines()[-1])
        reps.append(rec)
        R.progress(f"[{rep + 1}/{args.repeats}] single: {len(rec['runs'])} takes, ok={rec['ok']}")
    out: dict[str, Any] = {"ok": all(r["ok"] for r in reps)}
    for kind in ("full", "reused"):
        runs = [run for rep in reps for run in rep["runs"] if run["kind"] == kind]
        out[kind] = {
            "takes": len(runs),
            "plan_s": M.median(r["plan_s"] for r in runs),
            "describe_s": M.median(r["describe_s"] for r in runs),
            "take_s": M.median(r["take_s"] for r in runs),
        }
    out["digest_s"] = M.median(r["digest_s"] for r in reps)
    out["plan_ratio"] = M.ratio(out["reused"]["plan_s"], out["full"]["plan_s"])
    out["take_ratio"] = M.ratio(out["reused"]["take_s"], out["full"]["take_s"])
    out["digest_vs_describe"] = M.ratio(out["digest_s"], out["full"]["describe_s"])
    out["target_met"] = M.within(out["plan_ratio"], 0.20)
    return out


# --------------------------------------------------------------------------- ranks


def _nbytes(value: Any) -> int:
    import torch

    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size()
    if isinstance(value, (list, tuple)):
        return sum(_nbytes(v) for v in value)
    return 0


def rank_child(spec: dict[str, Any]) -> dict[str, Any]:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    with launch.process_group(spec):
        from torch.distributed.tensor import Shard, distribute_tensor

        from snapshotkit import Snapshot, StateDict
        from snapshotkit._take import engine

        rank, world = spec["rank"], spec["world"]
        counted = {"calls": 0, "bytes": 0}
        for name in COLLECTIVES:
            real = getattr(dist, name)

            def wrapper(*a: Any, _real: Any = real, **k: Any) -> Any:
                counted["calls"] += 1
                counted["bytes"] += _nbytes(a[0]) if a else 0  # all_gather: the outputs, all_reduce: the tensor
                return _real(*a, **k)

            setattr(dist, name, wrapper)
        takes: list[dict[str, Any]] = []
        real_prepare = engine.prepare_take

        def recording(*a: Any, **k: Any) -> Any:
            before = dict(counted)
            started = time.perf_counter()
            prepared = real_prepare(*a, **k)
            takes[-1].update(
                prepare_s=time.perf_counter() - started,
                plan_s=prepared.plan_s,
                reused=prepared.plan_reused,
                collectives=counted["calls"] - before["calls"],
                collective_bytes=counted["bytes"] - before["bytes"],
            )
            return prepared

        engine.prepare_take = recording  # type: ignore[assignment]
        mesh = dist.device_mesh.init_device_mesh("cpu", (world,))
        torch.manual_seed(0)
        entries = spec["entries"]
        model = StateDict({f"w{i:05d}": torch.rand(64) for i in range(entries)})
        sharded = StateDict(
            {
                f"t{i:03d}": distribute_tensor(torch.rand(8 * world, 16), mesh, [Shard(0)])
                for i in range(max(1, entries // 100))
            }
        )
        local = StateDict({f"x{i:04d}": torch.full((32,), float(rank)) for i in range(max(1, entries // 10))})
        app_state = {"model": model, "sharded": sharded, "local": local, "meta": StateDict(step=0, seen={rank})}
        for take in range(spec["takes"]):
            app_state["meta"]["step"] = take
            takes.append({"take": take})
            dist.barrier()
            started = time.perf_counter()
            Snapshot.take(f"{spec['dir']}/take{take}", app_state, replicated=["model/**"])
            takes[-1]["take_s"] = time.perf_counter() - started
        return {"ok": True, "rank": rank, "takes": takes}


def part_ranks(args: Any, scratch: Path, launcher: launch.Launcher) -> dict[str, Any]:
    results = launcher.run_ranks(
        {"part": "ranks", "dir": str(scratch / "ranks"), "entries": args.rank_entries, "takes": args.takes}, args.ranks
    )
    failed = [r for r in results if not r.get("ok")]
    if failed:
        raise RuntimeError(f"ranks failed: {failed[0].get('error')}\n{failed[0].get('traceback', '')}")
    per_take = []
    for take in range(args.takes):
        rows = [r["takes"][take] for r in results]
        per_take.append(
            {
                "take": take,
                "reused": sorted({row["reused"] for row in rows}),
                "collectives": sorted({row["collectives"] for row in rows}),
                "collective_bytes_max": max(row["collective_bytes"] for row in rows),
                "prepare_s_max": max(row["prepare_s"] for row in rows),
                "plan_s_max": max(row["plan_s"] for row in rows),
                "take_s_max": max(row["take_s"] for row in rows),
            }
        )
    later = per_take[1:]
    return {
        "ok": True,
        "ranks": args.ranks,
        "per_take": per_take,
        "first_prepare_s": per_take[0]["prepare_s_max"],
        "later_prepare_s": M.median(t["prepare_s_max"] for t in later),
        "first_plan_s": per_take[0]["plan_s_max"],
        "later_plan_s": M.median(t["plan_s_max"] for t in later),
        "target_met": all(t["collectives"] == [1] and t["collective_bytes_max"] <= 64 for t in later),
    }


def _launcher_run(spec: dict[str, Any]) -> dict[str, Any]:
    return rank_child(spec)


# --------------------------------------------------------------------------- main


def parse_args(argv: list[str] | None = None) -> Any:
    ap = cli.BenchParser(__doc__)
    ap.add_out(stem="bench_plan_cache")
    ap.add_subset("--parts", PARTS)
    ap.add_argument("--dir", default=None, help="scratch directory (default: a new temp dir under /tmp)")
    ap.add_argument("--count", type=int, default=20_000, help="tensors in the single-process state (20000)")
    ap.add_argument("--tensor-bytes", type=cli.parse_size, default=1 * cli.KiB, help="bytes per tensor (1KiB)")
    ap.add_argument("--objects", type=int, default=20, help="objects in the single-process state (20)")
    ap.add_argument("--takes", type=int, default=6, help="takes per repetition (6: 3 full, 3 reused)")
    ap.add_argument("--repeats", type=int, default=3, help="repetitions of the single part (fresh processes)")
    ap.add_argument("--ranks", type=int, default=4, help="gloo ranks of the ranks part (4)")
    ap.add_argument("--rank-entries", type=int, default=2_000, help="replicated tensors in the ranks part (2000)")
    ap.add_argument("--op-timeout", type=float, default=900.0, help="seconds per repetition")
    ap.add_argument("--child-single", default=None, help="(internal) run one single-process repetition")
    ap.add_quick("tiny sizes for the smoke test", count=300, objects=3, takes=4, repeats=1, ranks=2, rank_entries=100)
    return ap.parse(argv)


def render(report: dict[str, Any]) -> str:
    lines = [f"bench_plan_cache  {R.machine_line(report['machine'])}"]
    single = report["results"].get("single")
    if single:
        lines += ["", f"single process: {report['config']['count']} tensors + {report['config']['objects']} objects"]
        lines += R.table(
            "plan<8|takes>6|planning>12|describing>12|take>12",
            [
                (
                    k,
                    single[k]["takes"],
                    R.fmt_ms(single[k]["plan_s"]),
                    R.fmt_ms(single[k]["describe_s"]),
                    R.fmt_ms(single[k]["take_s"]),
                )
                for k in ("full", "reused")
            ],
        )
        lines.append(
            f"planning reused/full {R.fmt_x(single['plan_ratio'])} "
            f"(target <= 0.20: {R.verdict(single['target_met'])}), "
            f"take {R.fmt_x(single['take_ratio'])}; structure digest {R.fmt_ms(single['digest_s'])} "
            f"= {R.fmt_pct(single['digest_vs_describe'])} of describing"
        )
    ranks = report["results"].get("ranks")
    if ranks:
        lines += [
            "",
            f"{ranks['ranks']} gloo ranks, {report['config']['rank_entries']} replicated entries + sharded + local",
        ]
        lines += R.table(
            "take>4|reused>12|collectives>12|bytes (max)>14|prepare>12|planning>12|take s>12",
            [
                (
                    t["take"],
                    "/".join(map(str, t["reused"])),
                    "/".join(map(str, t["collectives"])),
                    t["collective_bytes_max"],
                    R.fmt_ms(t["prepare_s_max"]),
                    R.fmt_ms(t["plan_s_max"]),
                    R.fmt_ms(t["take_s_max"]),
                )
                for t in ranks["per_take"]
            ],
        )
        lines.append(f"one collective of a few bytes per later take: {R.verdict(ranks['target_met'])}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    if argv is None and len(sys.argv) > 2 and sys.argv[1] == "--child-single":
        print(json.dumps(single_child(json.loads(sys.argv[2]))))
        return 0
    args = parse_args(argv)
    with cli.scratch_dir(args.dir, "snapshotkit-plancache-") as scratch:
        results: dict[str, Any] = {}
        if "single" in args.parts:
            results["single"] = part_single(args, scratch)
        if "ranks" in args.parts:
            launcher = launch.Launcher(
                "forkserver",
                args.op_timeout,
                run=_launcher_run,
                workdir=scratch,
                preload=["torch", "torch.distributed", "snapshotkit"],
            )
            results["ranks"] = part_ranks(args, scratch, launcher)
        report = R.new_report("bench_plan_cache", scratch, config=vars(args))
        report["results"] = results
        R.write_report(report, args.out, render(report))
    return 0 if all(r.get("ok") for r in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
