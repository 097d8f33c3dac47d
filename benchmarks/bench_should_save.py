"""SnapshotManager.should_save on several gloo ranks: communication and time per call with nothing to save.

``--ranks`` (default 2) gloo ranks each open a manager and call ``should_save(step)`` for
``--steps`` (default 100) steps with nothing to save (no interval, no notice), in one process
group, the cases interleaved within each of ``--repeats`` (default 5) repetitions:

``collective``
    What ``should_save`` did before the store agreement (commit 8c5cbb5, reproduced here on the
    same manager): one all-reduce of one integer per call (``Group.any``).
``store/<n>``
    ``should_save`` as it is now, with ``preemption_check_every=n`` (``--check-every``, default
    1,10): a round through the process group's store every ``n`` calls, nothing in between.

Reported per case (exact counts; times are medians over the repetitions of each repetition's
figure): ``torch.distributed`` collectives per 100 calls (counted twice: by the manager's
``Group.collectives`` and by wrapping the ``torch.distributed`` functions), store rounds per 100
calls (``Group.store_rounds``), median and mean time per call on the slowest rank, and the time of
a call that runs a round. Targets: at most 10 collectives per 100 calls (met with none) and at most
10 store rounds per 100 calls with the default ``preemption_check_every=10``.

Usage::

    python benchmarks/bench_should_save.py --out benchmarks/results/bench_should_save-<date>.json
    python benchmarks/bench_should_save.py --quick --out /tmp/smoke.json
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # _harness, also when imported by a test

from _harness import cli, launch
from _harness import measure as M
from _harness import report as R

COLLECTIVES = ("all_reduce", "all_gather", "broadcast", "all_gather_object", "broadcast_object_list", "barrier")


def _cases(check_every: list[int]) -> list[tuple[str, int]]:
    return [("collective", 1), *(("store", n) for n in check_every)]


def _case_name(mode: str, every: int) -> str:
    return "collective" if mode == "collective" else f"store/{every}"


def _before(mgr: Any, step: int) -> bool:
    """``should_save`` before the store agreement (commit 8c5cbb5): one all-reduce per call."""
    from snapshotkit._lifecycle.values import check_step, on_interval

    step = check_step(step)
    notice = mgr._group.any(
        mgr._watcher.received.is_set(), "SnapshotManager.should_save: agreeing on a preemption notice"
    )
    if step in mgr._steps:
        return False
    return (notice and not mgr._preemption_saved) or on_interval(step, mgr.save_interval_steps)


def rank_child(spec: dict[str, Any]) -> dict[str, Any]:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    with launch.process_group(spec):
        from snapshotkit import SnapshotManager

        counted = {"calls": 0}
        for name in COLLECTIVES:
            real = getattr(dist, name)

            def wrapper(*a: Any, _real: Any = real, **k: Any) -> Any:
                counted["calls"] += 1
                return _real(*a, **k)

            setattr(dist, name, wrapper)
        runs: list[dict[str, Any]] = []
        for repeat in range(spec["repeats"]):
            for mode, every in _cases(spec["check_every"]):
                root = f"{spec['scratch']}/{mode}-{every}-{repeat}"
                mgr = SnapshotManager(root, preemption_signals=(), async_executor=None, preemption_check_every=every)
                call = _before if mode == "collective" else SnapshotManager.should_save
                group = mgr._group
                dist.barrier()
                torch_before, group_before, rounds_before = counted["calls"], group.collectives, group.store_rounds
                times_ns = []
                saves = 0
                for step in range(1, spec["steps"] + 1):
                    started = time.perf_counter_ns()
                    saves += bool(call(mgr, step))
                    times_ns.append(time.perf_counter_ns() - started)
                torch_calls = counted["calls"] - torch_before
                group_calls, rounds = group.collectives - group_before, group.store_rounds - rounds_before
                dist.barrier()
                mgr.close()
                round_calls = range(0, spec["steps"], every) if mode == "store" else range(spec["steps"])
                runs.append(
                    {
                        "case": _case_name(mode, every),
                        "repeat": repeat,
                        "saves": saves,
                        "torch_collectives": torch_calls,
                        "group_collectives": group_calls,
                        "store_rounds": rounds,
                        "median_call_s": statistics.median(times_ns) / 1e9,
                        "mean_call_s": sum(times_ns) / len(times_ns) / 1e9,
                        "median_round_call_s": statistics.median(times_ns[i] for i in round_calls) / 1e9,
                    }
                )
        return {"ok": True, "rank": spec["rank"], "runs": runs}


def summarize(args: Any, ranks: list[dict[str, Any]]) -> dict[str, Any]:
    per_100 = 100 / args.steps
    rows = []
    for mode, every in _cases(args.check_every):
        name = _case_name(mode, every)
        runs = [[r for r in rank["runs"] if r["case"] == name] for rank in ranks]  # [rank][repeat]
        by_repeat = list(zip(*runs, strict=True))  # [repeat][rank]

        def slowest(key: str, repeats: list[tuple[dict[str, Any], ...]] = by_repeat) -> float | None:
            return M.median(max(r[key] for r in per_rank) for per_rank in repeats)

        counts = {k: sorted({r[k] for rank in runs for r in rank}) for k in ("torch_collectives", "store_rounds")}
        rows.append(
            {
                "case": name,
                "check_every": every if mode == "store" else None,
                "saves": max(r["saves"] for rank in runs for r in rank),
                "collectives_per_100_calls": max(counts["torch_collectives"]) * per_100,
                "group_collectives_per_100_calls": max(r["group_collectives"] for rank in runs for r in rank) * per_100,
                "store_rounds_per_100_calls": max(counts["store_rounds"]) * per_100,
                "median_call_s": slowest("median_call_s"),
                "mean_call_s": slowest("mean_call_s"),
                "median_round_call_s": slowest("median_round_call_s"),
                "median_call_s_per_repeat": [max(r["median_call_s"] for r in per_rank) for per_rank in by_repeat],
                "mean_call_s_per_repeat": [max(r["mean_call_s"] for r in per_rank) for per_rank in by_repeat],
            }
        )
    before = rows[0]
    for row in rows[1:]:
        row["median_call_over_before"] = M.ratio(row["median_call_s"], before["median_call_s"])
        row["mean_call_over_before"] = M.ratio(row["mean_call_s"], before["mean_call_s"])
    default = next((r for r in rows if r["check_every"] == 10), None)
    target = None
    if default is not None:
        target = default["collectives_per_100_calls"] <= 10 and default["store_rounds_per_100_calls"] <= 10
    return {"ok": True, "ranks": args.ranks, "steps": args.steps, "rows": rows, "target_met": target}


def _launcher_run(spec: dict[str, Any]) -> dict[str, Any]:
    return rank_child(spec)


def parse_args(argv: list[str] | None = None) -> Any:
    ap = cli.BenchParser(__doc__)
    ap.add_out(stem="bench_should_save")
    ap.add_argument("--dir", default=None, help="scratch directory (default: a new temp dir under /tmp)")
    ap.add_argument("--ranks", type=int, default=2, help="gloo ranks (2)")
    ap.add_argument("--steps", type=int, default=100, help="should_save calls per case and repetition (100)")
    ap.add_argument("--repeats", type=int, default=5, help="repetitions, the cases interleaved in each (5)")
    ap.add_argument(
        "--check-every",
        type=lambda text: [int(n) for n in text.split(",")],
        default=[1, 10],
        help="comma-separated preemption_check_every values of the store cases (1,10)",
    )
    ap.add_argument("--op-timeout", type=float, default=900.0, help="seconds for the whole rank group")
    ap.add_quick("tiny sizes for the smoke test", steps=20, repeats=2)
    return ap.parse(argv)


def _us(seconds: float | None) -> str:
    return R.fmt_num(None if seconds is None else seconds * 1e6, ".1f")


def _ratio(value: float | str | None) -> str:
    return value if isinstance(value, str) else R.fmt_num(value, ".3g", "x")


def render(report: dict[str, Any]) -> str:
    results = report["results"]
    lines = [f"bench_should_save  {R.machine_line(report['machine'], fs=False)}", ""]
    if not results.get("ok"):
        return "\n".join([*lines, f"FAILED: {results.get('error')}"])
    lines.append(
        f"{results['ranks']} gloo ranks, {results['steps']} should_save calls with nothing to save, "
        f"{report['config']['repeats']} repetitions (cases interleaved); times in microseconds: slowest rank, "
        "median of repetitions"
    )
    lines += R.table(
        "case<12|collectives/100>16|store rounds/100>18|median call>13|mean call>11|round call>12|median vs before>18"
        "|mean vs before>16",
        [
            (
                r["case"],
                f"{r['collectives_per_100_calls']:g}",
                f"{r['store_rounds_per_100_calls']:g}",
                _us(r["median_call_s"]),
                _us(r["mean_call_s"]),
                _us(r["median_round_call_s"]),
                _ratio(r.get("median_call_over_before", "-")),
                _ratio(r.get("mean_call_over_before", "-")),
            )
            for r in results["rows"]
        ],
    )
    for r in results["rows"]:
        spread = ", ".join(_us(s) for s in r["mean_call_s_per_repeat"])
        lines.append(f"  {r['case']}: mean call per repetition {spread}")
    lines.append(
        "<= 10 collectives and <= 10 store rounds per 100 calls at preemption_check_every=10: "
        f"{R.verdict(results['target_met'])}"
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    with cli.scratch_dir(args.dir, "snapshotkit-should-save-") as scratch:
        launcher = launch.Launcher(
            "forkserver",
            args.op_timeout,
            run=_launcher_run,
            workdir=scratch,
            preload=["torch", "torch.distributed", "snapshotkit"],
        )
        spec = {"scratch": str(scratch), "steps": args.steps, "repeats": args.repeats, "check_every": args.check_every}
        ranks = launcher.run_ranks(spec, args.ranks)
        failed = [r for r in ranks if r.get("ok") is False]
        if failed:
            first = failed[0]
            results: dict[str, Any] = {"ok": False, "error": first["error"], "traceback": first.get("traceback")}
        else:
            results = summarize(args, ranks)
        report = R.new_report("bench_should_save", scratch, config=vars(args))
        report["results"] = results
        R.write_report(report, args.out, render(report))
    return 0 if results.get("ok") else 1


if __name__ == "__main__":
    sys.exit(main())
