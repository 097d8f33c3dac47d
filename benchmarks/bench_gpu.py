"""GPU staging benchmark: time blocked in ``async_take`` of a GPU state against a pinned device-to-host copy.

A state of float32 tensors on one GPU (default 2 GiB of 64 MiB tensors) is snapshotted
``--snapshots`` times per mode, in one process, each call after the GPU finished the step before
it (so the time measured is staging, not waiting for queued kernels), and the caller then waits
for the snapshot to be written before the next step changes the tensors:

* ``memcpy``: ``copy_(non_blocking=True)`` of every tensor into preallocated pinned host buffers,
  then a synchronize: the floor any staging can reach;
* ``thread`` / ``process``: ``Snapshot.async_take(executor=...)``; blocked = the call;
* ``dcp_pinned`` / ``dcp_pinned_shared``: DCP's ``async_save`` with one ``DefaultStager`` for the
  run, ``StagingOptions(use_pinned_memory=True, use_shared_memory=False/True,
  use_async_staging=False)``: blocked = the call (staging happens in it);
* ``dcp_async_staging``: the same with ``use_async_staging=True``; the call returns before the
  copy, so blocked = until ``staging_completion`` (the earliest the state may change).

The first call of each mode (buffers allocated and pinned) is reported apart from the median of
the later ones. The last snapshot of each mode is loaded back and compared bit for bit. Without
CUDA the script exits with status 2 and a message, writing nothing. Results: docs/benchmarks.md,
"GPU staging".

Usage::

    python benchmarks/bench_gpu.py --out gpu.json                 # 2 GiB; sized for < 5 min on one GPU (not yet run)
    python benchmarks/bench_gpu.py --quick --out /tmp/gpu.json    # 64 MiB smoke run
    python benchmarks/bench_gpu.py --modes memcpy,thread --state-bytes 8GiB
"""

from __future__ import annotations

import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # _harness, also when imported by a test

from _harness import Record, cli
from _harness import measure as M
from _harness import report as R

MODES = ("memcpy", "thread", "process", "dcp_pinned", "dcp_pinned_shared", "dcp_async_staging")
LABELS = {
    "memcpy": "pinned D2H copy",
    "thread": "snapshotkit thread",
    "process": "snapshotkit process",
    "dcp_pinned": "dcp pinned stager",
    "dcp_pinned_shared": "dcp pinned+shared stager",
    "dcp_async_staging": "dcp pinned, async staging",
}
NOTES = [
    "blocked_s: from the call until the caller may change the state (DCP async staging: until staging_completion)",
    "each call starts after torch.cuda.synchronize(): queued kernels are not part of the time",
    "first call: staging buffers allocated and pinned; later: the median of the other calls",
]


def parse_args(argv: list[str] | None = None) -> Any:
    ap = cli.BenchParser(__doc__)
    ap.add_out(stem="bench_gpu")
    ap.add_argument("--dir", default=None, help="scratch directory (default: a new temp dir under /tmp)")
    ap.add_subset("--modes", MODES)
    ap.add_argument("--state-bytes", type=cli.parse_size, default=2 * cli.GiB, help="GPU state total (default 2GiB)")
    ap.add_argument("--tensor-bytes", type=cli.parse_size, default=64 * cli.MiB, help="tensor size (default 64MiB)")
    ap.add_argument("--snapshots", type=int, default=4, help="snapshots per mode (default 4)")
    ap.add_argument("--device", type=int, default=0, help="CUDA device index (default 0)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_quick(
        "smoke-test sizes: 64 MiB state, 2 snapshots", state_bytes=64 * cli.MiB, tensor_bytes=8 * cli.MiB, snapshots=2
    )
    args = ap.parse(argv)
    if args.snapshots < 2:
        ap.error("--snapshots must be >= 2 (the first call is reported apart)")
    if args.tensor_bytes < 4096 or args.tensor_bytes % 4096 or args.state_bytes % args.tensor_bytes:
        ap.error("--tensor-bytes must be a multiple of 4096 and divide --state-bytes")
    if args.device < 0:
        ap.error("--device must be >= 0")
    return args


def make_state(args: Any) -> dict[str, Any]:
    import torch

    generator = torch.Generator(device=f"cuda:{args.device}").manual_seed(args.seed)
    count, numel = args.state_bytes // args.tensor_bytes, args.tensor_bytes // 4
    return {f"t{i:04d}": torch.randn(numel, device=f"cuda:{args.device}", generator=generator) for i in range(count)}


def step(state: dict[str, Any]) -> None:
    """A training step's worth of writes to every tensor, finished before the next call."""
    import torch

    for tensor in state.values():
        tensor.add_(1.0)
    torch.cuda.synchronize()


def run_memcpy(state: dict[str, Any], calls: int) -> list[Record]:
    import torch

    hosts = {k: torch.empty(v.shape, dtype=v.dtype, pin_memory=True) for k, v in state.items()}
    out: list[Record] = []
    for _ in range(calls):
        step(state)
        started = time.perf_counter()
        for key, tensor in state.items():
            hosts[key].copy_(tensor, non_blocking=True)
        torch.cuda.synchronize()
        seconds = time.perf_counter() - started
        out.append({"call_s": seconds, "blocked_s": seconds})
    ok = all(torch.equal(hosts[k], v.cpu()) for k, v in state.items())
    out[-1]["verified"] = ok
    return out


def run_snapshotkit(state: dict[str, Any], calls: int, executor: str, scratch: Path) -> list[Record]:
    import torch

    from snapshotkit import Snapshot, StateDict

    out: list[Record] = []
    for call in range(calls):
        step(state)
        path = scratch / f"{executor}-{call}"
        started = time.perf_counter()
        pending = Snapshot.async_take(str(path), {"m": StateDict(state)}, executor=executor)
        called = time.perf_counter()
        pending.wait()
        done = time.perf_counter()
        out.append({"call_s": called - started, "blocked_s": called - started, "wait_s": done - called})
        if call == calls - 1:
            loaded = {k: torch.zeros_like(v) for k, v in state.items()}
            Snapshot(str(path)).restore({"m": StateDict(loaded)})
            out[-1]["verified"] = all(torch.equal(loaded[k], v) for k, v in state.items())
        shutil.rmtree(path, ignore_errors=True)
    return out


def run_dcp(state: dict[str, Any], calls: int, mode: str, scratch: Path) -> list[Record]:
    import torch
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions

    options = StagingOptions(
        use_pinned_memory=True,
        use_shared_memory=mode == "dcp_pinned_shared",
        use_async_staging=mode == "dcp_async_staging",
        use_non_blocking_copy=True,
    )
    stager = DefaultStager(options)
    out: list[Record] = []
    try:
        for call in range(calls):
            step(state)
            path = scratch / f"{mode}-{call}"
            started = time.perf_counter()
            response = dcp.async_save({"m": state}, checkpoint_id=str(path), async_stager=stager, no_dist=True)
            called = time.perf_counter()
            upload = getattr(response, "upload_completion", response)
            staging = getattr(response, "staging_completion", None)
            if staging is not None:
                staging.result()
            staged = time.perf_counter()
            upload.result()
            done = time.perf_counter()
            out.append({"call_s": called - started, "blocked_s": staged - started, "wait_s": done - staged})
            if call == calls - 1:
                loaded = {"m": {k: torch.zeros_like(v) for k, v in state.items()}}
                dcp.load(loaded, checkpoint_id=str(path), no_dist=True)
                out[-1]["verified"] = all(torch.equal(loaded["m"][k], v) for k, v in state.items())
            shutil.rmtree(path, ignore_errors=True)
    finally:
        stager.close()
    return out


def summarize(calls: list[Record]) -> Record:
    later = [c["blocked_s"] for c in calls[1:]]
    waits = [c["wait_s"] for c in calls if c.get("wait_s") is not None]
    return {
        "calls": calls,
        "first_blocked_s": calls[0]["blocked_s"],
        "later_blocked_median_s": M.median(later),
        "later_blocked_min_s": min(later),
        "wait_median_s": M.median(waits),
        "verified": calls[-1].get("verified"),
    }


def render(report: Record) -> str:
    memcpy = report["results"].get("memcpy", {}).get("later_blocked_median_s")
    rows: list[Any] = []
    for mode, result in report["results"].items():
        if "error" in result or "skipped" in result:
            rows.append(f"{LABELS[mode]:<28}{result.get('error') or result.get('skipped')}")
            continue
        rows.append(
            (
                LABELS[mode],
                R.fmt_num(result["first_blocked_s"]),
                R.fmt_num(result["later_blocked_median_s"]),
                R.fmt_x(M.ratio(result["later_blocked_median_s"], memcpy)),
                R.fmt_num(result["wait_median_s"]),
                result["verified"],
            )
        )
    lines = [
        R.machine_line(report["machine"], versions=("torch",)) + f" | GPU {report['gpu']['name']}",
        f"state {R.fmt_bytes(report['config']['state_bytes'])} on cuda:{report['config']['device']}, "
        f"{report['config']['snapshots']} snapshots per mode",
        "",
        "== time blocked (s)",
        *R.table("mode<28|first>10|later median>14|x memcpy>10|wait>10|verified>10", rows),
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import torch

    if not torch.cuda.is_available() or torch.cuda.device_count() <= args.device:
        print(
            f"bench_gpu.py: CUDA device {args.device} is not available on this machine "
            f"(torch {torch.__version__}, {torch.cuda.device_count()} CUDA devices); run it on a GPU machine. "
            "Nothing was measured or written.",
            file=sys.stderr,
        )
        return 2
    torch.cuda.set_device(args.device)
    runners: dict[str, Callable[[dict[str, Any], int, Path], list[Record]]] = {
        "memcpy": lambda state, calls, scratch: run_memcpy(state, calls),
        "thread": lambda state, calls, scratch: run_snapshotkit(state, calls, "thread", scratch),
        "process": lambda state, calls, scratch: run_snapshotkit(state, calls, "process", scratch),
    }
    for mode in ("dcp_pinned", "dcp_pinned_shared", "dcp_async_staging"):
        runners[mode] = lambda state, calls, scratch, mode=mode: run_dcp(state, calls, mode, scratch)
    with cli.scratch_dir(args.dir, "snapshotkit-bench-gpu-") as scratch:
        config = {k: getattr(args, k) for k in ("state_bytes", "tensor_bytes", "snapshots", "device", "seed", "modes")}
        config.update(quick=args.quick, scratch_dir=str(scratch), snapshotkit_env=R.snapshotkit_env())
        report = R.new_report("bench_gpu", scratch, config=config, notes=NOTES)
        properties = torch.cuda.get_device_properties(args.device)
        report["gpu"] = {"name": properties.name, "memory_bytes": properties.total_memory, "cuda": torch.version.cuda}
        state = make_state(args)
        report["results"] = {}
        for mode in args.modes:
            try:
                calls = runners[mode](state, args.snapshots, scratch)
                result = summarize(calls)
            except Exception as exc:  # a mode that fails is reported, the others still run
                result = {"error": f"{type(exc).__name__}: {exc}"}
            report["results"][mode] = result
            R.progress(f"{mode}: {result.get('error') or round(result['later_blocked_median_s'], 4)}")
    memcpy = report["results"].get("memcpy", {}).get("later_blocked_median_s")
    report["ratios"] = {
        mode: {"later_blocked_over_memcpy": M.ratio(r.get("later_blocked_median_s"), memcpy)}
        for mode, r in report["results"].items()
    }
    R.write_report(report, args.out, render(report))
    failed = [m for m, r in report["results"].items() if "error" in r or r.get("verified") is not True]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
