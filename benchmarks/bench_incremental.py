"""Incremental snapshots (issue 16): a take against a base snapshot, against a full take of the same state.

A model of ``--model-bytes`` float32 tensors (16-64 MiB each, plus ``--small-count`` bias-like
tensors of ``--small-bytes``) in which ``--changing-fraction`` of the bytes change every step
(``add_``) and the rest stays frozen. Cases, each on local disk unless named otherwise:

* ``steps``: per step, a full take (no base) and an incremental take (base = the previous
  snapshot of the incremental chain), interleaved and alternating which goes first; bytes of the
  data objects written, wall time, and their ratios (targets: <= 12% of the bytes, <= 0.25x the time);
* ``all_changed``: every byte changes each step; a full take, an incremental take with nothing
  reusable, and -- as a measurement device only -- a full take with the xxh3 content hash replaced
  by a constant (``snapshotkit._take.reuse.content_hash`` monkeypatched in this process), rotated;
  the hash's share of a full take (target <= 5%), plus xxh3 and CRC-32C alone over the same bytes;
* ``restore``: restoring the last incremental snapshot against restoring the full snapshot of the
  same state, into pre-allocated tensors, cold (page cache dropped, when permitted) and warm,
  alternating (target: within 10%);
* ``s3``: the ``steps`` comparison through ``s3://`` on a loopback SeaweedFS behind a recording
  proxy (``--s3-model-bytes``): PUT requests and bytes uploaded of a full and an incremental take.

Method and results: docs/benchmarks.md ("Incremental snapshots").
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
import statistics
import sys
import time
import uuid
from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from _harness import cli
from _harness import measure as M
from _harness import report as R
from _harness import workloads as W

os.environ.setdefault("AWS_ACCESS_KEY_ID", "testing")
os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "testing")
os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")

CASES = ("steps", "all_changed", "restore", "s3")
BUCKET = "bench-incremental"
TARGETS = {"bytes_ratio": 0.12, "time_ratio": 0.25, "hash_overhead": 0.05, "restore_ratio": 1.10}


# ----------------------------------------------------------------------------- the model
def model_specs(
    model_bytes: int, tensor_bytes: int, fraction: float, small_count: int, small_bytes: int, seed: int = 0
) -> tuple[list[W.TensorSpec], set[str]]:
    """The model's tensors, and the names of those that change each step.

    The big tensors hold ``model_bytes`` minus the small ones: ``fraction`` of those bytes in
    changing tensors, the rest frozen, each group cut into tensors cycling through
    ``tensor_bytes``, its half and its quarter (the last shorter); the changing tensors are spread
    evenly through the state's order, so they share data objects with frozen ones. Of the small
    tensors, the same fraction (rounded up) changes.
    """
    small_total = small_count * small_bytes
    big_total = (model_bytes - small_total) // 4 * 4
    changing_total = round(big_total * fraction / 4) * 4
    sizes = (tensor_bytes, tensor_bytes // 2, tensor_bytes // 4)

    def cut(total: int) -> list[int]:
        out, i = [], 0
        while total > 0:
            n = min(max(4, sizes[i % 3] // 4 * 4), total)
            out.append(n)
            total -= n
            i += 1
        return out

    changing, frozen = cut(changing_total), cut(big_total - changing_total)
    # Spread: the k-th changing tensor goes at about k/len(changing) of the way through.
    order: list[tuple[int, bool]] = [(n, False) for n in frozen]
    for k, n in enumerate(changing):
        order.insert(round((k + 0.5) * len(order) / len(changing)), (n, True))
    specs: list[W.TensorSpec] = []
    moving: set[str] = set()
    for i, (n, changes) in enumerate(order):
        spec = W.TensorSpec(f"layer{i:03d}.weight", "float32", W._shape_for(n // 4), seed * 1000 + i + 1)
        specs.append(spec)
        if changes:
            moving.add(spec.name)
    small_changing = math.ceil(small_count * fraction)
    for j in range(small_count):
        spec = W.TensorSpec(f"bias{j:04d}", "float32", (small_bytes // 4,), seed * 1000 + 500 + j)
        specs.append(spec)
        if j < small_changing:
            moving.add(spec.name)
    return specs, moving


class Model:
    """The state (``{"model": StateDict}``) and how a step changes it."""

    def __init__(self, specs: list[W.TensorSpec], moving: set[str]) -> None:
        from snapshotkit import StateDict

        self.specs, self.moving = specs, moving
        self.tensors = W.materialize(specs)
        self.app_state = {"model": StateDict(**self.tensors)}
        self.nbytes = W.state_bytes(specs)
        self.moving_bytes = sum(s.nbytes for s in specs if s.name in moving)

    def step(self, *, everything: bool = False) -> None:
        for name, t in self.tensors.items():
            if everything or name in self.moving:
                t.add_(1.0)

    def destination(self) -> dict[str, Any]:
        from snapshotkit import StateDict

        return {"model": StateDict(**W.destination(self.specs))}

    def describe(self) -> R.Record:
        big = [s for s in self.specs if s.nbytes >= 1 * cli.MiB]
        return {
            "model_bytes": self.nbytes,
            "tensors": len(self.specs),
            "big_tensor_bytes": sorted({s.nbytes for s in big}, reverse=True),
            "changing_tensors": len(self.moving),
            "changing_bytes": self.moving_bytes,
            "changing_fraction": self.moving_bytes / self.nbytes,
        }


# ----------------------------------------------------------------------------- measuring
def data_bytes(path: Path) -> tuple[int, int]:
    """(bytes of the data objects, how many) in a local snapshot directory."""
    files = [p for p in (path / "data").rglob("*") if p.is_file()] if (path / "data").is_dir() else []
    return sum(p.stat().st_size for p in files), len(files)


def piece_stats(snapshot: Any) -> R.Record:
    """Pieces stored in the snapshot and pieces referenced from bases, counted and in bytes."""
    from snapshotkit._format.entries import pieces_of

    meta = snapshot.metadata
    stored = referenced = stored_bytes = referenced_bytes = 0
    for entry in meta.manifest.values():
        for piece in pieces_of(entry):
            if piece.base is None:
                stored, stored_bytes = stored + 1, stored_bytes + piece.nbytes
            else:
                referenced, referenced_bytes = referenced + 1, referenced_bytes + piece.nbytes
    return {
        "pieces_stored": stored,
        "pieces_referenced": referenced,
        "piece_bytes_stored": stored_bytes,
        "piece_bytes_referenced": referenced_bytes,
        "bases": dict(meta.bases),
    }


def timed_take(path: str, model: Model, base: str | None, options: R.Record | None = None) -> tuple[R.Record, Any]:
    """One take after :func:`_harness.measure.settle`: its wall and CPU seconds (all of this
    process's threads: the writer's checksum and hash threads included), and the snapshot."""
    from snapshotkit import Snapshot

    M.settle()
    with M.Measure() as m:
        snap = Snapshot.take(path, model.app_state, base=base, storage_options=options)
    return {"time_s": m.time_s, "cpu_s": m.cpu_s}, snap


def local_take(path: Path, model: Model, base: Path | None) -> R.Record:
    times, snap = timed_take(str(path), model, None if base is None else str(base))
    nbytes, objects = data_bytes(path)
    manifest = (path / ".snapshot_metadata").stat().st_size
    return {**times, "data_bytes": nbytes, "data_objects": objects, "manifest_bytes": manifest,
            **piece_stats(snap)}  # fmt: skip


@contextmanager
def constant_content_hash() -> Iterator[None]:
    """MEASUREMENT DEVICE, never for real snapshots: the content hash is a constant, so a take
    skips the xxh3 work and computes only the CRC-32C. Patched where
    :meth:`snapshotkit._take.reuse.Layout.finish` looks both functions up, in this process only
    (the synchronous take's writer runs it on this process's threads)."""
    import snapshotkit._take.reuse as reuse

    constant = "xxh3-128:" + "0" * 32
    real = reuse.content_hash, reuse.checksum_and_hash
    reuse.content_hash = lambda data: constant
    reuse.checksum_and_hash = lambda data: (reuse.crc32c(data), constant)
    try:
        yield
    finally:
        reuse.content_hash, reuse.checksum_and_hash = real


def rotations(names: Sequence[str], rep: int) -> list[str]:
    """``names`` rotated by ``rep``: over repeats, each variant runs in each position."""
    k = rep % len(names)
    return [*names[k:], *names[:k]]


def med(records: Sequence[R.Record], key: str) -> float:
    return float(statistics.median(r[key] for r in records))


def paired_ratio(num: Sequence[R.Record], den: Sequence[R.Record], key: str = "time_s") -> float:
    """Median over repeats of the per-repeat ratio (both measured back to back in one repeat)."""
    return float(statistics.median(a[key] / b[key] for a, b in zip(num, den, strict=True)))


# ----------------------------------------------------------------------------- cases
def steps_case(scratch: Path, model: Model, steps: int) -> tuple[R.Record, Path, Path]:
    """Full vs incremental takes over ``steps`` training steps; returns the last of each too."""
    chain, full_dir = scratch / "chain", scratch / "full"
    chain.mkdir()
    full_dir.mkdir()
    warm = local_take(chain / "step000", model, None)  # the chain's start (also warms the take path)
    R.progress(f"[steps] first full take {warm['time_s']:.3f} s, {R.fmt_bytes(warm['data_bytes'])}")
    prev, last_full = chain / "step000", None
    runs: dict[str, list[R.Record]] = {"full": [], "incremental": []}
    for step in range(1, steps + 1):
        model.step()
        for variant in rotations(("full", "incremental"), step):
            if variant == "full":
                target = full_dir / f"step{step:03d}"
                rec = local_take(target, model, None)
                if last_full is not None:
                    shutil.rmtree(last_full)
                last_full = target
            else:
                target = chain / f"step{step:03d}"
                rec = local_take(target, model, prev)
            runs[variant].append(rec)
            R.progress(f"[steps] step {step} {variant}: {rec['time_s']:.3f} s, {R.fmt_bytes(rec['data_bytes'])} "
                       f"in {rec['data_objects']} objects, {rec['pieces_referenced']} pieces referenced")  # fmt: skip
        prev = chain / f"step{step:03d}"
    full, inc = runs["full"], runs["incremental"]
    out = {
        "steps": steps,
        "first_take": warm,
        "runs": runs,
        "full": {k: med(full, k) for k in ("time_s", "cpu_s", "data_bytes", "data_objects", "manifest_bytes")},
        "incremental": {k: med(inc, k) for k in ("time_s", "cpu_s", "data_bytes", "data_objects", "manifest_bytes")},
        "bytes_ratio": paired_ratio(inc, full, "data_bytes"),
        "time_ratio": paired_ratio(inc, full),
        "cpu_ratio": paired_ratio(inc, full, "cpu_s"),
    }
    out["bytes_target_met"] = M.within(out["bytes_ratio"], TARGETS["bytes_ratio"])
    out["time_target_met"] = M.within(out["time_ratio"], TARGETS["time_ratio"])
    assert last_full is not None
    return out, prev, last_full


def all_changed_case(root: Path, model: Model, repeats: int) -> R.Record:
    """Every byte changes: full take, incremental take with nothing to reuse, full take without
    xxh3, in a new directory ``root`` (removed again)."""
    root.mkdir()
    prev = root / "base"
    local_take(prev, model, None)
    runs: dict[str, list[R.Record]] = {"full": [], "incremental": [], "full_no_hash": []}
    for rep in range(repeats):
        model.step(everything=True)
        made = []
        for variant in rotations(tuple(runs), rep):
            target = root / f"{variant}{rep:03d}"
            if variant == "full_no_hash":
                with constant_content_hash():
                    rec = local_take(target, model, None)
            else:
                rec = local_take(target, model, prev if variant == "incremental" else None)
            runs[variant].append(rec)
            made.append(target)
            R.progress(f"[all_changed {root.parent}] rep {rep} {variant}: {rec['time_s']:.3f} s, "
                       f"{R.fmt_bytes(rec['data_bytes'])}, {rec['pieces_referenced']} referenced")  # fmt: skip
        # The next repeat's base: this repeat's full take (never the constant-hash one).
        shutil.rmtree(prev)
        prev = root / f"full{rep:03d}"
        for target in made:
            if target != prev:
                shutil.rmtree(target)
    shutil.rmtree(root)
    full, inc, nohash = runs["full"], runs["incremental"], runs["full_no_hash"]
    out: R.Record = {
        "where": str(root.parent),
        "repeats": repeats,
        "runs": runs,
        "median_s": {k: med(v, "time_s") for k, v in runs.items()},
        "median_cpu_s": {k: med(v, "cpu_s") for k, v in runs.items()},
        "incremental_over_full": paired_ratio(inc, full),
        "full_over_no_hash": paired_ratio(full, nohash),
        "cpu_full_over_no_hash": paired_ratio(full, nohash, "cpu_s"),
        "incremental_bytes_over_full": paired_ratio(inc, full, "data_bytes"),
    }
    out["hash_overhead"] = out["full_over_no_hash"] - 1
    out["hash_target_met"] = M.within(out["hash_overhead"], TARGETS["hash_overhead"])
    return out


def hash_alone(model: Model, repeats: int = 3) -> R.Record:
    """xxh3-128 and CRC-32C over the model's bytes in 16 MiB pieces, on one thread."""
    from snapshotkit._format.checksum import content_hash, crc32c

    views = W.byte_views(model.tensors.values())
    pieces = [v[o : o + 16 * cli.MiB] for v in views for o in range(0, len(v), 16 * cli.MiB)]
    out: R.Record = {"bytes": sum(len(p) for p in pieces)}
    for name, fn in (("xxh3_128_s", content_hash), ("crc32c_s", crc32c)):
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            for p in pieces:
                fn(p)
            times.append(time.perf_counter() - t0)
        out[name] = statistics.median(times)
    return out


def restore_case(model: Model, incremental: Path, full: Path, repeats: int) -> R.Record:
    """Restore the incremental snapshot and the full one (same state) into pre-allocated tensors."""
    from snapshotkit import Snapshot

    dst = model.destination()
    problems = {}
    runs: dict[str, dict[str, list[float]]] = {"cold": {"full": [], "incremental": []},
                                               "warm": {"full": [], "incremental": []}}  # fmt: skip
    cache_state = "warm"
    for rep in range(repeats):
        for cache in ("cold", "warm"):
            for variant in rotations(("full", "incremental"), rep):
                path = incremental if variant == "incremental" else full
                for t in dst["model"].values():
                    t.zero_()
                got = M.prepare_cache(cache == "cold", sorted({full.parent, incremental.parent}))  # bases too
                if cache == "cold":
                    cache_state = got
                with M.Measure() as m:
                    Snapshot(str(path)).restore(dst)
                runs[cache][variant].append(m.time_s)
                if rep == 0:
                    problems[variant] = W.verify(dst["model"], model.specs, reference=model.tensors)
                R.progress(f"[restore] rep {rep} {cache} {variant}: {m.time_s:.3f} s")
    out: R.Record = {"repeats": repeats, "cold_is": cache_state, "runs": runs,
                     "verified": {k: not v for k, v in problems.items()}, "problems": problems}  # fmt: skip
    for cache, by in runs.items():
        ratios = [i / f for i, f in zip(by["incremental"], by["full"], strict=True)]
        out[cache] = {"full_s": statistics.median(by["full"]), "incremental_s": statistics.median(by["incremental"]),
                      "ratio": statistics.median(ratios)}  # fmt: skip
        out[cache]["target_met"] = M.within(out[cache]["ratio"], TARGETS["restore_ratio"])
    return out


# ----------------------------------------------------------------------------- s3
def _counting_proxy(upstream: str) -> Any:
    """A recording proxy that also notes the payload bytes of every PUT/POST."""
    from snapshotkit.testing import FaultInjectingProxy

    class ByteCountingProxy(FaultInjectingProxy):
        def __init__(self, upstream: str) -> None:
            super().__init__(upstream)
            self.uploads: list[tuple[str, str, int]] = []

        async def _handle(self, request: Any) -> Any:
            if request.method in ("PUT", "POST"):
                decoded = request.headers.get("x-amz-decoded-content-length")
                n = int(decoded) if decoded is not None else int(request.content_length or 0)
                with self._lock:
                    self.uploads.append((request.method, request.path_qs, n))
            return await super()._handle(request)

        def clear(self) -> None:
            super().clear()
            with self._lock:
                self.uploads.clear()

    return ByteCountingProxy(upstream)


def _s3_kind(method: str, path_qs: str) -> str:
    query = path_qs.partition("?")[2]
    if method == "PUT":
        return "UploadPart" if "partNumber=" in query else "PutObject"
    if method == "POST":
        return "CreateMultipartUpload" if "uploads" in query else "CompleteMultipartUpload/other POST"
    if method == "GET":
        return "ListObjects" if "list-type" in query or "prefix=" in query else "GetObject"
    return method


def s3_case(model: Model, steps: int) -> R.Record:
    try:
        import boto3
        import fsspec

        from snapshotkit.testing import SeaweedS3Server
    except ImportError as exc:
        return {"error": f"skipped: {exc}"}
    with SeaweedS3Server() as server, _counting_proxy(server.endpoint_url) as proxy:
        boto3.client("s3", endpoint_url=server.endpoint_url).create_bucket(Bucket=BUCKET)
        lister = fsspec.filesystem("s3", endpoint_url=server.endpoint_url, use_listings_cache=False,
                                   skip_instance_cache=True)  # fmt: skip
        options = {"endpoint_url": proxy.url}
        root = f"{BUCKET}/{uuid.uuid4().hex[:8]}"

        def take(name: str, base: str | None) -> R.Record:
            proxy.clear()
            times, snap = timed_take(f"s3://{root}/{name}", model, None if base is None else f"s3://{root}/{base}",
                                     options)  # fmt: skip
            seen, uploads = list(proxy.requests), list(proxy.uploads)
            kinds = Counter(_s3_kind(r.method, r.path) for r in seen)
            objects = lister.find(f"{root}/{name}", detail=True)
            data = {p: int(i["size"]) for p, i in objects.items() if "/data/" in p}
            return {
                **times,
                "requests": len(seen),
                "by_kind": dict(sorted(kinds.items())),
                "puts": sum(1 for r in seen if r.method == "PUT"),
                "uploaded_bytes": sum(n for _, _, n in uploads),
                "data_objects": len(data),
                "data_bytes": sum(data.values()),
                "non_2xx": sum(1 for r in seen if not r.outcome.startswith("forwarded 2")),
                **piece_stats(snap),
            }

        first = take("chain000", None)
        R.progress(f"[s3] first full take {first['time_s']:.3f} s, {first['puts']} PUTs")
        runs: dict[str, list[R.Record]] = {"full": [], "incremental": []}
        prev = "chain000"
        for step in range(1, steps + 1):
            model.step()
            for variant in rotations(("full", "incremental"), step):
                name = f"{'full' if variant == 'full' else 'chain'}{step:03d}"
                rec = take(name, prev if variant == "incremental" else None)
                runs[variant].append(rec)
                R.progress(f"[s3] step {step} {variant}: {rec['time_s']:.3f} s, {rec['puts']} PUTs, "
                           f"{R.fmt_bytes(rec['uploaded_bytes'])} uploaded {rec['by_kind']}")  # fmt: skip
            prev = f"chain{step:03d}"
    full, inc = runs["full"], runs["incremental"]
    keys = ("time_s", "requests", "puts", "uploaded_bytes", "data_bytes", "data_objects")
    return {
        "steps": steps,
        "model": model.describe(),
        "first_take": first,
        "runs": runs,
        "full": {k: med(full, k) for k in keys},
        "incremental": {k: med(inc, k) for k in keys},
        "puts_ratio": paired_ratio(inc, full, "puts"),
        "uploaded_ratio": paired_ratio(inc, full, "uploaded_bytes"),
        "time_ratio": paired_ratio(inc, full),
        "note": "times are through the recording proxy (one more hop, on the same 2 cores)",
    }


# ----------------------------------------------------------------------------- report
def render(result: R.Record) -> str:
    lines = [R.machine_line(result["machine"]), ""]
    m = result["model"]
    lines.append(f"model: {R.fmt_bytes(m['model_bytes'])} in {m['tensors']} float32 tensors; "
                 f"{m['changing_tensors']} change each step ({R.fmt_bytes(m['changing_bytes'])}, "
                 f"{m['changing_fraction'] * 100:.1f}% of the bytes)")  # fmt: skip
    if "steps" in result:
        r = result["steps"]
        f, i = r["full"], r["incremental"]
        lines += ["", f"local disk, {r['steps']} steps, medians (ratio = median of per-step incremental/full):"]
        lines += R.table("take<14|data written>14|objects>9|wall s>9|cpu s>9", [
            ("full", R.fmt_bytes(f["data_bytes"]), f"{f['data_objects']:.0f}", f"{f['time_s']:.3f}",
             f"{f['cpu_s']:.3f}"),
            ("incremental", R.fmt_bytes(i["data_bytes"]), f"{i['data_objects']:.0f}", f"{i['time_s']:.3f}",
             f"{i['cpu_s']:.3f}"),
            ("ratio", f"{r['bytes_ratio'] * 100:.1f}%", "", R.fmt_x(r["time_ratio"]), R.fmt_x(r["cpu_ratio"])),
        ])  # fmt: skip
        lines.append(f"targets: bytes <= 12%: {R.verdict(r['bytes_target_met'])}; "
                     f"time <= 0.25x: {R.verdict(r['time_target_met'])}")  # fmt: skip
    if "all_changed" in result:
        r = result["all_changed"]
        h = r["hash_alone"]
        for where, label in (("disk", "local disk"), ("shm", "tmpfs /dev/shm, no disk in the way")):
            c = r.get(where)
            if c is None:
                continue
            ms, cpu = c["median_s"], c["median_cpu_s"]
            lines += ["", f"every byte changes ({label}, {c['repeats']} repeats, rotated; ratios are medians "
                      "of per-repeat ratios):"]  # fmt: skip
            lines += R.table("take<34|wall s>8|cpu s>8|  ratio<0", [
                ("full", f"{ms['full']:.3f}", f"{cpu['full']:.3f}", ""),
                ("incremental (nothing reusable)", f"{ms['incremental']:.3f}", f"{cpu['incremental']:.3f}",
                 "  " + R.fmt_x(c["incremental_over_full"]) + " of full"),
                ("full, hash a constant (device)", f"{ms['full_no_hash']:.3f}", f"{cpu['full_no_hash']:.3f}",
                 f"  full: wall {R.fmt_pct(c['hash_overhead'])}, cpu {R.fmt_pct(c['cpu_full_over_no_hash'] - 1)}"),
            ])  # fmt: skip
            lines.append(f"target hashing <= 5% (wall): {R.verdict(c['hash_target_met'])}")
        lines.append(f"alone, one thread, {R.fmt_bytes(h['bytes'])} in 16 MiB pieces: "
                     f"xxh3-128 {h['xxh3_128_s']:.3f} s, crc32c {h['crc32c_s']:.3f} s")  # fmt: skip
    if "restore" in result:
        r = result["restore"]
        lines += ["", f"restore into pre-allocated tensors ({r['repeats']} repeats, alternating):"]
        rows = [(c, f"{r[c]['full_s']:.3f}", f"{r[c]['incremental_s']:.3f}", R.fmt_x(r[c]["ratio"]),
                 R.verdict(r[c]["target_met"])) for c in ("cold", "warm")]  # fmt: skip
        lines += R.table("cache<7|full s>9|incremental s>15|ratio>8|<= 1.10x>10", rows)
        lines.append(f"(cold = {r['cold_is']}; verified bit-exact: {r['verified']})")
    if "s3" in result:
        r = result["s3"]
        if "error" in r:
            lines += ["", f"s3: {r['error']}"]
        else:
            f, i = r["full"], r["incremental"]
            lines += ["", f"s3:// on loopback SeaweedFS, {R.fmt_bytes(r['model']['model_bytes'])} model, "
                      f"{r['steps']} steps, medians:"]  # fmt: skip
            lines += R.table("take<14|PUTs>7|requests>10|uploaded>13|time s>9", [
                ("full", f"{f['puts']:.0f}", f"{f['requests']:.0f}", R.fmt_bytes(f["uploaded_bytes"]),
                 f"{f['time_s']:.3f}"),
                ("incremental", f"{i['puts']:.0f}", f"{i['requests']:.0f}", R.fmt_bytes(i["uploaded_bytes"]),
                 f"{i['time_s']:.3f}"),
                ("ratio", R.fmt_x(r["puts_ratio"]), "", f"{r['uploaded_ratio'] * 100:.1f}%", R.fmt_x(r["time_ratio"])),
            ])  # fmt: skip
            lines.append(f"({r['note']})")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = cli.BenchParser(__doc__ or "")
    parser.add_out(stem="bench_incremental")
    parser.add_argument("--json", dest="out", default=argparse.SUPPRESS, help="same as --out")
    parser.add_subset("--cases", CASES)
    parser.add_argument("--model-bytes", type=cli.parse_size, default=cli.GiB, help="model size (1GiB)")
    parser.add_argument("--s3-model-bytes", type=cli.parse_size, default=256 * cli.MiB, help="s3 model (256MiB)")
    parser.add_argument("--tensor-bytes", type=cli.parse_size, default=64 * cli.MiB,
                        help="largest tensor; sizes cycle through it, /2, /4 (64MiB)")  # fmt: skip
    parser.add_argument("--changing-fraction", type=float, default=0.10, help="bytes changing per step (0.10)")
    parser.add_argument("--small-count", type=int, default=128, help="small (bias-like) tensors (128)")
    parser.add_argument("--small-bytes", type=cli.parse_size, default=4 * cli.KiB, help="each small tensor (4KiB)")
    parser.add_argument("--steps", type=int, default=5, help="steps (repeats) per case (5)")
    parser.add_argument("--hash-repeats", type=int, default=9, help="repeats of the all_changed case (9)")
    parser.add_argument("--no-shm", action="store_true", help="all_changed on local disk only, not also /dev/shm")
    parser.add_argument("--s3-steps", type=int, default=3, help="steps through s3 (3)")
    parser.add_argument("--dir", default=None, help="scratch directory (default: a new temp dir under /tmp)")
    parser.add_quick("tiny sizes (smoke test)", model_bytes=8 * cli.MiB, s3_model_bytes=4 * cli.MiB,
                     tensor_bytes=1 * cli.MiB, small_count=16, steps=2, s3_steps=1,
                     hash_repeats=2)  # fmt: skip
    args = parser.parse(argv)
    if not 0 < args.changing_fraction < 1 or min(args.steps, args.s3_steps, args.hash_repeats) < 1:
        parser.error("--changing-fraction must be in (0, 1); --steps, --s3-steps and --hash-repeats >= 1")

    def build(nbytes: int) -> Model:
        specs, moving = model_specs(nbytes, args.tensor_bytes, args.changing_fraction, args.small_count,
                                    args.small_bytes)  # fmt: skip
        return Model(specs, moving)

    with cli.scratch_dir(args.dir, "snapshotkit-incremental-") as scratch:
        config = {k: v for k, v in vars(args).items() if k != "out"}
        result = R.new_report("bench_incremental", scratch, config=config, targets=TARGETS)
        model = build(args.model_bytes)
        result["model"] = model.describe()
        last: tuple[Path, Path] | None = None
        if "steps" in args.cases or "restore" in args.cases:
            result["steps"], inc, full = steps_case(scratch, model, args.steps)
            last = (inc, full)
            if "steps" not in args.cases:
                del result["steps"]
        if "restore" in args.cases and last is not None:
            result["restore"] = restore_case(model, *last, repeats=args.steps)
        if last is not None:
            shutil.rmtree(scratch / "chain")
            shutil.rmtree(scratch / "full")
        if "all_changed" in args.cases:
            changed: R.Record = {"hash_alone": hash_alone(model)}
            changed["disk"] = all_changed_case(scratch / "all", model, args.hash_repeats)
            shm = Path("/dev/shm")
            if not args.no_shm and shm.is_dir() and shutil.disk_usage(shm).free > 4 * model.nbytes:
                with cli.scratch_dir(str(shm), "snapshotkit-incremental-") as in_memory:
                    changed["shm"] = all_changed_case(in_memory / "all", model, args.hash_repeats)
            result["all_changed"] = changed
        del model
        if "s3" in args.cases:
            result["s3"] = s3_case(build(args.s3_model_bytes), args.s3_steps)
    R.write_report(result, args.out, render(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
