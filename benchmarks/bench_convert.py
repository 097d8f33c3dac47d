"""Export benchmark: ``export_snapshot`` of a large snapshot against a raw copy of its bytes.

One snapshot (default 2 GiB of 64 MiB float32 tensors, taken once) is exported, each time in a
fresh process, to safetensors, torch and DCP, and its data objects are copied with
``shutil.copyfile`` (``raw_copy``: the same bytes, no parsing, no checksums, the kernel's copy) as
the baseline. Every output is fsynced (the exports do it themselves; the copy is fsynced after),
so each case pays for its bytes reaching the disk. Per run: wall time and peak RSS over the RSS
just before (the high-water mark reset first). The cases alternate order from repeat to repeat.
Targets: safetensors export at least 0.8x the raw copy's speed, with peak RSS over baseline at
most the memory budget + 10%. A few tensors of each output are checked bit for bit against the
data the snapshot was taken from (``--no-verify`` skips). Results: docs/benchmarks.md, "Export".

Usage::

    python benchmarks/bench_convert.py                  # 2 GiB, 3 repeats (a few minutes)
    python benchmarks/bench_convert.py --quick --out /tmp/convert.json
    python benchmarks/bench_convert.py --cases raw_copy,safetensors --budget 128MiB

Results go to benchmarks/results/bench_convert-<date>.json unless ``--out`` says otherwise.
"""

from __future__ import annotations

import gc
import shutil
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # _harness, also when imported by a test

from _harness import Record, cli, launch
from _harness import measure as M
from _harness import report as R
from _harness import workloads as W

CASES = ("raw_copy", "safetensors", "torch", "dcp")
PRELOAD = ["numpy", "torch", "torch.distributed.checkpoint", "safetensors.torch", "snapshotkit.convert"]
NAME = "layer{:04d}.weight"
RSS_SLACK = 0.10


def _specs(spec: Record) -> list[W.TensorSpec]:
    return W.sized_specs(spec["total_bytes"], spec["tensor_bytes"], spec["seed"], name=NAME)


def take_snapshot(path: Path, total_bytes: int, tensor_bytes: int, seed: int) -> int:
    """The snapshot every case reads: ``{"model": StateDict(layer0000.weight=..., ...)}``."""
    from snapshotkit import Snapshot, StateDict

    specs = W.sized_specs(total_bytes, tensor_bytes, seed, name=NAME)
    state = W.materialize(specs)
    Snapshot.take(str(path), {"model": StateDict(state)})
    del state
    gc.collect()
    return W.tree_bytes(path / "data")


def raw_copy(src: Path, dst: Path) -> None:
    """The baseline: the snapshot's data objects copied as they are, then fsynced."""
    dst.mkdir()
    for data_object in sorted((src / "data").iterdir()):
        shutil.copyfile(data_object, dst / data_object.name)
    W.fsync_tree(dst)


def _verify(case: str, dst: Path, spec: Record) -> list[str]:
    """Check the first, a middle and the last tensor of the output bit for bit."""
    import torch

    specs = _specs(spec)
    picked = [specs[0], specs[len(specs) // 2], specs[-1]]
    if case == "safetensors":
        from safetensors import safe_open

        with safe_open(str(dst), framework="pt") as f:
            got = {s.name: f.get_tensor(f"model.{s.name}") for s in picked}
    elif case == "torch":
        model = torch.load(dst, mmap=True, weights_only=True)["model"]
        got = {s.name: model[s.name] for s in picked}
    else:
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint import DefaultLoadPlanner

        got = W.destination(picked)
        dcp.load({"model": got}, checkpoint_id=str(dst), planner=DefaultLoadPlanner(allow_partial_load=True))
    return W.verify(got, picked)


def run_child(spec: Record) -> Record:
    """One measured run, in a fresh process."""
    import warnings

    # Imported before the measurement (what the export needs), so the import is not measured.
    import safetensors.torch  # noqa: F401
    import torch.distributed.checkpoint  # noqa: F401

    from snapshotkit.convert import export_snapshot

    warnings.filterwarnings("ignore", message="torch.distributed is disabled")
    case, src, dst = spec["case"], Path(spec["src"]), Path(spec["dst"])
    M.settle()
    with M.Measure(rss=True, io=True) as measured:
        if case == "raw_copy":
            raw_copy(src, dst)
        else:
            export_snapshot(src, dst, to=case, memory_budget_bytes=spec["budget"])
    record: Record = {"ok": True, **measured.record(), "cpu_s": measured.cpu_s, "output_bytes": W.tree_bytes(dst)}
    if spec["verify"] and case != "raw_copy":
        M.record_verification(record, _verify(case, dst, spec))
    if dst.is_dir():
        shutil.rmtree(dst)
    else:
        dst.unlink()
    return record


def summarize(runs: dict[str, list[Record]], data_bytes: int, budget: int) -> Record:
    results: Record = {}
    for case, records in runs.items():
        summary, good = M.run_summary(records, data_bytes, median_of=["peak_rss_over_baseline_bytes", "cpu_s"])
        peaks = [r["peak_rss_over_baseline_bytes"] for r in good]
        summary["max_peak_rss_over_baseline_bytes"] = max(peaks) if peaks else None
        summary["output_bytes"] = good[0]["output_bytes"] if good else None
        results[case] = summary
    raw = results.get("raw_copy", {}).get("median_s")
    for summary in results.values():
        summary["speed_vs_raw_copy"] = M.ratio(raw, summary.get("median_s"))
    targets: Record = {}
    if "safetensors" in results:
        st = results["safetensors"]
        limit = budget * (1 + RSS_SLACK)
        targets = {
            "safetensors_speed_vs_raw_copy_at_least_0.8": M.within(st["speed_vs_raw_copy"], 0.8, at_least=True),
            "safetensors_peak_rss_within_budget_plus_10pct": M.within(st["max_peak_rss_over_baseline_bytes"], limit),
        }
    return {"results": results, "targets": targets}


def render(report: Record) -> str:
    cfg = report["config"]
    lines = [
        R.machine_line(report["machine"], versions=("torch", "safetensors")),
        "",
        f"snapshot: {R.fmt_bytes(report['data_bytes'])} in {report['tensors']} tensors of "
        f"{R.fmt_bytes(cfg['tensor_bytes'])}; memory budget {R.fmt_bytes(cfg['budget'])}; "
        f"page cache {report['cache']}; median of {cfg['repeats']}",
        "",
    ]
    rows = []
    for case, s in report["results"].items():
        if not s.get("n_ok"):
            rows.append(f"{case}: FAILED: {str(s.get('error'))[:200]}")
            continue
        rows.append(
            (
                case,
                f"{s['median_s']:.2f}",
                R.fmt_gib_s(s["bandwidth_bytes_per_s"]),
                R.fmt_x(s["speed_vs_raw_copy"]),
                R.fmt_num(s["cpu_s"], ".2f"),
                R.fmt_bytes(s["peak_rss_over_baseline_bytes"]),
                R.fmt_bytes(s["max_peak_rss_over_baseline_bytes"]),
                R.fmt_bytes(s["output_bytes"]),
            )
        )
    lines += R.table(
        "case<13|median s>10|GiB/s>8|vs raw copy>13|CPU s>7|peak RSS (median)>19|peak RSS (max)>16|output>12", rows
    )
    for name, met in report["targets"].items():
        lines.append(f"target {name}: {R.verdict(met)}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = cli.BenchParser(__doc__ or "")
    parser.add_out(stem="bench_convert")
    parser.add_subset("--cases", CASES)
    parser.add_argument("--total-bytes", type=cli.parse_size, default=2 * cli.GiB, help="snapshot size (2GiB)")
    parser.add_argument("--tensor-bytes", type=cli.parse_size, default=64 * cli.MiB, help="tensor size (64MiB)")
    parser.add_argument("--budget", type=cli.parse_size, default=256 * cli.MiB, help="memory_budget_bytes (256MiB)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-verify", action="store_true", help="skip the bit-exact checks of the outputs")
    parser.add_argument("--dir", default=None, help="scratch directory (default: a new temp dir under /tmp)")
    parser.add_launcher(default=None, timeout=1800.0, unit="run", default_note="subprocess; forkserver with --quick")
    parser.add_quick(
        "smoke-test sizes: 64 MiB of 4 MiB tensors, 8 MiB budget, 1 repeat",
        total_bytes=64 * cli.MiB,
        tensor_bytes=4 * cli.MiB,
        budget=8 * cli.MiB,
        repeats=1,
    )
    args = parser.parse(argv)
    if launch.serve_child(args, run_child):
        return 0
    args.launcher = args.launcher or ("forkserver" if args.quick else "subprocess")
    config = {k: v for k, v in vars(args).items() if k not in ("out", "child", "result_file")}
    with cli.scratch_dir(args.dir, "snapshotkit-bench-convert-") as scratch:
        report = R.new_report("bench_convert", scratch, config=config, activity={"start": R.other_activity()})
        snapshot = scratch / "snapshot"
        data_bytes = take_snapshot(snapshot, args.total_bytes, args.tensor_bytes, args.seed)
        report.update(data_bytes=data_bytes, tensors=len(W.sized_specs(args.total_bytes, args.tensor_bytes, 0)))
        report["cache"] = M.prepare_cache(cold=False)  # the snapshot was just written: it is read warm
        launcher = launch.Launcher(
            args.launcher, args.op_timeout, run=run_child, workdir=scratch, script=__file__, preload=PRELOAD
        )
        runs: dict[str, list[Record]] = {case: [] for case in args.cases}
        for repeat in range(args.repeats):
            order = args.cases[repeat % len(args.cases) :] + args.cases[: repeat % len(args.cases)]
            for case in order:
                spec: dict[str, Any] = {
                    "case": case,
                    "src": str(snapshot),
                    "dst": str(scratch / f"out-{case}"),
                    "budget": args.budget,
                    "verify": not args.no_verify,
                    "total_bytes": args.total_bytes,
                    "tensor_bytes": args.tensor_bytes,
                    "seed": args.seed,
                }
                record = launcher.run(spec)
                runs[case].append(record)
                R.progress(f"repeat {repeat + 1} {case}: {R.status(record)}")
        report.update(summarize(runs, data_bytes, args.budget))
        report["activity"]["end"] = R.other_activity()
    R.write_report(report, args.out, render(report))
    return 0 if all(s.get("n_ok") == args.repeats for s in report["results"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
