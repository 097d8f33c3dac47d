"""Two ``async_take`` calls in flight at once: the host memory their staging holds.

Each executor runs in a fresh process: it builds a state (default 128 MiB of float32 tensors),
then calls ``Snapshot.async_take`` twice back to back, to two paths of a slow store (the local
file system with a delay before every data object write, so the first take is still writing
when the second one stages), with ``memory_budget_bytes`` equal to the state's size. It reports
the growth of the process's RSS over the state (peak, and after both takes committed), the time
each call blocked, and, where snapshotkit has one, the peak of the process's staging budget. With
one budget per process the growth stays within the budget; with one budget per take it is about
twice the state. The second snapshot is restored and compared bit for bit.

Usage::

    python benchmarks/bench_concurrent_async.py                  # 128 MiB, both executors
    python benchmarks/bench_concurrent_async.py --quick --out /tmp/concurrent.json

Results go to benchmarks/results/bench_concurrent_async-<date>.json unless ``--out`` says otherwise.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # _harness, also when imported by a test

from _harness import Record, cli
from _harness import measure as M
from _harness import report as R

EXECUTORS = ("thread", "process")
SCHEME = "slowbench"


def _slow_plugin(root: str, options: Mapping[str, Any]) -> Any:
    """The file system plugin with ``delay_s`` before each data object write (a picklable factory:
    the checkpoint daemon imports this module to make it)."""
    from snapshotkit.storage import FSStoragePlugin

    delay_s = float(options.get("delay_s", 0.0))

    class Slow(FSStoragePlugin):
        async def write(self, location: str, data: Any) -> None:
            if location.startswith("data/"):
                await asyncio.sleep(delay_s)
            await super().write(location, data)

    return Slow(root)


def run_child(spec: Record) -> Record:
    """Two async takes in flight in this (fresh) process; what staging held."""
    import bench_concurrent_async as this  # the factory under its importable name, for the daemon
    import torch

    from snapshotkit import Snapshot, StateDict
    from snapshotkit.storage import register_storage_plugin

    register_storage_plugin(SCHEME, this._slow_plugin)
    gen = torch.Generator().manual_seed(0)
    count = max(1, spec["state_bytes"] // spec["tensor_bytes"])
    state = StateDict(**{f"t{i}": torch.randn(spec["tensor_bytes"] // 4, generator=gen) for i in range(count)})
    app_state = {"s": state}
    options = {"delay_s": spec["delay_s"]}
    kwargs = {"memory_budget_bytes": spec["budget_bytes"], "executor": spec["executor"], "storage_options": options}
    M.settle()
    baseline = M.current_rss_bytes()
    M.reset_peak_rss()
    staging = _staging_budget()
    if staging is not None:
        staging.reset_peak()
    started = time.perf_counter()
    first = Snapshot.async_take(f"{SCHEME}://{spec['dir']}/first", app_state, **kwargs)
    first_call_s = time.perf_counter() - started
    second = Snapshot.async_take(f"{SCHEME}://{spec['dir']}/second", app_state, **kwargs)
    second_call_s = time.perf_counter() - started - first_call_s
    first.wait()
    second.wait()
    total_s = time.perf_counter() - started
    peak, _ = M.peak_rss_bytes()
    after = M.current_rss_bytes()
    restored = Snapshot(f"{spec['dir']}/second").read_object("s")
    verified = all(torch.equal(restored[key], tensor) for key, tensor in state.items())
    return {
        "executor": spec["executor"],
        "state_bytes": sum(t.numel() * 4 for t in state.values()),
        "peak_growth_bytes": peak - baseline,
        "after_growth_bytes": after - baseline,
        "first_call_s": first_call_s,
        "second_call_s": second_call_s,
        "total_s": total_s,
        "staging_peak_bytes": staging.peak_held_bytes if staging is not None else None,
        "verified": verified,
    }


def _staging_budget() -> Any:
    try:
        from snapshotkit._runtime.staging import staging_budget
    except ImportError:  # a snapshotkit from before one budget per process
        return None
    return staging_budget()


def run_executor(executor: str, args: Any, scratch: Path) -> Record:
    spec = {
        "executor": executor,
        "state_bytes": args.state_bytes,
        "tensor_bytes": args.tensor_bytes,
        "budget_bytes": args.budget_bytes or args.state_bytes,
        "delay_s": args.delay_s,
        "dir": str(scratch / executor),
    }
    cmd = [sys.executable, __file__, "--child", json.dumps(spec)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=args.op_timeout)
    if done.returncode != 0:
        return {"executor": executor, "error": done.stderr[-2000:]}
    result: Record = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def render(report: Record) -> str:
    config = report["config"]
    lines = [
        f"== two async_take calls in flight: {R.fmt_bytes(config['state_bytes'])} state each, "
        f"budget {R.fmt_bytes(config['budget_bytes'] or config['state_bytes'])}, "
        f"{config['delay_s']} s before each data object write",
        R.machine_line(report["machine"]),
    ]
    rows: list[list[object]] = []
    for r in report["results"]:
        if "error" in r:
            rows.append([r["executor"], "FAILED", "", "", "", "", "", r["error"].splitlines()[-1][:60]])
            continue
        staging = R.fmt_bytes(r["staging_peak_bytes"]) if r["staging_peak_bytes"] is not None else "n/a"
        rows.append(
            [
                r["executor"],
                R.fmt_bytes(r["peak_growth_bytes"]),
                R.fmt_bytes(r["after_growth_bytes"]),
                staging,
                f"{r['first_call_s']:.2f} s",
                f"{r['second_call_s']:.2f} s",
                f"{r['total_s']:.2f} s",
                r["verified"],
            ]
        )
    spec = "executor<9|RSS growth peak>16|after>11|staging peak>13|1st call>10|2nd call>10|both done>11|verified>9"
    lines += R.table(spec, rows)
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> Any:
    ap = cli.BenchParser(__doc__ or "")
    ap.add_out(stem="bench_concurrent_async")
    ap.add_argument("--dir", default=None, help="scratch directory (default: a new temp dir under /tmp)")
    ap.add_subset("--executors", EXECUTORS)
    ap.add_argument("--state-bytes", type=cli.parse_size, default=128 * cli.MiB, help="state size (128MiB)")
    ap.add_argument("--tensor-bytes", type=cli.parse_size, default=16 * cli.MiB, help="tensor size (16MiB)")
    ap.add_argument(
        "--budget-bytes", type=cli.parse_size, default=None, help="memory_budget_bytes (default: the state's size)"
    )
    ap.add_argument("--delay-s", type=float, default=1.0, help="delay before each data object write (1.0)")
    ap.add_argument("--op-timeout", type=float, default=300.0, help="seconds per executor before it is killed")
    ap.add_argument("--child", default=None, help="==SUPPRESS==")
    ap.add_quick("8 MiB state, 1 MiB tensors, 0.1 s delay", state_bytes=8 * cli.MiB, tensor_bytes=cli.MiB, delay_s=0.1)
    args = ap.parse(argv)
    if args.tensor_bytes < 4 or args.state_bytes < args.tensor_bytes:
        ap.error("--tensor-bytes must be at least 4 and at most --state-bytes")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.child is not None:
        print(json.dumps(run_child(json.loads(args.child))))
        return 0
    with cli.scratch_dir(args.dir, "bench_concurrent_async-") as scratch:
        config = {k: v for k, v in vars(args).items() if k not in ("child", "out")}
        report = R.new_report("bench_concurrent_async", scratch, config=config)
        report["results"] = [run_executor(executor, args, scratch) for executor in args.executors]
    R.write_report(report, args.out, render(report))
    return 0 if all("error" not in r and r["verified"] for r in report["results"]) else 1


if __name__ == "__main__":
    sys.exit(main())
