"""import_snapshot: throughput and peak memory of converting a checkpoint into a snapshot.

For each source format a checkpoint of --size bytes (float32 tensors of --tensor-bytes each) is
written in the scratch directory; then a fresh process imports it into a snapshot next to it,
and reports wall time, peak RSS (VmHWM: file pages the mapped tensors touched included) and the
peak of anonymous RSS (RssAnon, sampled every 10 ms: the memory an import really holds, since
mapped file pages can be dropped by the kernel). For reference, the same process then loads the
source whole into memory and times a plain Snapshot.take of it. Every imported tensor is
verified against the source.

Method and results: docs/benchmarks.md ("Import").
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import threading
import time
import warnings
from pathlib import Path
from typing import Any

import torch
from _harness import cli
from _harness import measure as M
from _harness import report as R

FORMATS = ("torch", "safetensors", "dcp", "torchsnapshot")


def make_state(size_bytes: int, tensor_bytes: int) -> dict[str, torch.Tensor]:
    count = max(1, size_bytes // tensor_bytes)
    numel = max(1, tensor_bytes // 4)
    generator = torch.Generator().manual_seed(0)
    return {f"layers.{i}.weight": torch.randn(numel, generator=generator) for i in range(count)}


def write_source(fmt: str, state: dict[str, torch.Tensor], where: Path) -> Path:
    """The checkpoint of ``state`` in ``fmt``, written below ``where`` by its own library."""
    if fmt == "torch":
        torch.save({"model": state}, where / "model.pt")
        return where / "model.pt"
    if fmt == "safetensors":
        from safetensors.torch import save_file

        save_file(state, str(where / "model.safetensors"))
        return where / "model.safetensors"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if fmt == "dcp":
            import torch.distributed.checkpoint as dcp

            dcp.save({"model": state}, checkpoint_id=str(where / "dcp"))
            return where / "dcp"
        import torchsnapshot

        torchsnapshot.Snapshot.take(str(where / "ts"), {"model": torchsnapshot.StateDict(**state)})
        return where / "ts"


class AnonPeak:
    """The peak of this process's anonymous RSS, sampled on a thread."""

    def __init__(self, interval_s: float = 0.01) -> None:
        self.peak_bytes = 0
        self._interval_s = interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _sample(self) -> None:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("RssAnon:"):
                    self.peak_bytes = max(self.peak_bytes, int(line.split()[1]) * 1024)

    def _run(self) -> None:
        while not self._stop.wait(self._interval_s):
            self._sample()

    def __enter__(self) -> AnonPeak:
        self._sample()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._sample()


def child(spec: dict[str, Any]) -> dict[str, Any]:
    """One import in this (fresh) process, then the reference take."""
    from snapshotkit import Snapshot, StateDict
    from snapshotkit.convert import import_snapshot

    M.prepare_cache(spec["cache"] == "cold")
    baseline_anon = AnonPeak()
    baseline_anon._sample()
    M.reset_peak_rss()
    rss_before = M.current_rss_bytes()
    with AnonPeak() as anon:
        started = time.perf_counter()
        report = import_snapshot(spec["src"], spec["dst"], source=spec["format"])
        import_s = time.perf_counter() - started
    peak_rss, _ = M.peak_rss_bytes()
    problems = verify(Snapshot(spec["dst"]), spec)
    record: dict[str, Any] = {
        "import_s": import_s,
        "snapshot_bytes": report.nbytes,
        "rss_before_bytes": rss_before,
        "peak_rss_bytes": peak_rss,
        "anon_before_bytes": baseline_anon.peak_bytes,
        "peak_anon_bytes": anon.peak_bytes,
        "problems": problems,
    }
    # Reference: the same state, already in memory, taken plainly.
    state = make_state(spec["size_bytes"], spec["tensor_bytes"])
    started = time.perf_counter()
    Snapshot.take(spec["dst"] + "-take", {"model": StateDict(state)})
    record["take_from_memory_s"] = time.perf_counter() - started
    return record


def verify(snapshot: Any, spec: dict[str, Any]) -> list[str]:
    expected = make_state(spec["size_bytes"], spec["tensor_bytes"])
    problems = []
    for name, tensor in expected.items():
        if not torch.equal(snapshot.read_object(f"model/{name}"), tensor):
            problems.append(f"model/{name} differs")
    return problems


def run_one(fmt: str, args: Any, scratch: Path) -> dict[str, Any]:
    where = scratch / fmt
    where.mkdir()
    src = write_source(fmt, make_state(args.size, args.tensor_bytes), where)
    source_bytes = sum(p.stat().st_size for p in ([src] if src.is_file() else src.rglob("*")) if p.is_file())
    spec = {
        "format": fmt,
        "src": str(src),
        "dst": str(where / "snapshot"),
        "size_bytes": args.size,
        "tensor_bytes": args.tensor_bytes,
        "cache": args.cache,
    }
    result_file = where / "result.json"
    cmd = [sys.executable, __file__, "--child", json.dumps(spec), "--result-file", str(result_file)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.op_timeout)
    if proc.returncode != 0:
        return {"error": (proc.stderr or proc.stdout)[-2000:]}
    record: dict[str, Any] = json.loads(result_file.read_text())
    record["source_bytes"] = source_bytes
    record["import_bytes_per_s"] = source_bytes / record["import_s"]
    return record


def render(result: dict[str, Any]) -> str:
    lines = [R.machine_line(result["machine"]), ""]
    config = result["config"]
    lines.append(
        f"import of a {R.fmt_bytes(config['size'])} checkpoint ({R.fmt_bytes(config['tensor_bytes'])} float32 "
        f"tensors), {config['cache']} page cache; a fresh process per import:"
    )
    rows: list[Any] = []
    for fmt, r in result["formats"].items():
        if "error" in r:
            rows.append(f"{fmt}: {r['error'].splitlines()[-1] if r['error'] else 'failed'}")
            continue
        rows.append(
            (
                fmt,
                R.fmt_bytes(r["source_bytes"]),
                f"{r['import_s']:.2f}",
                R.fmt_gib_s(r["import_bytes_per_s"]),
                R.fmt_bytes(r["peak_rss_bytes"]),
                R.fmt_bytes(r["peak_anon_bytes"] - r["anon_before_bytes"]),
                f"{r['take_from_memory_s']:.2f}",
                "ok" if not r["problems"] else f"{len(r['problems'])} differ",
            )
        )
    lines += R.table(
        "format<14|source>11|import s>10|GiB/s>8|peak RSS>12|anon peak - before>19|take from memory s>20|check>8",
        rows,
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = cli.BenchParser(__doc__ or "")
    parser.add_out(stem="bench_import")
    parser.add_subset("--formats", FORMATS)
    parser.add_argument("--size", type=cli.parse_size, default=cli.GiB, help="checkpoint size (1GiB)")
    parser.add_argument("--tensor-bytes", type=cli.parse_size, default=16 * cli.MiB, help="per tensor (16MiB)")
    parser.add_argument("--cache", choices=("warm", "cold"), default="warm", help="page cache before each import")
    parser.add_argument("--op-timeout", type=float, default=900.0, help="seconds per import before it is killed")
    parser.add_argument("--dir", default=None, help="scratch directory (default: a new temp dir under /tmp)")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--result-file", default=None, help=argparse.SUPPRESS)
    parser.add_quick("tiny sizes (smoke test)", size=256 * cli.KiB, tensor_bytes=32 * cli.KiB)
    args = parser.parse(argv)
    if args.child is not None:
        Path(args.result_file).write_text(json.dumps(child(json.loads(args.child))))
        return 0
    with cli.scratch_dir(args.dir, "snapshotkit-import-") as scratch:
        config = {k: v for k, v in vars(args).items() if k not in ("out", "child", "result_file")}
        result = R.new_report("bench_import", scratch, config=config, dists=("safetensors", "torchsnapshot"))
        result["formats"] = {}
        for fmt in args.formats:
            R.progress(f"importing {fmt} ...")
            result["formats"][fmt] = run_one(fmt, args, scratch)
            R.progress(f"  {result['formats'][fmt].get('import_s', 'failed')}")
        R.write_report(result, args.out, render(result))
    return 0 if all("error" not in r for r in result["formats"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
