"""SnapshotManager: a long managed loop, the cost of save + retention against a bare take, and
restore_latest over a root of many snapshots (local disk and S3 on a loopback SeaweedFS).

Method and results: docs/benchmarks.md ("SnapshotManager").
"""

from __future__ import annotations

import os
import statistics
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import torch
from _harness import cli
from _harness import report as R

from snapshotkit import Snapshot, SnapshotManager, StateDict

# The loopback SeaweedFS server's credentials, read by s3fs/botocore from the environment.
os.environ.setdefault("AWS_ACCESS_KEY_ID", "testing")
os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "testing")
os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")

CASES = ("loop", "save_cost", "restore_latest")
STORES = ("local", "s3")


def make_state(nbytes: int, step: int = 0) -> dict[str, Any]:
    numel = max(1, nbytes // 4)
    return {"model": StateDict(w=torch.full((numel,), float(step))), "progress": StateDict(step=step)}


def bump(state: dict[str, Any], step: int) -> None:
    state["model"]["w"].fill_(float(step))
    state["progress"]["step"] = step


def loop_case(steps: int, every: int, keep_last: int, state_bytes: int) -> R.Record:
    """The issue's loop on memory://: every ``every`` steps for ``steps`` steps, keep_last."""
    root = f"memory://bench-manager/{uuid.uuid4().hex}"
    state = make_state(state_bytes)
    started = time.perf_counter()
    with SnapshotManager(root, keep_last=keep_last, save_interval_steps=every, preemption_signals=()) as mgr:
        for step in range(1, steps + 1):
            bump(state, step)
            if mgr.should_save(step):
                mgr.save(step, state, metrics={"loss": 1.0 / step})
        mgr.wait()
        kept = mgr.steps()
    seconds = time.perf_counter() - started
    expected = list(range(steps - (keep_last - 1) * every, steps + 1, every))
    return {
        "steps": steps,
        "every": every,
        "keep_last": keep_last,
        "kept": kept,
        "expected": expected,
        "exact": kept == expected,
        "seconds": seconds,
        "saves": steps // every,
    }


def save_cost_case(root: Path, saves: int, state_bytes: int) -> R.Record:
    """Per save: a bare Snapshot.take, manager.save (returns) and save + retention done (wait)."""
    state = make_state(state_bytes)
    bare, managed, settled = [], [], []
    with SnapshotManager(str(root / "managed"), keep_last=3, preemption_signals=()) as mgr:
        # Interleaved, and which goes first alternates: on this VM's disk the second of two
        # back-to-back writes can run at a different speed than the first.
        for step in range(1, saves + 1):
            bump(state, step)
            for which in ("bare", "managed") if step % 2 else ("managed", "bare"):
                t0 = time.perf_counter()
                if which == "bare":
                    Snapshot.take(str(root / "bare" / f"step_{step}"), state)
                    bare.append(time.perf_counter() - t0)
                    continue
                mgr.save(step, state)
                managed.append(time.perf_counter() - t0)
                mgr.wait()
                settled.append(time.perf_counter() - t0)
    b, m, s = statistics.median(bare), statistics.median(managed), statistics.median(settled)
    return {
        "saves": saves,
        "state_bytes": state_bytes,
        "bare_take_s": b,
        "save_s": m,
        "save_and_retention_s": s,
        "save_over_bare": m / b,
        "settled_over_bare": s / b,
    }


def restore_latest_case(root: str, count: int, state_bytes: int, options: dict[str, Any]) -> R.Record:
    """restore_latest over ``count`` snapshots, against restoring the newest by its path."""
    state = make_state(state_bytes)
    with SnapshotManager(root, storage_options=options, preemption_signals=()) as mgr:
        for step in range(1, count + 1):
            bump(state, step)
            mgr.save(step, state)
    target = make_state(state_bytes, step=-1)
    timings: dict[str, list[float]] = {"open_manager_s": [], "restore_latest_s": [], "bare_restore_s": []}
    for _ in range(3):
        t0 = time.perf_counter()
        mgr = SnapshotManager(root, storage_options=options, preemption_signals=())
        t1 = time.perf_counter()
        restored = mgr.restore_latest(target)
        t2 = time.perf_counter()
        mgr.close()
        Snapshot(f"{root}/step_{count}", storage_options=options).restore(target)
        t3 = time.perf_counter()
        assert restored == count
        assert target["progress"]["step"] == count
        assert bool((target["model"]["w"] == float(count)).all())
        timings["open_manager_s"].append(t1 - t0)
        timings["restore_latest_s"].append(t2 - t1)
        timings["bare_restore_s"].append(t3 - t2)
    med = {k: statistics.median(v) for k, v in timings.items()}
    return {
        "snapshots": count,
        "state_bytes": state_bytes,
        **med,
        "restore_latest_over_bare": med["restore_latest_s"] / med["bare_restore_s"],
        "open_and_restore_over_bare": (med["open_manager_s"] + med["restore_latest_s"]) / med["bare_restore_s"],
    }


def render(result: R.Record) -> str:
    lines = [R.machine_line(result["machine"]), ""]
    if "loop" in result:
        r = result["loop"]
        lines.append(
            f"{r['steps']}-step loop on memory://, save every {r['every']}, keep_last={r['keep_last']}: "
            f"{r['saves']} saves in {r['seconds']:.2f} s; kept {r['kept']} "
            f"({'exactly' if r['exact'] else 'NOT'} the expected {r['expected']})"
        )
    if "save_cost" in result:
        r = result["save_cost"]
        lines += [
            "",
            f"save + retention vs a bare take (local disk, {R.fmt_bytes(r['state_bytes'])} state, "
            f"median of {r['saves']}):",
        ]
        lines += R.table(
            "bare take s>12|save() s>11|save+retention s>18|save/bare>11|settled/bare>14",
            [
                (
                    f"{r['bare_take_s']:.4f}",
                    f"{r['save_s']:.4f}",
                    f"{r['save_and_retention_s']:.4f}",
                    R.fmt_x(r["save_over_bare"]),
                    R.fmt_x(r["settled_over_bare"]),
                )
            ],
        )
    for store, r in result.get("restore_latest", {}).items():
        if "error" in r:
            lines += ["", f"restore_latest on {store}: {r['error']}"]
            continue
        lines += [
            "",
            f"restore_latest over {r['snapshots']} snapshots on {store} "
            f"({R.fmt_bytes(r['state_bytes'])} each, median of 3):",
        ]
        lines += R.table(
            "open manager s>15|restore_latest s>17|bare restore s>15|latest/bare>13|open+latest/bare>18",
            [
                (
                    f"{r['open_manager_s']:.4f}",
                    f"{r['restore_latest_s']:.4f}",
                    f"{r['bare_restore_s']:.4f}",
                    R.fmt_x(r["restore_latest_over_bare"]),
                    R.fmt_x(r["open_and_restore_over_bare"]),
                )
            ],
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = cli.BenchParser(__doc__ or "")
    parser.add_out(stem="bench_manager")
    parser.add_subset("--cases", CASES)
    parser.add_subset("--stores", STORES)
    parser.add_argument("--loop-steps", type=int, default=1000)
    parser.add_argument("--saves", type=int, default=20, help="saves timed for save_cost (default: %(default)s)")
    parser.add_argument("--snapshots", type=int, default=100, help="snapshots in the restore_latest root")
    parser.add_argument("--state-bytes", type=cli.parse_size, default=4 * cli.MiB, help="state size (4MiB)")
    parser.add_argument("--dir", default=None, help="scratch directory (default: a new temp dir under /tmp)")
    parser.add_quick("tiny sizes (smoke test)", loop_steps=100, saves=3, snapshots=5, state_bytes=64 * cli.KiB)
    args = parser.parse(argv)
    with cli.scratch_dir(args.dir, "snapshotkit-manager-") as scratch:
        result = R.new_report("bench_manager", scratch, config={k: v for k, v in vars(args).items() if k != "out"})
        if "loop" in args.cases:
            result["loop"] = loop_case(args.loop_steps, 10, 3, args.state_bytes // 16)
        if "save_cost" in args.cases:
            result["save_cost"] = save_cost_case(scratch / "save_cost", args.saves, args.state_bytes)
        if "restore_latest" in args.cases:
            result["restore_latest"] = {}
            if "local" in args.stores:
                result["restore_latest"]["local"] = restore_latest_case(
                    str(scratch / "many"), args.snapshots, args.state_bytes, {}
                )
            if "s3" in args.stores:
                result["restore_latest"]["s3"] = _on_s3(args.snapshots, args.state_bytes)
    R.write_report(result, args.out, render(result))
    return 0 if result.get("loop", {}).get("exact", True) else 1


def _on_s3(count: int, state_bytes: int) -> R.Record:
    try:
        import boto3

        from snapshotkit.testing import SeaweedS3Server
    except ImportError as exc:
        return {"error": f"skipped: {exc}"}
    with SeaweedS3Server() as server:
        boto3.client("s3", endpoint_url=server.endpoint_url).create_bucket(Bucket="bench-manager")
        options = {"endpoint_url": server.endpoint_url}
        return restore_latest_case(f"s3://bench-manager/{uuid.uuid4().hex}", count, state_bytes, options)


if __name__ == "__main__":
    sys.exit(main())
