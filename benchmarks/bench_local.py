"""Single-node checkpoint benchmark: snapshotkit against raw I/O and other savers.

In one run, on the same deterministic state, this measures

* raw I/O: sequential ``os.writev`` of the tensors' bytes into one file plus
  ``fsync``, and sequential ``os.readv`` back into pre-allocated tensors
  (the hardware ceiling);
* ``torch.save`` into an open file plus ``fsync`` / ``torch.load(weights_only=True)``;
* ``torch.distributed.checkpoint`` ``save`` / ``load`` (single process, no
  process group) into pre-allocated tensors;
* safetensors ``save_file`` (plus an ``fsync`` added by the benchmark) /
  ``load_file`` followed by a copy of every tensor (so lazy mmap is paid for);
* torchsnapshot ``Snapshot.take`` (plus an ``fsync`` added by the benchmark) /
  ``Snapshot.restore``;
* snapshotkit ``Snapshot.take`` / ``restore`` in place (with and without
  checksum verification) / ``read_object`` of one 4 MiB tensor, all with
  ``memory_budget_bytes``,

for a "large" state (default 2 GiB of 64 MiB float32/bfloat16 tensors plus one
4 MiB float32 tensor ``probe_4mib``) and a "small" state (default 20,000
float32 tensors of 4 KiB).

Every operation runs in a fresh process (``--launcher subprocess``: this script
re-executed with ``--child``; ``--launcher forkserver``: forked from a server
with torch pre-imported, much faster to start).  The process builds its state
or destination, imports what it needs, calls ``os.sync()`` (and, before reads,
drops the page cache when /proc/sys/vm/drop_caches is writable, else records
``"cache": "warm"``), resets its peak-RSS mark and then times only the
operation.  Reported per operation: median wall time over ``--repeats``,
bandwidth (state bytes / time), ``peak_rss_over_baseline_bytes`` (peak RSS
after the operation -- ``VmHWM``, i.e. ``ru_maxrss`` minus what Linux carries
over ``exec`` from the parent -- minus RSS just before it; ``ru_maxrss`` itself
is kept in the per-run records) and /proc/self/io deltas.
After timing, restored data is verified bit-exactly (``--no-verify`` skips).

Usage::

    python benchmarks/bench_local.py --out bench_local.json           # full run
    python benchmarks/bench_local.py --large-bytes 256MiB --small-count 2000 \\
        --repeats 1 --only raw,snapshotkit --out /tmp/medium.json
    python benchmarks/bench_local.py --help

Systems: raw, torch, dcp, safetensors, torchsnapshot, snapshotkit.  A system
whose package does not import is recorded as skipped with the reason.
"""

from __future__ import annotations

import argparse
import gc
import importlib
import json
import os
import resource
import shutil
import sys
import tempfile
import time
import traceback
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
_REPO_ROOT = Path(__file__).resolve().parents[1]
if (_REPO_ROOT / "snapshotkit").is_dir() and str(_REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(_REPO_ROOT))

import _common as C  # noqa: E402

SYSTEMS = ("raw", "raw4", "torch", "dcp", "safetensors", "torchsnapshot", "snapshotkit")
STATES = ("large", "small")
COMPARED = ("torch", "dcp", "torchsnapshot", "safetensors")
TARGET = {
    "raw": "data.bin",
    "raw4": "raw4",
    "torch": "state.pt",
    "dcp": "dcp",
    "safetensors": "state.safetensors",
    "torchsnapshot": "snap",
    "snapshotkit": "snap",
}
LABELS = {
    ("raw", "save"): "write+fsync",
    ("raw", "load"): "readv",
    ("raw4", "save"): "4 x write+fsync",
    ("raw4", "load"): "4 x readv",
    ("torch", "save"): "torch.save+fsync",
    ("torch", "load"): "torch.load",
    ("dcp", "save"): "dcp.save",
    ("dcp", "load"): "dcp.load",
    ("safetensors", "save"): "save_file+fsync",
    ("safetensors", "load"): "load_file+copy",
    ("torchsnapshot", "save"): "take+fsync",
    ("torchsnapshot", "load"): "restore",
    ("snapshotkit", "save"): "take",
    ("snapshotkit", "load"): "restore",
    ("snapshotkit", "load_no_checksum"): "restore (no checksums)",
    ("snapshotkit", "read_object"): "read_object 4 MiB",
}


def ops_for(system: str, state: str) -> list[str]:
    ops = ["save", "load"]
    if system == "snapshotkit":
        ops.append("load_no_checksum")
        if state == "large":
            ops.append("read_object")
    return ops


def specs_for(state: str, cfg: dict[str, Any]) -> list[C.TensorSpec]:
    if state == "large":
        return C.large_state_specs(cfg["large_bytes"], cfg["large_tensor_bytes"], cfg["seed"])
    return C.small_state_specs(cfg["small_count"], cfg["small_bytes"], cfg["seed"])


# --------------------------------------------------------------------------- #
# Child side: one operation in a fresh process
# --------------------------------------------------------------------------- #
def _prepare_op(spec: dict[str, Any]) -> tuple[Callable[[], Any], dict[str, Any]]:
    """Import the system, build state/destination and return (timed callable,
    context).  The callable returns the mapping to verify (or None)."""
    import torch

    system, op, budget = spec["system"], spec["op"], spec["budget"]
    target = spec["target"]
    specs = specs_for(spec["state"], spec["cfg"])
    ctx: dict[str, Any] = {"specs": specs}
    if system == "dcp":
        dcp = importlib.import_module("torch.distributed.checkpoint")
    elif system == "safetensors":
        from safetensors.torch import load_file, save_file
    elif system == "torchsnapshot":
        from torchsnapshot import Snapshot as TSnapshot
        from torchsnapshot import StateDict as TStateDict
    elif system == "snapshotkit":
        from snapshotkit import Snapshot as KSnapshot
        from snapshotkit import StateDict as KStateDict

    if op == "save":
        src = C.materialize(specs)
        ctx["keepalive"] = src

        def save() -> None:
            if system == "raw":
                C.raw_save(target, src)
            elif system == "raw4":
                C.raw_save_parallel(target, src)
            elif system == "torch":
                with open(target, "wb") as f:
                    torch.save(src, f)
                    f.flush()
                    os.fsync(f.fileno())
            elif system == "dcp":
                dcp.save(src, checkpoint_id=target)
            elif system == "safetensors":
                save_file(src, target)
                C.fsync_tree(target)
            elif system == "torchsnapshot":
                TSnapshot.take(target, {"sd": TStateDict(**src)})
                C.fsync_tree(target)
            else:
                KSnapshot.take(target, {"sd": KStateDict(**src)}, memory_budget_bytes=budget)

        return save, ctx

    if op == "read_object":
        ctx["specs"] = [s for s in specs if s.name == C.PROBE_KEY]
        return (
            lambda: {C.PROBE_KEY: KSnapshot(target).read_object(f"sd/{C.PROBE_KEY}", memory_budget_bytes=budget)}
        ), ctx
    if system == "torch":
        return (lambda: torch.load(target, weights_only=True)), ctx

    dst = C.destination(specs)
    ctx["dst"] = dst

    def load() -> Any:
        if system == "raw":
            C.raw_load(target, dst)
            return dst
        if system == "raw4":
            C.raw_load_parallel(target, dst)
            return dst
        if system == "dcp":
            dcp.load(dst, checkpoint_id=target)
            return dst
        if system == "safetensors":
            for k, v in load_file(target).items():
                dst[k].copy_(v)
            return dst
        if system == "torchsnapshot":
            tsd = TStateDict(**dst)
            TSnapshot(target).restore({"sd": tsd})
            return tsd
        ksd = KStateDict(**dst)
        if op == "load_no_checksum":
            KSnapshot(target).restore({"sd": ksd}, memory_budget_bytes=budget, verify_checksums=False)
        else:
            KSnapshot(target).restore({"sd": ksd}, memory_budget_bytes=budget)
        return ksd

    return load, ctx


def _same_storage(a: Any, b: Any) -> bool:
    return a is b or (hasattr(a, "data_ptr") and a.data_ptr() == b.data_ptr())


def run_op(spec: dict[str, Any]) -> dict[str, Any]:
    """Run one timed operation in this (fresh) process and return its record."""
    warnings.filterwarnings("ignore", message=".*torch.distributed is disabled.*")
    res: dict[str, Any] = {"system": spec["system"], "op": spec["op"], "ok": False}
    try:
        fn, ctx = _prepare_op(spec)
    except Exception as exc:
        return {**res, "error": f"setup: {type(exc).__name__}: {exc}", "traceback": traceback.format_exc()[-3000:]}
    is_read = spec["op"] != "save"
    gc.collect()
    res["cache"] = C.prepare_cache(spec["cold"]) if is_read else "n/a (write)"
    res["hiwater_reset"] = C.reset_peak_rss()
    baseline = C.current_rss_bytes()
    io0 = C.proc_io()
    t0 = time.perf_counter()
    try:
        out = fn()
    except TypeError as exc:
        if spec["op"] == "load_no_checksum" and "verify_checksums" in str(exc):
            return {**res, "na": True, "reason": f"TypeError: {exc}"}
        return {**res, "error": f"TypeError: {exc}", "traceback": traceback.format_exc()[-3000:]}
    except Exception as exc:
        return {**res, "error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()[-3000:]}
    elapsed = time.perf_counter() - t0
    peak, ru_maxrss = C.peak_rss_bytes()
    io1 = C.proc_io()
    res.update(
        ok=True,
        time_s=elapsed,
        baseline_rss_bytes=baseline,
        peak_rss_bytes=peak,
        ru_maxrss_bytes=ru_maxrss,
        peak_rss_over_baseline_bytes=peak - baseline,
        io_delta={k: io1[k] - io0.get(k, 0) for k in io1},
    )
    children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024
    if children:
        res["children_peak_rss_bytes"] = children
    if not is_read:
        res["dirty_after_bytes"] = C.dirty_bytes()
    if spec["verify"] and out is not None:
        problems = C.verify(out, ctx["specs"])
        res["verified"] = not problems
        if problems:
            res.update(ok=False, error="verification failed: " + "; ".join(problems))
    if "dst" in ctx and spec["system"] == "snapshotkit" and hasattr(out, "get"):
        dst = ctx["dst"]
        res["in_place"] = all(_same_storage(out.get(k), t) for k, t in dst.items())
    return res


def child_entry(spec_json: str, result_file: str) -> None:
    try:
        res = run_op(json.loads(spec_json))
    except BaseException as exc:
        res = {"ok": False, "error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()[-3000:]}
    Path(result_file).write_text(json.dumps(res))


# --------------------------------------------------------------------------- #
# Parent side: orchestration
# --------------------------------------------------------------------------- #
_IMPORTS = {
    "raw": ("torch", ()),
    "raw4": ("torch", ()),
    "torch": ("torch", ()),
    "dcp": ("torch.distributed.checkpoint", ("save", "load")),
    "safetensors": ("safetensors.torch", ("save_file", "load_file")),
    "torchsnapshot": ("torchsnapshot", ("Snapshot", "StateDict")),
    "snapshotkit": ("snapshotkit", ("Snapshot", "StateDict")),
}


def check_available(system: str) -> str | None:
    """None if the system's package imports and has the needed names, else the reason."""
    module, names = _IMPORTS[system]
    try:
        mod = importlib.import_module(module)
        missing = [n for n in names if not hasattr(mod, n)]
    except Exception as exc:
        return f"import {module} failed: {type(exc).__name__}: {exc}"
    return f"{module} lacks {', '.join(missing)}" if missing else None


# Pure-library imports shared by the forkserver children (none starts threads).
PRELOAD = ["numpy", "torch", "torch.distributed.checkpoint", "safetensors.torch", "torchsnapshot"]


def summarize(runs: list[dict[str, Any]], nbytes: int) -> dict[str, Any]:
    good = [r for r in runs if r.get("ok")]
    out: dict[str, Any] = {"runs": runs, "n_ok": len(good)}
    if any(r.get("na") for r in runs):
        out["na"] = next(r["reason"] for r in runs if r.get("na"))
    errors = [r["error"] for r in runs if r.get("error")]
    if errors:
        out["error"] = errors[0]
    if not good:
        return out
    med = C.median(r["time_s"] for r in good)
    rss = [r["peak_rss_over_baseline_bytes"] for r in good]
    out.update(
        times_s=[r["time_s"] for r in good],
        median_s=med,
        bytes=nbytes,
        bandwidth_bytes_per_s=C.ratio(nbytes, med),
        peak_rss_over_baseline_bytes=C.median(rss),
        peak_rss_over_baseline_bytes_max=max(rss),
        cache=sorted({r.get("cache", "?") for r in good}),
    )
    for key in ("rchar", "read_bytes", "wchar", "write_bytes"):
        out[f"median_{key}"] = C.median(r.get("io_delta", {}).get(key) for r in good)
    if good[0].get("bytes_on_disk") is not None:
        out["bytes_on_disk"] = good[0]["bytes_on_disk"]
    if any("in_place" in r for r in good):
        out["in_place"] = all(r.get("in_place", True) for r in good)
    return out


def compute_ratios(state: str, res: dict[str, Any], budget: int) -> dict[str, Any]:
    def get(system: str, op: str, key: str) -> Any:
        return res.get(system, {}).get(op, {}).get(key)

    def speedups(op: str) -> dict[str, float | None]:
        ours = get("snapshotkit", op, "median_s")
        return {s: C.ratio(get(s, op, "median_s"), ours) for s in COMPARED}

    def best_raw(op: str) -> Any:
        values = [v for v in (get("raw", op, "bandwidth_bytes_per_s"), get("raw4", op, "bandwidth_bytes_per_s")) if v]
        return max(values) if values else None

    r: dict[str, Any] = {
        # raw = the faster of one sequential stream and four parallel streams of the same bytes
        "snapshotkit_take_bw_over_raw_write_bw": C.ratio(
            get("snapshotkit", "save", "bandwidth_bytes_per_s"), best_raw("save")
        ),
        "snapshotkit_restore_bw_over_raw_read_bw": C.ratio(
            get("snapshotkit", "load", "bandwidth_bytes_per_s"), best_raw("load")
        ),
        "take_speedup_vs (their_time/ours)": speedups("save"),
        "restore_speedup_vs (their_time/ours)": speedups("load"),
        "restore_time_with_over_without_checksums": C.ratio(
            get("snapshotkit", "load", "median_s"), get("snapshotkit", "load_no_checksum", "median_s")
        ),
    }
    if get("snapshotkit", "load_no_checksum", "na"):
        r["restore_time_with_over_without_checksums"] = "n/a"
    if state == "large":
        r["read_object_rchar_over_tensor_bytes"] = C.ratio(
            get("snapshotkit", "read_object", "median_rchar"), C.PROBE_BYTES
        )
        r["read_object_storage_read_bytes_over_tensor_bytes"] = C.ratio(
            get("snapshotkit", "read_object", "median_read_bytes"), C.PROBE_BYTES
        )
    rss: dict[str, Any] = {"memory_budget_bytes": budget}
    for system, op, name in (
        ("snapshotkit", "save", "snapshotkit_take"),
        ("snapshotkit", "load", "snapshotkit_restore"),
        ("torch", "save", "torch_save"),
        ("torch", "load", "torch_load"),
        ("dcp", "save", "dcp_save"),
        ("dcp", "load", "dcp_load"),
    ):
        rss[name] = get(system, op, "peak_rss_over_baseline_bytes")
    rss["snapshotkit_take_over_budget"] = C.ratio(rss["snapshotkit_take"], budget)
    rss["snapshotkit_restore_over_budget"] = C.ratio(rss["snapshotkit_restore"], budget)
    r["peak_rss_over_baseline"] = rss
    return r


def _x(v: float | str | None) -> str:
    return "-" if v is None else (v if isinstance(v, str) else f"{v:.2f}x")


def render(report: dict[str, Any]) -> str:
    lines: list[str] = []
    m = report["machine"]
    lines.append(
        f"machine: {m.get('cpu_model')} | {m.get('logical_cpus')} cpus | RAM {C.fmt_bytes(m.get('ram_bytes'))}"
        f" | kernel {m.get('kernel')} | fs {m.get('scratch_fs', {}).get('type')}"
        f" | torch {m['versions'].get('torch')}"
    )
    budget = report["config"]["memory_budget_bytes"]
    for state, sres in report["results"].items():
        info = report["states"][state]
        lines.append("")
        lines.append(
            f"== {state}: {info['tensors']} tensors, {C.fmt_bytes(info['bytes'])}; "
            f"median of {report['config']['repeats']}; reads: {report['read_cache']} page cache =="
        )
        lines.append(f"{'system':<14}{'operation':<24}{'median s':>10}{'GiB/s':>9}{'peak RSS-base':>15}  notes")
        for system, ops in sres.items():
            if "skipped" in ops:
                lines.append(f"{system:<14}{'-':<24}{'':>10}{'':>9}{'':>15}  skipped: {ops['skipped'][:80]}")
                continue
            for op, s in ops.items():
                label = LABELS.get((system, op), op)
                nbytes = C.PROBE_BYTES if op == "read_object" else info["bytes"]
                bw = C.ratio(nbytes, s.get("median_s"))
                notes = []
                if s.get("na"):
                    notes.append("n/a: " + s["na"][:70])
                if s.get("error"):
                    notes.append("ERROR: " + s["error"][:90])
                if op == "read_object" and s.get("median_rchar") is not None:
                    notes.append(
                        f"rchar {C.fmt_bytes(s['median_rchar'])}, storage {C.fmt_bytes(s.get('median_read_bytes'))}"
                    )
                if s.get("in_place") is False:
                    notes.append("NOT in place")
                lines.append(
                    f"{system:<14}{label:<24}{C.fmt_num(s.get('median_s'), '.3f'):>10}"
                    f"{C.fmt_num(bw / C.GiB if bw else None, '.2f'):>9}"
                    f"{C.fmt_bytes(s.get('peak_rss_over_baseline_bytes')):>15}  {'; '.join(notes)}"
                )
        r = report["ratios"][state]
        lines.append(f"-- ratios ({state}) --")
        lines.append(f"snapshotkit take bw / best raw write bw: {_x(r['snapshotkit_take_bw_over_raw_write_bw'])}")
        lines.append(f"snapshotkit restore bw / best raw read bw: {_x(r['snapshotkit_restore_bw_over_raw_read_bw'])}")
        for kind in ("take", "restore"):
            sp = r[f"{kind}_speedup_vs (their_time/ours)"]
            lines.append(
                f"{kind} speedup (their time / ours):".ljust(41) + "  ".join(f"{k} {_x(v)}" for k, v in sp.items())
            )
        lines.append(f"restore time with / without checksums:  {_x(r['restore_time_with_over_without_checksums'])}")
        if "read_object_rchar_over_tensor_bytes" in r:
            lines.append(
                f"read_object rchar / tensor bytes:        {_x(r['read_object_rchar_over_tensor_bytes'])}"
                f"  (storage read_bytes: {_x(r['read_object_storage_read_bytes_over_tensor_bytes'])})"
            )
        p = r["peak_rss_over_baseline"]
        lines.append(
            f"peak RSS over baseline (budget {C.fmt_bytes(budget)}): snapshotkit take "
            f"{C.fmt_bytes(p['snapshotkit_take'])} ({_x(p['snapshotkit_take_over_budget'])} budget), restore "
            f"{C.fmt_bytes(p['snapshotkit_restore'])} ({_x(p['snapshotkit_restore_over_budget'])} budget); "
            f"torch.save {C.fmt_bytes(p['torch_save'])}, torch.load {C.fmt_bytes(p['torch_load'])}; "
            f"dcp.save {C.fmt_bytes(p['dcp_save'])}, dcp.load {C.fmt_bytes(p['dcp_load'])}"
        )
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--out", default="bench_local.json", help="JSON result file (default: %(default)s)")
    ap.add_argument("--dir", default=None, help="scratch directory (default: a new temp dir under /tmp)")
    ap.add_argument("--only", default=",".join(SYSTEMS), help="comma-separated subset of: " + ",".join(SYSTEMS))
    ap.add_argument("--states", default=",".join(STATES), help="comma-separated subset of: large,small")
    ap.add_argument("--repeats", type=int, default=3, help="repeats per operation; the median is reported")
    ap.add_argument("--large-bytes", type=C.parse_size, default=2 * C.GiB, help="large state total (default 2GiB)")
    ap.add_argument("--large-tensor-bytes", type=C.parse_size, default=64 * C.MiB, help="large tensor size (64MiB)")
    ap.add_argument("--small-count", type=int, default=20_000, help="number of small tensors (20000)")
    ap.add_argument("--small-bytes", type=C.parse_size, default=4 * C.KiB, help="bytes per small tensor (4KiB)")
    ap.add_argument("--memory-budget-bytes", type=C.parse_size, default=256 * C.MiB, help="snapshotkit budget")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--launcher",
        choices=("subprocess", "forkserver"),
        default="subprocess",
        help="how fresh per-operation processes are started (default: %(default)s)",
    )
    ap.add_argument("--no-drop-caches", action="store_true", help="do not drop the page cache before reads")
    ap.add_argument("--no-verify", action="store_true", help="skip bit-exact verification of restored data")
    ap.add_argument("--op-timeout", type=float, default=3600.0, help="seconds per operation before it is killed")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--result-file", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    for name, allowed in (("only", SYSTEMS), ("states", STATES)):
        chosen = [s.strip() for s in getattr(args, name).split(",") if s.strip()]
        bad = sorted(set(chosen) - set(allowed))
        if bad or not chosen:
            ap.error(f"--{name}: unknown or empty selection {bad}; choose from {','.join(allowed)}")
        setattr(args, name, [s for s in allowed if s in chosen])
    if args.repeats < 1:
        ap.error("--repeats must be >= 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.child is not None:
        child_entry(args.child, args.result_file)
        return 0
    cfg = {
        "large_bytes": args.large_bytes,
        "large_tensor_bytes": args.large_tensor_bytes,
        "small_count": args.small_count,
        "small_bytes": args.small_bytes,
        "seed": args.seed,
    }
    try:
        state_specs = {s: specs_for(s, cfg) for s in args.states}  # validates sizes early
    except ValueError as exc:
        print(f"bench_local.py: error: {exc}", file=sys.stderr)
        return 2
    if args.dir:
        Path(args.dir).mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix="snapshotkit-bench-", dir=args.dir or "/tmp"))
    cold = not args.no_drop_caches and os.access(C.DROP_CACHES, os.W_OK)
    available = {s: check_available(s) for s in args.only}
    launcher = C.Launcher(
        args.launcher, args.op_timeout, script=Path(__file__).resolve(), entry=child_entry, preload=PRELOAD
    )
    report: dict[str, Any] = {
        "benchmark": "bench_local",
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "config": {
            **cfg,
            "repeats": args.repeats,
            "memory_budget_bytes": args.memory_budget_bytes,
            "systems": args.only,
            "states": args.states,
            "launcher": args.launcher,
            "scratch_dir": str(scratch),
            "verify": not args.no_verify,
        },
        "machine": C.machine_facts(str(scratch)),
        "read_cache": "cold" if cold else "warm",
        "notes": {
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
        },
        "states": {s: {"tensors": len(sp), "bytes": C.state_bytes(sp)} for s, sp in state_specs.items()},
        "results": {},
        "ratios": {},
    }
    result_file = str(scratch / "op_result.json")
    try:
        for state, specs in state_specs.items():
            runs: dict[str, dict[str, list[dict[str, Any]]]] = {}
            for rep in range(args.repeats):
                for system in args.only:
                    if available[system]:
                        continue
                    workdir = scratch / f"{state}-{system}-{rep}"
                    workdir.mkdir()
                    saved = False
                    try:
                        for op in ops_for(system, state):
                            if op != "save" and not saved:
                                rec = {"ok": False, "error": "save failed in this repeat; not attempted"}
                            else:
                                spec = {
                                    "system": system,
                                    "op": op,
                                    "state": state,
                                    "cfg": cfg,
                                    "target": str(workdir / TARGET[system]),
                                    "cold": cold,
                                    "budget": args.memory_budget_bytes,
                                    "verify": not args.no_verify,
                                }
                                rec = launcher.run(spec, result_file)
                                if op == "save" and rec.get("ok"):
                                    saved = True
                                    rec["bytes_on_disk"] = C.tree_bytes(workdir / TARGET[system])
                            runs.setdefault(system, {}).setdefault(op, []).append(rec)
                            status = "n/a" if rec.get("na") else f"FAILED: {str(rec.get('error'))[:200]}"
                            if rec.get("ok"):
                                status = f"{rec['time_s']:.3f} s"
                            print(
                                f"[{state} {rep + 1}/{args.repeats}] {system} {LABELS[(system, op)]}: {status}",
                                file=sys.stderr,
                                flush=True,
                            )
                    finally:
                        shutil.rmtree(workdir, ignore_errors=True)
            nbytes = C.state_bytes(specs)
            sres: dict[str, Any] = {}
            for system in args.only:
                if available[system]:
                    sres[system] = {"skipped": available[system]}
                    continue
                sres[system] = {
                    op: summarize(rs, C.PROBE_BYTES if op == "read_object" else nbytes)
                    for op, rs in runs.get(system, {}).items()
                }
            report["results"][state] = sres
            report["ratios"][state] = compute_ratios(state, sres, args.memory_budget_bytes)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    report["finished"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2))
    print(render(report))
    print(f"\nJSON written to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
