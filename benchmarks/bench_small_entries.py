"""Many small entries: restore of N float32 tensors of a few KiB against a raw read of the same bytes.

One StateDict of --count tensors of --tensor-bytes is taken once with snapshotkit, saved once
with ``torch.save`` and once with safetensors. Then, each in a fresh process (imports excluded
from the time, manifest decoding included), with a warm page cache and -- when this user may
drop it -- a cold one:

* ``raw``: plain Python reads of the snapshot's data objects into one pre-allocated buffer;
* ``restore``: ``Snapshot(path).restore()`` in place into pre-allocated tensors (checksums on);
* ``safetensors``: ``safetensors.torch.load_file`` + ``copy_`` into the same destinations;
* ``read_object``: ``Snapshot(path).read_object()`` of one entry (manifest read and decode included);
* ``safetensors_one``: ``safetensors.safe_open`` + ``get_tensor`` of that same one tensor;
* ``take`` and ``torch.save`` (+ fsync) of the same state;
* ``take_again``: a second take of the same state in the same process, after one untimed take
  (a repeated take: the plan of the first is reused where the checkout has a plan cache).

Every operation also records the CPU time of the process and of the calling thread, and the
cyclic garbage collections (full ones apart) that ran while it was timed (CPU time is steadier
than wall time on a shared machine).

``--compare-with DIR`` runs every operation a second time with another snapshotkit checkout on
``PYTHONPATH`` (say, ``main`` before a change), interleaved, so before/after come from one run;
``--compare-with NAME=DIR`` names it, and the option may be repeated; each repetition starts
with the next checkout in turn, and a child that imported another checkout's snapshotkit stops
the run. ``--ops`` runs a subset.
Restored values are checked bit for bit. Method and results: docs/benchmarks.md
("Many small entries").

Usage::

    python benchmarks/bench_small_entries.py --out small.json
    python benchmarks/bench_small_entries.py --compare-with /work/main --repeats 5 --out small.json
    python benchmarks/bench_small_entries.py --compare-with before=/src/old --compare-with main=/work/main \
        --ops take,take_again,torch_save --repeats 15 --out takes.json
"""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # _harness, also when imported by a test

from _harness import cli
from _harness import measure as M
from _harness import report as R

OPS = ("raw", "restore", "safetensors", "read_object", "safetensors_one", "take", "take_again", "torch_save")
TAKES = ("take", "take_again")
READS = ("raw", "restore", "safetensors", "read_object", "safetensors_one")


def make_state(count: int, tensor_bytes: int) -> dict[str, Any]:
    import torch

    generator = torch.Generator().manual_seed(0)
    return {f"p{i:06d}": torch.rand(max(1, tensor_bytes // 4), generator=generator) for i in range(count)}


def empty_like(state: dict[str, Any]) -> dict[str, Any]:
    import torch

    return {k: torch.empty_like(v) for k, v in state.items()}


def data_files(snapshot_dir: Path) -> list[Path]:
    return sorted(p for p in (snapshot_dir / "data").rglob("*") if p.is_file())


def child(op: str, work: Path, count: int, tensor_bytes: int, snapshot: str = "snap") -> dict[str, Any]:
    """One operation in this (fresh) process; the seconds it took, imports excluded. ``snapshot``
    names the snapshot (under ``work``) that this checkout took, in the format version it writes."""
    import safetensors
    import safetensors.torch
    import torch

    import snapshotkit

    snap, st_file = work / snapshot, work / "state.safetensors"
    if op == "take_snapshot":  # (setup) this checkout's own snapshot of the state
        snapshotkit.Snapshot.take(str(snap), {"m": snapshotkit.StateDict(make_state(count, tensor_bytes))})
        return {"ok": True, "snapshotkit_dir": str(Path(snapshotkit.__file__).resolve().parent)}
    verify: dict[str, Any] | None = None
    collections: list[int] = []

    def count_collections(phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            collections.append(info["generation"])

    if op in (*TAKES, "torch_save"):
        state = make_state(count, tensor_bytes)
        target = work / f"{op}-out"
        if op == "take_again":
            snapshotkit.Snapshot.take(str(work / "take_again-first-out"), {"m": snapshotkit.StateDict(state)})
        gc.callbacks.append(count_collections)
        cpu, main_cpu = time.process_time(), time.thread_time()
        started = time.perf_counter()
        if op in TAKES:
            snapshotkit.Snapshot.take(str(target), {"m": snapshotkit.StateDict(state)})
        else:
            with open(target, "wb") as f:
                torch.save(state, f)
                f.flush()
                os.fsync(f.fileno())
        seconds = time.perf_counter() - started
        cpu, main_cpu = time.process_time() - cpu, time.thread_time() - main_cpu
        gc.callbacks.remove(count_collections)
    elif op == "raw":
        files = data_files(snap)
        buffer = bytearray(sum(p.stat().st_size for p in files))
        view, offset = memoryview(buffer), 0
        gc.callbacks.append(count_collections)
        cpu, main_cpu = time.process_time(), time.thread_time()
        started = time.perf_counter()
        for path in files:
            with open(path, "rb", buffering=0) as f:
                while (n := f.readinto(view[offset:])) > 0:
                    offset += n
        seconds = time.perf_counter() - started
        cpu, main_cpu = time.process_time() - cpu, time.thread_time() - main_cpu
        gc.callbacks.remove(count_collections)
    elif op == "read_object":
        gc.callbacks.append(count_collections)
        cpu, main_cpu = time.process_time(), time.thread_time()
        started = time.perf_counter()
        value = snapshotkit.Snapshot(str(snap)).read_object(f"m/p{count // 2:06d}")
        seconds = time.perf_counter() - started
        cpu, main_cpu = time.process_time() - cpu, time.thread_time() - main_cpu
        gc.callbacks.remove(count_collections)
        verify = {f"p{count // 2:06d}": value}
    elif op == "safetensors_one":
        gc.callbacks.append(count_collections)
        cpu, main_cpu = time.process_time(), time.thread_time()
        started = time.perf_counter()
        with safetensors.safe_open(str(st_file), framework="pt") as f:
            value = f.get_tensor(f"p{count // 2:06d}")
        seconds = time.perf_counter() - started
        cpu, main_cpu = time.process_time() - cpu, time.thread_time() - main_cpu
        gc.callbacks.remove(count_collections)
        verify = {f"p{count // 2:06d}": value}
    else:
        destinations = empty_like(make_state(count, tensor_bytes))
        gc.callbacks.append(count_collections)
        cpu, main_cpu = time.process_time(), time.thread_time()
        started = time.perf_counter()
        if op == "restore":
            snapshotkit.Snapshot(str(snap)).restore({"m": snapshotkit.StateDict(destinations)})
        else:
            for key, value in safetensors.torch.load_file(str(st_file)).items():
                destinations[key].copy_(value)
        seconds = time.perf_counter() - started
        cpu, main_cpu = time.process_time() - cpu, time.thread_time() - main_cpu
        gc.callbacks.remove(count_collections)
        verify = destinations
    extra = {
        "cpu_s": cpu,
        "main_thread_cpu_s": main_cpu,
        "gc_collections": len(collections),
        "gc_full_collections": collections.count(2),
    }
    ok = True
    if verify is not None:
        expected = make_state(count, tensor_bytes)
        ok = all(torch.equal(expected[k], v) for k, v in verify.items())
    return {"time_s": seconds, "ok": ok, "snapshotkit_dir": str(Path(snapshotkit.__file__).resolve().parent), **extra}


def run_child(args: Any, op: str, work: Path, pythonpath: str, cold: bool, snapshot: str = "snap") -> dict[str, Any]:
    inputs = [work / "state.safetensors"] if op.startswith("safetensors") else [work / snapshot]
    cache = M.prepare_cache(cold, inputs) if op in READS else "n/a"
    env = {k: v for k, v in os.environ.items() if not k.startswith("SNAPSHOTKIT_")}
    env["PYTHONPATH"] = pythonpath
    cmd = [sys.executable, __file__, "--child", op, "--dir", str(work), "--snapshot", snapshot]
    cmd += ["--count", str(args.count), "--tensor-bytes", str(args.tensor_bytes)]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=args.op_timeout)
    if proc.returncode != 0:
        return {"ok": False, "error": proc.stderr[-2000:], "cache": cache}
    record: dict[str, Any] = {**json.loads(proc.stdout.strip().splitlines()[-1]), "cache": cache}
    measured = Path(record.pop("snapshotkit_dir"))
    if measured.parent != Path(pythonpath).resolve():  # a comparison of one code with itself
        raise SystemExit(f"the child imported snapshotkit from {measured}, not from the checkout {pythonpath}")
    return record


def parse_args(argv: list[str] | None = None) -> Any:
    ap = cli.BenchParser(__doc__)
    ap.add_out(default="bench_small_entries.json")
    ap.add_argument("--dir", default=None, help="scratch directory (default: a new temp dir under /tmp)")
    ap.add_argument("--count", type=int, default=20_000, help="number of tensors (20000)")
    ap.add_argument("--tensor-bytes", type=cli.parse_size, default=4 * cli.KiB, help="bytes per tensor (4KiB)")
    ap.add_argument("--repeats", type=int, default=3, help="repeats per operation; the median is reported")
    ap.add_argument(
        "--compare-with",
        action="append",
        default=[],
        help="another snapshotkit checkout to time alongside, DIR or NAME=DIR (repeatable)",
    )
    ap.add_argument("--ops", default=",".join(OPS), help=f"operations to run (default: {','.join(OPS)})")
    ap.add_argument("--op-timeout", type=float, default=600.0, help="seconds per operation")
    ap.add_argument("--child", default=None, help="(internal) run one operation and print its JSON")
    ap.add_argument("--snapshot", default="snap", help="(internal) the snapshot the child reads, under --dir")
    ap.add_quick("tiny sizes for the smoke test", count=200, tensor_bytes=1024, repeats=1)
    return ap.parse(argv)


def _commit(checkout: str) -> str | None:
    """The commit checked out at ``checkout`` (None if it is not a git work tree)."""
    proc = subprocess.run(["git", "-C", checkout, "rev-parse", "HEAD"], capture_output=True, text=True)
    return proc.stdout.strip() or None


def prepare(work: Path, count: int, tensor_bytes: int) -> None:
    import safetensors.torch
    import torch

    import snapshotkit

    state = make_state(count, tensor_bytes)
    snapshotkit.Snapshot.take(str(work / "snap"), {"m": snapshotkit.StateDict(state)})
    safetensors.torch.save_file(state, str(work / "state.safetensors"))
    torch.save(state, str(work / "state.pt"))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.child:
        print(json.dumps(child(args.child, Path(args.dir), args.count, args.tensor_bytes, args.snapshot)))
        return 0
    here = str(Path(__file__).resolve().parents[1])
    checkouts = {"this": here}
    for number, spec in enumerate(args.compare_with):
        name, equals, where = spec.rpartition("=")
        name = name if equals else "compare" if number == 0 else f"compare{number + 1}"
        checkouts[name] = str(Path(where).resolve())
    ops = [op for op in args.ops.split(",") if op]
    unknown = sorted(set(ops) - set(OPS))
    if unknown:
        raise SystemExit(f"--ops: unknown operation(s) {unknown}; choose from {', '.join(OPS)}")
    caches = ["warm"] + (["cold"] if M.can_drop_caches() else [])
    with cli.scratch_dir(args.dir, "snapshotkit-small-") as scratch:
        prepare(scratch, args.count, args.tensor_bytes)
        # every other checkout reads a snapshot it took itself (an older one may not read this format)
        snapshots = {name: "snap" if name == "this" else f"snap-{name}" for name in checkouts}
        for name, pythonpath in checkouts.items():
            if name != "this":
                record = run_child(args, "take_snapshot", scratch, pythonpath, False, snapshots[name])
                if not record.get("ok"):
                    raise SystemExit(f"{name}: taking its snapshot failed: {record.get('error')}")
        runs: dict[str, dict[str, list[dict[str, Any]]]] = {}
        for rep in range(args.repeats):
            for cache in caches:
                for op in ops:
                    if cache == "cold" and op not in READS:
                        continue
                    order = list(checkouts.items())
                    order = order[rep % len(order) :] + order[: rep % len(order)]  # no checkout always first
                    for name, pythonpath in order:
                        rec = run_child(args, op, scratch, pythonpath, cache == "cold", snapshots[name])
                        runs.setdefault(f"{name} {op} {cache}", {}).setdefault("runs", []).append(rec)
                        R.progress(f"[{rep + 1}/{args.repeats}] {name} {op} ({rec['cache']}): {R.status(rec)}")
                        for path in scratch.glob("*-out"):
                            subprocess.run(["rm", "-rf", str(path)], check=True)
        results = {}
        for key, value in runs.items():
            good = [r for r in value["runs"] if r.get("ok")]
            results[key] = {
                "median_s": M.median(r["time_s"] for r in good),
                "ok": len(good) == len(value["runs"]),
                "caches": sorted({r["cache"] for r in value["runs"]}),
                "times_s": [r["time_s"] for r in good],
                "runs": value["runs"],
            }
            if good and "cpu_s" in good[0]:
                results[key].update(
                    median_cpu_s=M.median(r["cpu_s"] for r in good),
                    median_main_thread_cpu_s=M.median(r["main_thread_cpu_s"] for r in good),
                    full_gc_runs=sum(1 for r in good if r["gc_full_collections"]),
                )
        ratios: dict[str, Any] = {}
        for name in checkouts:
            for cache in caches:

                def s(op: str, name: str = name, cache: str = cache) -> float | None:
                    rec = results.get(f"{name} {op} {'warm' if op in (*TAKES, 'torch_save') else cache}", {})
                    value: float | None = rec.get("median_s")
                    return value

                ratios[f"{name} {cache}"] = {
                    "restore_vs_raw_read": M.ratio(s("raw"), s("restore")),
                    "restore_speedup_over_safetensors": M.ratio(s("safetensors"), s("restore")),
                    "take_speedup_over_torch_save": M.ratio(s("torch_save"), s("take")),
                    "take_again_speedup_over_torch_save": M.ratio(s("torch_save"), s("take_again")),
                    "read_object_s": s("read_object"),
                    "read_object_speedup_over_safetensors_one": M.ratio(s("safetensors_one"), s("read_object")),
                }
        config = {**vars(args), "checkouts": checkouts, "commits": {n: _commit(p) for n, p in checkouts.items()}}
        config["manifest_bytes"] = {
            n: (scratch / snapshots[n] / ".snapshot_metadata").stat().st_size for n in checkouts
        }
        config["format_version"] = {
            n: json.loads((scratch / snapshots[n] / ".snapshot_metadata").read_bytes())["format_version"]
            for n in checkouts
        }
        report = R.new_report("bench_small_entries", scratch, config=config)
        report.update(results=results, ratios=ratios)
    Path(args.out).write_text(json.dumps(report, indent=2, sort_keys=True))
    for key, value in sorted(results.items()):
        print(f"{key:40s} {R.fmt_num(value['median_s'])} s{'' if value['ok'] else '  (FAILED runs)'}")
    for key, value in ratios.items():
        print(key, {k: (round(v, 3) if isinstance(v, float) else v) for k, v in value.items()})
    return 0 if all(v["ok"] for v in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
