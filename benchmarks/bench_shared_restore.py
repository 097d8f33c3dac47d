"""Replicated state read once on restore: sharing (one rank reads, broadcasts) vs every rank reading.

``--ranks`` (default 4) gloo ranks on this machine take one snapshot of a replicated state of
``--state-bytes`` (default 1 GiB: 16 float32 tensors) with ``replicated=["m/**"]``, then restore
it ``--reps`` times with sharing on and with the opt-out (``SNAPSHOTKIT_SHARE_REPLICATED_READS=0``,
today's behaviour), interleaved (the order alternates per repetition), on each store of
``--stores``: ``local`` (a directory; warm page cache) and ``s3`` (SeaweedFS ``weed mini`` on
loopback). Reported per mode: bytes read from storage summed over ranks (``restore_finished``
``nbytes``) as a ratio of the replicated state (target with sharing: <= 1.1x; today ~ranks x),
bytes received from other ranks, the restore time (slowest rank, median of the repetitions) and,
for ``s3``, the HTTP requests of one extra, untimed restore per mode through a counting proxy.
Every restore is checked bit for bit on one tensor per rank.

Usage::

    python benchmarks/bench_shared_restore.py --out benchmarks/results/bench_shared_restore-<date>.json
    python benchmarks/bench_shared_restore.py --ranks 2 --state-bytes 16MiB --reps 1 --out /tmp/s.json  # seconds
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # _harness, also when imported by a test

from _harness import Record, cli, launch
from _harness import measure as M
from _harness import report as R

PRELOAD = ["torch", "torch.distributed", "snapshotkit"]
RANKS_TIMEOUT_S = 1800.0
TENSORS = 16
BUCKET = "snapshotkit-bench-shared"
MODES = {"shared": "1", "every_rank": "0"}


def _state(state_bytes: int, *, fill: bool) -> Any:
    import torch

    from snapshotkit import StateDict

    numel = max(1, state_bytes // TENSORS // 4)
    if not fill:
        return StateDict(**{f"t{i}": torch.empty(numel) for i in range(TENSORS)})
    generator = torch.Generator().manual_seed(0)
    return StateDict(**{f"t{i}": torch.rand(numel, generator=generator) for i in range(TENSORS)})


def _rank_main(spec: Record) -> Record:
    import torch

    torch.set_num_threads(1)
    os.environ.update(spec["env"])
    with launch.process_group(spec):
        return _take(spec) if spec["part"] == "take" else _restore(spec)


def _take(spec: Record) -> Record:
    from snapshotkit import Snapshot

    state = _state(spec["state_bytes"], fill=True)
    Snapshot.take(spec["path"], {"m": state}, replicated=["m/**"], storage_options=spec["options"])
    return {}


def _restore(spec: Record) -> Record:
    import torch
    import torch.distributed as dist

    from snapshotkit import Snapshot, events

    state = _state(spec["state_bytes"], fill=False)
    seen: list[Any] = []
    unsubscribe = events.subscribe(seen.append)
    dist.barrier()
    with M.Measure() as took:
        Snapshot(spec["path"], storage_options=spec["options"]).restore(
            {"m": state}, memory_budget_bytes=spec["budget"]
        )
    unsubscribe()
    # One tensor per rank checked bit for bit (a different one on each rank).
    index = spec["rank"] % TENSORS
    expected = _state(spec["state_bytes"], fill=True)[f"t{index}"]
    if not torch.equal(state[f"t{index}"], expected):
        raise AssertionError(f"rank {spec['rank']}: t{index} differs after the restore")
    (finished,) = [e for e in seen if e.kind == "restore_finished"]
    return {"seconds": took.time_s, "read_bytes": finished.nbytes, "received_bytes": finished.received_bytes}


def _run(launcher: launch.Launcher, world: int, spec: Record) -> list[Record]:
    results = launcher.run_ranks(spec, world)
    failed = [r for r in results if r.get("ok") is False]
    if failed:
        raise RuntimeError(f"{spec['part']} on {world} ranks: {failed[0]['error']}\n{failed[0].get('traceback', '')}")
    return results


@contextlib.contextmanager
def _store(name: str, scratch: Path) -> Iterator[tuple[str, dict[str, Any], str]]:
    """(snapshot path, storage options, the server's endpoint or "") for one store."""
    if name == "local":
        yield str(scratch / f"snap-{uuid.uuid4().hex}"), {}, ""
        return
    import boto3

    from snapshotkit.testing import SeaweedS3Server

    with SeaweedS3Server() as server:
        boto3.client("s3", endpoint_url=server.endpoint_url).create_bucket(Bucket=BUCKET)
        yield f"s3://{BUCKET}/{uuid.uuid4().hex}", {"endpoint_url": server.endpoint_url}, server.endpoint_url


def _aws_env() -> dict[str, str]:
    from snapshotkit.testing import SeaweedS3Server

    return {
        "AWS_ACCESS_KEY_ID": SeaweedS3Server.access_key,
        "AWS_SECRET_ACCESS_KEY": SeaweedS3Server.secret_key,
        "AWS_DEFAULT_REGION": "us-east-1",
    }


def measure_store(args: argparse.Namespace, launcher: launch.Launcher, name: str, scratch: Path) -> Record:
    with _store(name, scratch) as (path, options, endpoint):
        env = _aws_env() if name == "s3" else {}
        base = {"path": path, "options": options, "state_bytes": args.state_bytes, "budget": args.budget}
        _run(launcher, args.ranks, {**base, "part": "take", "env": env})
        runs: dict[str, list[list[Record]]] = {mode: [] for mode in MODES}
        for rep in range(args.reps):
            order = list(MODES) if rep % 2 == 0 else list(reversed(MODES))
            for mode in order:
                mode_env = {**env, "SNAPSHOTKIT_SHARE_REPLICATED_READS": MODES[mode]}
                runs[mode].append(_run(launcher, args.ranks, {**base, "part": "restore", "env": mode_env}))
                R.progress(f"[{name}] rep {rep} {mode}: {max(r['seconds'] for r in runs[mode][-1]):.2f} s")
        out: Record = {"store": name, "state_bytes": TENSORS * (args.state_bytes // TENSORS // 4) * 4}
        for mode, reps in runs.items():
            seconds = [max(r["seconds"] for r in ranks) for ranks in reps]
            read = [sum(r["read_bytes"] for r in ranks) for ranks in reps]
            out[mode] = {
                "seconds": seconds,
                "median_seconds": statistics.median(seconds),
                "read_bytes": read[-1],
                "read_over_state": read[-1] / out["state_bytes"],
                "received_bytes": sum(r["received_bytes"] for r in reps[-1]),
                "per_rank_read_bytes": [r["read_bytes"] for r in reps[-1]],
            }
        out["shared_over_every_rank_seconds"] = out["shared"]["median_seconds"] / out["every_rank"]["median_seconds"]
        if endpoint:
            out["requests"] = _count_requests(args, launcher, base, env, endpoint)
        return out


def _count_requests(
    args: argparse.Namespace, launcher: launch.Launcher, base: Record, env: dict[str, str], endpoint: str
) -> Record:
    from snapshotkit.testing import FaultInjectingProxy

    counts: Record = {}
    with FaultInjectingProxy(endpoint) as proxy:
        for mode, flag in MODES.items():
            proxy.requests.clear()
            spec = {**base, "options": {"endpoint_url": proxy.url}, "part": "restore"}
            _run(launcher, args.ranks, {**spec, "env": {**env, "SNAPSHOTKIT_SHARE_REPLICATED_READS": flag}})
            seen = list(proxy.requests)
            counts[mode] = {"total": len(seen), "by_method": dict(sorted(Counter(r.method for r in seen).items()))}
    return counts


def render(report: Record) -> str:
    lines = [R.machine_line(report["machine"])]
    for row in report["stores"]:
        lines.append(
            f"{row['store']}: replicated state {R.fmt_bytes(row['state_bytes'])} restored by {report['args']['ranks']} "
            f"gloo ranks, budget {R.fmt_bytes(report['args']['budget'])}, {report['args']['reps']} reps interleaved"
        )
        for mode in MODES:
            m = row[mode]
            reqs = row.get("requests", {}).get(mode)
            counted = f", {reqs['total']} requests {reqs['by_method']}" if reqs else ""
            lines.append(
                f"  {mode:<10} read {R.fmt_bytes(m['read_bytes'])} ({m['read_over_state']:.3f}x the state), "
                f"received {R.fmt_bytes(m['received_bytes'])}, median {m['median_seconds']:.2f} s "
                f"(reps {', '.join(f'{s:.2f}' for s in m['seconds'])}){counted}"
            )
        met = row["shared"]["read_over_state"] <= 1.1
        lines.append(
            f"  shared/every_rank time {row['shared_over_every_rank_seconds']:.2f}x; "
            f"read <= 1.1x the state: {R.verdict(met)}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = cli.BenchParser(__doc__, full_doc=True)
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--state-bytes", type=cli.parse_size, default=cli.GiB)
    ap.add_argument("--budget", type=cli.parse_size, default=256 * cli.MiB)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--stores", default="local,s3")
    ap.add_argument("--scratch", default=None, help="directory for local snapshots (default: a temp dir)")
    ap.add_out(help="write the JSON report here")
    args = ap.parse(argv)
    os.environ.update(_aws_env())  # before the fork server starts: its children inherit it
    with cli.scratch_dir(args.scratch, "bench-shared-") as scratch:
        report = R.new_report("bench_shared_restore", scratch, args=vars(args))
        launcher = launch.Launcher("forkserver", RANKS_TIMEOUT_S, run=_rank_main, workdir=scratch, preload=PRELOAD)
        report["stores"] = []
        for name in args.stores.split(","):
            with M.Measure() as took:
                report["stores"].append(measure_store(args, launcher, name, scratch))
            R.progress(f"[{name}] done in {took.time_s:.1f} s")
    R.write_report(report, args.out, render(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
