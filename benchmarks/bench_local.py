"""Single-node checkpoint benchmark: snapshotkit against raw I/O and other savers.

On one deterministic state -- "large" (2 GiB of 64 MiB float32/bfloat16 tensors plus a 4 MiB
probe tensor) and "small" (20,000 float32 tensors of 4 KiB) -- it times save and load of raw
``writev``/``readv`` (one file, or four files by four threads), ``torch.save``/``load``, DCP,
safetensors, torchsnapshot and snapshotkit (``take``, ``restore`` in place with and without
checksums, ``read_object`` of one 4 MiB tensor), each operation in a fresh process with cold
reads, and reports median time, bandwidth, peak RSS over baseline and /proc/self/io deltas; it
then verifies restored data bit for bit (``--no-verify`` skips). The method, in full, and the
results: docs/benchmarks.md, "Local disk". A system whose package does not import is recorded as
skipped with the reason.

Usage::

    python benchmarks/bench_local.py --out bench_local.json           # full run
    python benchmarks/bench_local.py --large-bytes 256MiB --small-count 2000 \
        --repeats 1 --only raw,snapshotkit --out /tmp/medium.json
    python benchmarks/bench_local.py --help
"""

from __future__ import annotations

import gc
import importlib
import os
import shutil
import sys
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # _harness, also when imported by a test

from _harness import Record, cli, launch
from _harness import measure as M
from _harness import report as R
from _harness import workloads as W

STATES = ("large", "small")
COMPARED = ("torch", "dcp", "torchsnapshot", "safetensors")
LABELS = {  # system -> op -> what the table calls it
    "raw": {"save": "write+fsync", "load": "readv"},
    "raw4": {"save": "4 x write+fsync", "load": "4 x readv"},
    "torch": {"save": "torch.save+fsync", "load": "torch.load"},
    "dcp": {"save": "dcp.save", "load": "dcp.load"},
    "safetensors": {"save": "save_file+fsync", "load": "load_file+copy"},
    "torchsnapshot": {"save": "take+fsync", "load": "restore"},
    "snapshotkit": {
        "save": "take",
        "load": "restore",
        "load_no_checksum": "restore (no checksums)",
        "read_object": "read_object 4 MiB",
    },
}
# system -> (module, names) that must import for the system to be benchmarked.
_IMPORTS = {
    "raw": ("torch", ()),
    "raw4": ("torch", ()),
    "torch": ("torch", ()),
    "dcp": ("torch.distributed.checkpoint", ("save", "load")),
    "safetensors": ("safetensors.torch", ("save_file", "load_file")),
    "torchsnapshot": ("torchsnapshot", ("Snapshot", "StateDict")),
    "snapshotkit": ("snapshotkit", ("Snapshot", "StateDict")),
}
SYSTEMS = tuple(_IMPORTS)
# Pure-library imports shared by the forkserver children (none starts threads).
PRELOAD = ["numpy", "torch", "torch.distributed.checkpoint", "safetensors.torch", "torchsnapshot"]
NOTES = {
    "peak_rss_over_baseline_bytes": "peak RSS after the op (VmHWM, i.e. ru_maxrss without the value "
    "inherited across exec; mark reset via clear_refs just before) "
    "minus RSS right before the op, in the op's own process",
    "rchar": "from /proc/self/io; counts every read syscall of the process (all threads)",
    "read_bytes": "from /proc/self/io; block-layer reads incl. readahead and, after a cache drop, "
    "library code pages faulted in during the op -- noisy for small reads",
    "raw": "raw readv is a single sequential stream; a library using parallel reads can exceed it",
    "fsync": "the benchmark adds an fsync of all written files to safetensors and torchsnapshot "
    "saves (they do not fsync themselves); dirty_after_bytes shows system Dirty after a save",
    "torch.load": "allocates new tensors (no in-place API); others load into pre-allocated ones",
}


def ops_for(system: str, state: str) -> list[str]:
    ops = ["save", "load"]
    if system == "snapshotkit":
        ops.append("load_no_checksum")
        if state == "large":
            ops.append("read_object")
    return ops


def specs_for(state: str, cfg: Record) -> list[W.TensorSpec]:
    if state == "large":
        return W.large_state_specs(cfg["large_bytes"], cfg["large_tensor_bytes"], cfg["seed"])
    return W.small_state_specs(cfg["small_count"], cfg["small_bytes"], cfg["seed"])


def op_bytes(op: str, state_nbytes: int) -> int:
    return W.PROBE_BYTES if op == "read_object" else state_nbytes


# --------------------------------------------------------------------------- #
# Child side: one operation in a fresh process
# --------------------------------------------------------------------------- #
def _prepare_op(spec: Record) -> tuple[Callable[[], Any], Record]:
    """Import the system, build state/destination and return (timed callable,
    context).  The callable returns the mapping to verify (or None)."""
    import torch

    system, op, target = spec["system"], spec["op"], spec["target"]
    specs = specs_for(spec["state"], spec["cfg"])
    ctx: Record = {"specs": specs}
    lib = importlib.import_module(_IMPORTS[system][0])  # before the timing
    budget = {"memory_budget_bytes": spec["budget"]} if system == "snapshotkit" else {}

    if op == "save":
        src = ctx["keepalive"] = W.materialize(specs)

        def save() -> None:
            if system == "raw":
                W.raw_save(target, src)
            elif system == "raw4":
                W.raw_save_parallel(target, src)
            elif system == "torch":
                with open(target, "wb") as f:
                    torch.save(src, f)
                    f.flush()
                    os.fsync(f.fileno())
            elif system == "dcp":
                lib.save(src, checkpoint_id=target)
            elif system == "safetensors":
                lib.save_file(src, target)
                W.fsync_tree(target)
            else:  # torchsnapshot and snapshotkit share the API; torchsnapshot does not fsync
                lib.Snapshot.take(target, {"sd": lib.StateDict(**src)}, **budget)
                if system == "torchsnapshot":
                    W.fsync_tree(target)

        return save, ctx

    if op == "read_object":
        ctx["specs"] = [s for s in specs if s.name == W.PROBE_KEY]
        return (lambda: {W.PROBE_KEY: lib.Snapshot(target).read_object(f"sd/{W.PROBE_KEY}", **budget)}), ctx
    if system == "torch":
        return (lambda: torch.load(target, weights_only=True)), ctx

    dst = ctx["dst"] = W.destination(specs)
    checksums = {"verify_checksums": False} if op == "load_no_checksum" else {}

    def load() -> Any:
        if system == "raw":
            W.raw_load(target, dst)
        elif system == "raw4":
            W.raw_load_parallel(target, dst)
        elif system == "dcp":
            lib.load(dst, checkpoint_id=target)
        elif system == "safetensors":
            for k, v in lib.load_file(target).items():
                dst[k].copy_(v)
        else:
            sd = lib.StateDict(**dst)
            lib.Snapshot(target).restore({"sd": sd}, **budget, **checksums)
            return sd
        return dst

    return load, ctx


def _same_storage(a: Any, b: Any) -> bool:
    return a is b or (hasattr(a, "data_ptr") and a.data_ptr() == b.data_ptr())


def run_op(spec: Record) -> Record:
    """Run one timed operation in this (fresh) process and return its record."""
    warnings.filterwarnings("ignore", message=".*torch.distributed is disabled.*")
    res: Record = {"system": spec["system"], "op": spec["op"], "ok": False}
    try:
        fn, ctx = _prepare_op(spec)
    except Exception as exc:
        return {**res, **launch.error_record(exc, "setup: ")}
    is_read = spec["op"] != "save"
    gc.collect()
    res["cache"] = M.prepare_cache(spec["cold"]) if is_read else "n/a (write)"
    try:
        with M.Measure(rss=True, io=True) as measured:
            out = fn()
    except Exception as exc:
        # A snapshotkit without the checksum switch cannot do this op at all: not a failure.
        if isinstance(exc, TypeError) and spec["op"] == "load_no_checksum" and "verify_checksums" in str(exc):
            return {**res, "na": True, "reason": f"TypeError: {exc}"}
        return {**res, **launch.error_record(exc)}
    res.update(ok=True, **measured.record())
    if not is_read:
        res["dirty_after_bytes"] = M.dirty_bytes()
    if spec["verify"] and out is not None:
        M.record_verification(res, W.verify(out, ctx["specs"]))
    if "dst" in ctx and spec["system"] == "snapshotkit" and hasattr(out, "get"):
        dst = ctx["dst"]
        res["in_place"] = all(_same_storage(out.get(k), t) for k, t in dst.items())
    return res


# --------------------------------------------------------------------------- #
# Parent side: orchestration
# --------------------------------------------------------------------------- #
def summarize(runs: list[Record], nbytes: int) -> Record:
    out, good = M.run_summary(runs, nbytes, first=("bytes_on_disk",))
    if any(r.get("na") for r in runs):
        out["na"] = next(r["reason"] for r in runs if r.get("na"))
    if not good:
        return out
    rss = [r["peak_rss_over_baseline_bytes"] for r in good]
    out.update(peak_rss_over_baseline_bytes=M.median(rss), peak_rss_over_baseline_bytes_max=max(rss))
    out.update(cache=sorted({r.get("cache", "?") for r in good}))
    out.update(M.medians(good, {f"median_{k}": k for k in M.IO_KEYS}, group="io_delta"))
    if any("in_place" in r for r in good):
        out["in_place"] = all(r.get("in_place", True) for r in good)
    return out


def compute_ratios(state: str, res: Record, budget: int) -> Record:
    def get(system: str, op: str, key: str) -> Any:
        return res.get(system, {}).get(op, {}).get(key)

    def speedups(op: str) -> dict[str, float | None]:
        ours = get("snapshotkit", op, "median_s")
        return {s: M.ratio(get(s, op, "median_s"), ours) for s in COMPARED}

    def best_raw(op: str) -> Any:
        values = [v for v in (get("raw", op, "bandwidth_bytes_per_s"), get("raw4", op, "bandwidth_bytes_per_s")) if v]
        return max(values) if values else None

    r: Record = {
        # raw = the faster of one sequential stream and four parallel streams of the same bytes
        "snapshotkit_take_bw_over_raw_write_bw": M.ratio(
            get("snapshotkit", "save", "bandwidth_bytes_per_s"), best_raw("save")
        ),
        "snapshotkit_restore_bw_over_raw_read_bw": M.ratio(
            get("snapshotkit", "load", "bandwidth_bytes_per_s"), best_raw("load")
        ),
        "take_speedup_vs (their_time/ours)": speedups("save"),
        "restore_speedup_vs (their_time/ours)": speedups("load"),
        "restore_time_with_over_without_checksums": M.ratio(
            get("snapshotkit", "load", "median_s"), get("snapshotkit", "load_no_checksum", "median_s")
        ),
    }
    if get("snapshotkit", "load_no_checksum", "na"):
        r["restore_time_with_over_without_checksums"] = "n/a"
    if state == "large":
        r["read_object_rchar_over_tensor_bytes"] = M.ratio(
            get("snapshotkit", "read_object", "median_rchar"), W.PROBE_BYTES
        )
        r["read_object_storage_read_bytes_over_tensor_bytes"] = M.ratio(
            get("snapshotkit", "read_object", "median_read_bytes"), W.PROBE_BYTES
        )
    rss: Record = {"memory_budget_bytes": budget}
    for system, names in (("snapshotkit", ("take", "restore")), ("torch", ("save", "load")), ("dcp", ("save", "load"))):
        for op, name in zip(("save", "load"), names, strict=True):
            rss[f"{system}_{name}"] = get(system, op, "peak_rss_over_baseline_bytes")
    rss["snapshotkit_take_over_budget"] = M.ratio(rss["snapshotkit_take"], budget)
    rss["snapshotkit_restore_over_budget"] = M.ratio(rss["snapshotkit_restore"], budget)
    r["peak_rss_over_baseline"] = rss
    return r


COLUMNS = "system<14|operation<24|median s>10|GiB/s>9|peak RSS-base>15|  notes<0"


def _op_row(system: str, op: str, s: Record, state_bytes: int) -> list[str]:
    notes = []
    if s.get("na"):
        notes.append("n/a: " + s["na"][:70])
    if s.get("error"):
        notes.append("ERROR: " + s["error"][:90])
    if op == "read_object" and s.get("median_rchar") is not None:
        notes.append(f"rchar {R.fmt_bytes(s['median_rchar'])}, storage {R.fmt_bytes(s.get('median_read_bytes'))}")
    if s.get("in_place") is False:
        notes.append("NOT in place")
    gib_s = R.fmt_gib_s(M.ratio(op_bytes(op, state_bytes), s.get("median_s")))
    peak = R.fmt_bytes(s.get("peak_rss_over_baseline_bytes"))
    return [system, LABELS[system].get(op, op), R.fmt_num(s.get("median_s")), gib_s, peak, "  " + "; ".join(notes)]


def render(report: Record) -> str:
    lines = [R.machine_line(report["machine"])]
    budget = report["config"]["memory_budget_bytes"]
    for state, sres in report["results"].items():
        info = report["states"][state]
        lines.append("")
        lines.append(
            f"== {state}: {info['tensors']} tensors, {R.fmt_bytes(info['bytes'])}; "
            f"median of {report['config']['repeats']}; reads: {report['read_cache']} page cache =="
        )
        rows: list[list[str]] = []
        for system, ops in sres.items():
            if "skipped" in ops:
                rows.append([system, "-", "", "", "", f"  skipped: {ops['skipped'][:80]}"])
            else:
                rows += [_op_row(system, op, s, info["bytes"]) for op, s in ops.items()]
        lines += R.table(COLUMNS, rows)
        r = report["ratios"][state]
        lines.append(f"-- ratios ({state}) --")
        lines.append(f"snapshotkit take bw / best raw write bw: {R.fmt_x(r['snapshotkit_take_bw_over_raw_write_bw'])}")
        lines.append(
            f"snapshotkit restore bw / best raw read bw: {R.fmt_x(r['snapshotkit_restore_bw_over_raw_read_bw'])}"
        )
        for kind in ("take", "restore"):
            sp = r[f"{kind}_speedup_vs (their_time/ours)"]
            lines.append(
                f"{kind} speedup (their time / ours):".ljust(41) + "  ".join(f"{k} {R.fmt_x(v)}" for k, v in sp.items())
            )
        lines.append(
            f"restore time with / without checksums:  {R.fmt_x(r['restore_time_with_over_without_checksums'])}"
        )
        if "read_object_rchar_over_tensor_bytes" in r:
            lines.append(
                f"read_object rchar / tensor bytes:        {R.fmt_x(r['read_object_rchar_over_tensor_bytes'])}"
                f"  (storage read_bytes: {R.fmt_x(r['read_object_storage_read_bytes_over_tensor_bytes'])})"
            )
        p = r["peak_rss_over_baseline"]
        lines.append(
            f"peak RSS over baseline (budget {R.fmt_bytes(budget)}): snapshotkit take "
            f"{R.fmt_bytes(p['snapshotkit_take'])} ({R.fmt_x(p['snapshotkit_take_over_budget'])} budget), restore "
            f"{R.fmt_bytes(p['snapshotkit_restore'])} ({R.fmt_x(p['snapshotkit_restore_over_budget'])} budget); "
            f"torch.save {R.fmt_bytes(p['torch_save'])}, torch.load {R.fmt_bytes(p['torch_load'])}; "
            f"dcp.save {R.fmt_bytes(p['dcp_save'])}, dcp.load {R.fmt_bytes(p['dcp_load'])}"
        )
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> Any:
    ap = cli.BenchParser(__doc__)
    ap.add_out(default="bench_local.json")
    ap.add_argument("--dir", default=None, help="scratch directory (default: a new temp dir under /tmp)")
    ap.add_subset("--only", SYSTEMS)
    ap.add_subset("--states", STATES)
    ap.add_argument("--repeats", type=int, default=3, help="repeats per operation; the median is reported")
    ap.add_argument("--large-bytes", type=cli.parse_size, default=2 * cli.GiB, help="large state total (default 2GiB)")
    ap.add_argument("--large-tensor-bytes", type=cli.parse_size, default=64 * cli.MiB, help="large tensor size (64MiB)")
    ap.add_argument("--small-count", type=int, default=20_000, help="number of small tensors (20000)")
    ap.add_argument("--small-bytes", type=cli.parse_size, default=4 * cli.KiB, help="bytes per small tensor (4KiB)")
    ap.add_argument("--memory-budget-bytes", type=cli.parse_size, default=256 * cli.MiB, help="snapshotkit budget")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_launcher(default="subprocess", timeout=3600.0, unit="operation")
    ap.add_argument("--no-drop-caches", action="store_true", help="do not drop the page cache before reads")
    ap.add_argument("--no-verify", action="store_true", help="skip bit-exact verification of restored data")
    args = ap.parse(argv)
    args.cfg = {
        k: getattr(args, k) for k in ("large_bytes", "large_tensor_bytes", "small_count", "small_bytes", "seed")
    }
    try:
        args.state_specs = {s: specs_for(s, args.cfg) for s in args.states}  # validates sizes early
    except ValueError as exc:
        ap.error(str(exc))
    return args


def run_system(
    launcher: launch.Launcher, args: Any, workdir: Path, state: str, system: str
) -> Iterator[tuple[str, Record]]:
    """One save of ``system`` and the operations that read it back, each in a fresh process; the
    work directory is removed afterwards."""
    workdir.mkdir()
    target = str(workdir / system)  # a file or a directory, as the system writes it
    base = {"system": system, "state": state, "cfg": args.cfg, "target": target, "cold": args.cold}
    base.update(budget=args.memory_budget_bytes, verify=not args.no_verify)

    def run(op: str) -> Record:
        rec = launcher.run({**base, "op": op})
        if op == "save" and rec.get("ok"):
            rec["bytes_on_disk"] = W.tree_bytes(target)
        return rec

    try:
        yield from M.save_first(ops_for(system, state), run)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if launch.serve_child(args, run_op):
        return 0
    args.cold = not args.no_drop_caches and M.can_drop_caches()
    available = {s: W.unavailable([_IMPORTS[s]]) for s in args.only}
    with cli.scratch_dir(args.dir, "snapshotkit-bench-") as scratch:
        config = {
            **args.cfg,
            "repeats": args.repeats,
            "memory_budget_bytes": args.memory_budget_bytes,
            "systems": args.only,
            "states": args.states,
            "launcher": args.launcher,
            "scratch_dir": str(scratch),
            "verify": not args.no_verify,
        }
        report = R.new_report("bench_local", scratch, config=config, read_cache="cold" if args.cold else "warm")
        report.update(
            notes=NOTES,
            states={s: {"tensors": len(sp), "bytes": W.state_bytes(sp)} for s, sp in args.state_specs.items()},
            results={},
            ratios={},
        )
        launcher = launch.Launcher(
            args.launcher, args.op_timeout, run=run_op, workdir=scratch, script=__file__, preload=PRELOAD
        )
        for state, specs in args.state_specs.items():
            runs: dict[str, dict[str, list[Record]]] = {}
            for rep in range(args.repeats):
                for system in (s for s in args.only if not available[s]):
                    workdir = scratch / f"{state}-{system}-{rep}"
                    for op, rec in run_system(launcher, args, workdir, state, system):
                        runs.setdefault(system, {}).setdefault(op, []).append(rec)
                        R.progress(f"[{state} {rep + 1}/{args.repeats}] {system} {LABELS[system][op]}: {R.status(rec)}")
            nbytes = W.state_bytes(specs)
            sres = {
                system: {"skipped": available[system]}
                if available[system]
                else {op: summarize(rs, op_bytes(op, nbytes)) for op, rs in runs.get(system, {}).items()}
                for system in args.only
            }
            report["results"][state] = sres
            report["ratios"][state] = compute_ratios(state, sres, args.memory_budget_bytes)
    R.write_report(report, args.out, render(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
