"""Planning at scale, on paper: a take for 16,384 ranks x 1,000 entries and a 16,384 -> 8,192 reshard.

Issue 17 item 6. Nothing is written and no tensor is allocated: every rank's state is described
the way a take describes it (:class:`~snapshotkit._plan.leaves.RankInfo` for the exchange, a
size-only :class:`~snapshotkit._plan.leaves.LocalState` for the ranks whose plan is built), and
the pure planner runs on it in one process pinned to one core, with cyclic GC paused as in a take.

Each rank holds --entries entries, a mix of (default counts per rank):

* replicated (300): the same tensor on every rank (norms, biases, a few 64 MiB embeddings),
  offered with ``replicated=["model/*"]``; any rank may write their pieces;
* tensor-parallel (400): DTensors on a (ranks/8, 8) mesh, ``[Replicate(), Shard(0)]``: 8
  distinct 8 MiB boxes each, every box held by ranks/8 ranks (only those may write it);
* fully sharded (100): optimizer state sharded over the whole world (``Shard(0)``): one 1 MiB
  box per rank, which only that rank can write;
* rank-local (200): 1 MiB each (per-rank optimizer/RNG state), in ``total_bytes`` only.

Each rank's description is encoded as the first take's exchange sends it
(``snapshotkit/_take/exchange.py``: a fixed-size header, then each distinct part once; the
sharded tensors described by their mesh and placements, a ``Grid``), and ``decide`` runs on the
view a rank receives (``Gathered``).

Measured: ``decide`` over that view (time, peak RSS over the baseline with the inputs already in
memory), ``plan_rank`` for a sample of ranks, ``merge_results`` on rank 0 (every rank's result,
rank-local entries included), the bytes each rank writes (max / mean), and for a restore onto
--reshard-ranks ranks the read planning of sampled new ranks: for every sharded entry, the
stored shards and pieces overlapping each destination box, then the ranged reads
(``overlap`` / ``piece_boxes`` / ``plan_read_batches``, the steps the restore's placer takes).

``take.infos.all_gather_bytes_per_rank`` is every byte the rank receiving the most receives in
the first take's exchange (the headers of every rank plus each distinct part it does not hold),
computed by the exchange's own accounting from the encoded descriptions.

Method and results: docs/benchmarks.md ("Planning at scale").
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
import pickle
import random
import sys
import tracemalloc
from collections.abc import Callable, Iterable, Iterator
from typing import Any, TypeVar

import numpy as np
from _harness import Record, cli
from _harness import measure as M
from _harness import report as R

from snapshotkit._format.box_index import BoxIndex
from snapshotkit._format.entries import ShardedTensorEntry, TensorEntry
from snapshotkit._format.pieces import Piece
from snapshotkit._format.sharded import Box, overlap, piece_boxes
from snapshotkit._plan.decide import Decision, decide
from snapshotkit._plan.gathered import Gathered
from snapshotkit._plan.grid import REPLICATE, Grid
from snapshotkit._plan.layout import ALIGNMENT_BYTES
from snapshotkit._plan.leaves import (
    LeafSignature,
    LocalState,
    Payload,
    RankInfo,
    ShardBox,
    ShardedDescription,
    ShardedLeaf,
    TensorLeaf,
)
from snapshotkit._plan.merge import RankResult, merge_results
from snapshotkit._plan.rank_plan import TakePlan, plan_rank
from snapshotkit._plan.reads import RangeRequest, plan_read_batches
from snapshotkit._runtime.gc import gc_paused
from snapshotkit._take.exchange import Distinct, Encoded, header_bytes

T = TypeVar("T")
TP = 8  # tensor-parallel group size
CHECKSUM = "crc32c:00000000"
TAKE_ID = "bench"
LOCAL_BYTES = 1 << 20  # each rank-local entry
FSDP_ROWS = 256  # rows of float32 x 1024 in each rank's box of a fully sharded tensor: 1 MiB


@dataclasses.dataclass(frozen=True)
class World:
    """The simulated job: how many ranks and entries of each kind per rank."""

    ranks: int
    replicated: int
    tp: int
    fsdp: int
    local: int
    chunk_bytes: int
    data_object_bytes: int

    @property
    def entries(self) -> int:
        return self.replicated + self.tp + self.fsdp + self.local


def replicated_shape(i: int) -> tuple[int, ...]:
    """Mostly 8-64 KiB float32 vectors; every 50th a 64 MiB embedding (4 pieces of 16 MiB)."""
    return (4096, 4096) if i % 50 == 0 else ((i % 8 + 1) * 2048,)


def tp_shape() -> tuple[int, int]:
    return (1024 * TP, 4096)  # bfloat16: 64 MiB global, 8 MiB per box


def fsdp_shape(ranks: int) -> tuple[int, int]:
    return (FSDP_ROWS * ranks, 1024)  # float32


def tp_box(index: int) -> Box:
    rows = tp_shape()[0] // TP
    return Box((index * rows, 0), (rows, 4096))


def fsdp_box(rank: int, rows: int = FSDP_ROWS) -> Box:
    return Box((rank * rows, 0), (rows, 1024))


# ------------------------------------------------------------------ inputs
def build_infos(world: World) -> Iterator[RankInfo]:
    """Every rank's RankInfo, rank by rank: DTensors described by their grid (the same on every rank)."""
    signatures = {
        f"model/norm{i}.weight": LeafSignature("tensor", "float32", shape, "raw", math.prod(shape) * 4)
        for i in range(world.replicated)
        for shape in [replicated_shape(i)]
    }
    ranks = tuple(range(world.ranks))
    tp_grid = Grid((world.ranks // TP, TP), ranks, (REPLICATE, 0), tp_shape())
    fsdp_grid = Grid((world.ranks,), ranks, (0,), fsdp_shape(world.ranks))
    replicated_bytes = sum(s.nbytes for s in signatures.values())
    total_bytes = replicated_bytes + world.local * LOCAL_BYTES
    for _ in range(world.ranks):
        shards = {
            f"tp/layer{i}.weight": ShardedDescription("bfloat16", tp_shape(), (), tp_grid) for i in range(world.tp)
        }
        for i in range(world.fsdp):
            shards[f"optim/fsdp{i}.exp_avg"] = ShardedDescription("float32", fsdp_grid.shape, (), fsdp_grid)
        yield RankInfo("/ckpt", ("model/*",), dict(signatures), shards, total_bytes, TAKE_ID)


@dataclasses.dataclass(frozen=True)
class Received:
    """What the exchange delivers (the view every rank decides on) and what it cost."""

    gathered: Gathered
    max_received_bytes: int
    distinct_parts: int
    encoded_bytes: int  # one rank's two parts


def exchange_view(infos: Iterable[RankInfo]) -> Received:
    """Each rank encodes its description (header and parts, as ``exchange_descriptions`` does);
    the distinct parts are decoded once, as a receiving rank decodes them. Only the headers and
    the distinct parts are kept (every rank's would not fit this machine's memory)."""
    headers = []
    parts: dict[bytes, bytes] = {}  # digest -> the part
    encoded_bytes = 0
    for rank, info in enumerate(infos):
        encoded = Encoded.of(info)
        headers.append(encoded.header)
        parts.setdefault(encoded.header.replicated_digest, encoded.replicated)
        parts.setdefault(encoded.header.sharded_digest, encoded.sharded)
        if rank == 1:
            encoded_bytes = len(encoded.replicated) + len(encoded.sharded)
    replicated = Distinct.of_headers([h.replicated_digest for h in headers], [h.replicated_bytes for h in headers])
    sharded = Distinct.of_headers([h.sharded_digest for h in headers], [h.sharded_bytes for h in headers])
    ranks = len(headers)
    received = [
        header_bytes(ranks) + replicated.received_bytes(rank, ranks) + sharded.received_bytes(rank, ranks)
        for rank in (0, ranks - 1)  # the extremes: a rank that sources every part, one that sources none
    ]
    gathered = Gathered(
        np.asarray([h.total_bytes for h in headers], dtype=np.int64),
        tuple(pickle.loads(parts[headers[source].replicated_digest]) for source in replicated.sources),
        np.asarray(replicated.of, dtype=np.int64),
        tuple(pickle.loads(parts[headers[source].sharded_digest]) for source in sharded.sources),
        np.asarray(sharded.of, dtype=np.int64),
        np.arange(ranks, dtype=np.int64),
    )
    return Received(gathered, max(received), len(replicated.sources) + len(sharded.sources), encoded_bytes)


def local_state(world: World, rank: int) -> LocalState:
    """Rank ``rank``'s flattened state with size-only payloads (no tensors)."""
    leaves: dict[str, Any] = {}
    payloads: list[Payload] = []

    def payload(nbytes: int, itemsize: int) -> int:
        payloads.append(Payload(nbytes, itemsize))
        return len(payloads) - 1

    for i in range(world.replicated):
        shape = replicated_shape(i)
        leaves[f"model/norm{i}.weight"] = TensorLeaf(payload(math.prod(shape) * 4, 4), "float32", shape, "raw")
    box = tp_box(rank % TP)
    for i in range(world.tp):
        shard = ShardBox(box, payload(math.prod(box.sizes) * 2, 2))
        leaves[f"tp/layer{i}.weight"] = ShardedLeaf("bfloat16", tp_shape(), "tp", (shard,))
    box = fsdp_box(rank)
    for i in range(world.fsdp):
        shard = ShardBox(box, payload(math.prod(box.sizes) * 4, 4))
        leaves[f"optim/fsdp{i}.exp_avg"] = ShardedLeaf("float32", fsdp_shape(world.ranks), "fsdp", (shard,))
    for i in range(world.local):
        leaves[f"local/state{i}"] = TensorLeaf(payload(LOCAL_BYTES, 4), "float32", (LOCAL_BYTES // 4,), "raw")
    return LocalState({}, leaves, payloads)


# ---------------------------------------------------------------- measuring
def measured(op: Callable[[], T]) -> tuple[T, Record]:
    """``op()`` under GC paused, with wall / CPU seconds and peak RSS over the RSS just before."""
    with gc_paused(), M.Measure(rss=True) as m:
        value = op()
    peak = m._rss["peak_rss_over_baseline_bytes"]  # the harness keeps its RSS figures there
    return value, {"time_s": m.time_s, "cpu_s": m.cpu_s, "peak_rss_over_baseline_bytes": peak}


def traced_peak(op: Callable[[], object]) -> int:
    """Peak bytes Python allocated during ``op()`` (tracemalloc; a separate, slower run)."""
    with gc_paused():
        tracemalloc.start()
        try:
            op()
            return tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()


def rank_loads(gathered: Gathered, decision: Decision) -> list[int]:
    """Bytes each rank writes: its rank-local bytes plus the replicated/sharded pieces it owns."""
    loads = gathered.total_bytes.copy()
    for path in decision.replicated:
        for index, part in enumerate(gathered.replicated_parts):
            loads[gathered.replicated_of == index] -= part.candidates[path].nbytes
    for key, rank in decision.replicated_owner.items():
        loads[rank] += decision.replicated_spans[key].nbytes
    for sharded in decision.sharded_pieces.values():
        np.add.at(loads, sharded.owner, sharded.pieces.end - sharded.pieces.start)
    return [int(load) for load in loads]


def sample_ranks(ranks: int, count: int) -> list[int]:
    """Rank 0, the last rank and ``count - 2`` others drawn with a fixed seed."""
    others = random.Random(0).sample(range(1, ranks - 1), max(0, min(count - 2, ranks - 2)))
    return sorted({0, ranks - 1, *others})


def fake_written(plan: TakePlan) -> dict[Any, Piece]:
    return {
        slot: Piece(data_object.location, (slot.offset, slot.offset + slot.nbytes), CHECKSUM)
        for data_object in plan.data_objects
        for slot in data_object.slots
    }


def rank_result(world: World, plan: TakePlan, decision: Decision, rank: int) -> RankResult:
    """What rank ``rank`` would report after writing, built without its LocalState: its rank-local
    entries (one piece each) and a piece for every shared piece it owns. ``plan`` is rank 0's."""
    if rank == 0:
        from snapshotkit._plan.merge import finish_rank

        return finish_rank(plan, fake_written(plan))
    location = f"data/{rank}_00000_{TAKE_ID}"
    shape = (LOCAL_BYTES // 4,)
    entries = {
        f"{rank}/local/state{i}": TensorEntry(
            "float32", shape, "raw", (Piece(location, (i * LOCAL_BYTES, (i + 1) * LOCAL_BYTES), CHECKSUM),), False
        )
        for i in range(world.local)
    }
    # as finish_rank reports a rank other than 0 (add_shared_pieces adds its pieces, in the decision's order)
    return RankResult(entries, {}, pending=False, ordered=True, rank=rank)


def add_shared_pieces(results: list[RankResult], decision: Decision) -> None:
    for key, span, rank in decision.every_piece():
        shared = results[rank].shared
        assert isinstance(shared, dict)
        shared[key] = Piece(f"data/{rank}_00001_{TAKE_ID}", (0, span.nbytes), CHECKSUM)


# ----------------------------------------------------------------- parts
def part_take(world: World, samples: int, trace: bool) -> tuple[Record, Decision]:
    received, built = measured(lambda: exchange_view(build_infos(world)))
    gathered = received.gathered
    R.progress(f"[take] {world.ranks} descriptions built and encoded in {built['time_s']:.1f} s")
    decision, deciding = measured(lambda: decide(gathered, chunk_bytes=world.chunk_bytes))
    R.progress(f"[take] decide {deciding['cpu_s']:.2f} s cpu")
    if trace:
        deciding["traced_peak_bytes"] = traced_peak(lambda: decide(gathered, chunk_bytes=world.chunk_bytes))
    loads = rank_loads(gathered, decision)
    mean = sum(loads) / len(loads)
    plans: list[Record] = []
    for rank in sample_ranks(world.ranks, samples):
        local = local_state(world, rank)
        plan, planning = measured(
            functools.partial(
                plan_rank,
                local,
                decision,
                rank=rank,
                take_id=TAKE_ID,
                chunk_bytes=world.chunk_bytes,
                data_object_bytes=world.data_object_bytes,
            )
        )
        # the plan's bytes include the alignment padding between pieces
        padding_bound = ALIGNMENT_BYTES * sum(len(o.slots) for o in plan.data_objects)
        consistent = loads[rank] <= plan.nbytes <= loads[rank] + padding_bound
        plans.append(
            {
                "rank": rank,
                **planning,
                "plan_bytes": plan.nbytes,
                "load_bytes": loads[rank],
                "entries": len(plan.entries),
                "data_objects": len(plan.data_objects),
                "consistent": consistent,
            }
        )
    record: Record = {
        "infos": {
            **built,
            "pickled_rank_info_bytes": received.encoded_bytes,
            "header_bytes_per_rank": header_bytes(world.ranks),
            "distinct_parts": received.distinct_parts,
            "all_gather_bytes_per_rank": received.max_received_bytes,
        },
        "decide": {
            **deciding,
            "pieces": len(decision.replicated_owner) + sum(len(p.owner) for p in decision.sharded_pieces.values()),
            "sharded_tensors": len(decision.sharded_pieces),
            "distinct_boxes": sum(len(p.table) for p in decision.sharded_pieces.values()),
            "replicated": len(decision.replicated),
        },
        "plan_rank": plans,
        "balance": {
            "mean_bytes": mean,
            "max_bytes": max(loads),
            "min_bytes": min(loads),
            "max_over_mean": max(loads) / mean,
            "min_over_mean": min(loads) / mean,
        },
    }
    return record, decision


def part_merge(world: World, decision: Decision) -> tuple[Record, dict[str, Any]]:
    local = local_state(world, 0)
    plan = plan_rank(
        local,
        decision,
        rank=0,
        take_id=TAKE_ID,
        chunk_bytes=world.chunk_bytes,
        data_object_bytes=world.data_object_bytes,
    )
    results, built = measured(lambda: [rank_result(world, plan, decision, r) for r in range(world.ranks)])
    add_shared_pieces(results, decision)
    layouts = local.sharded_layouts()
    manifest, merging = measured(lambda: merge_results(results, decision, layouts))
    R.progress(f"[merge] {len(manifest)} entries in {merging['cpu_s']:.2f} s cpu")
    return {"results_built_s": built["time_s"], **merging, "manifest_entries": len(manifest)}, manifest


def plan_reads(
    manifest: dict[str, Any], targets: dict[str, list[Box]], itemsize: dict[str, int], *, indexed: bool = True
) -> list[Any]:
    """The ranged reads one new rank issues for its destination boxes, as the restore's placer
    finds them: every stored shard overlapping a box (through a ``BoxIndex`` of the entry's
    shards, or, with ``indexed=False``, checking every shard against every box as the placer did
    before the index), then every piece of it that does."""
    requests: list[RangeRequest] = []
    for path, boxes in targets.items():
        entry = manifest[f"0/{path}"]
        assert isinstance(entry, ShardedTensorEntry)
        if indexed:
            index = BoxIndex(entry.shards)
            shards = [entry.shards[i] for i in sorted({i for box in boxes for i in index.overlapping(box)})]
        else:
            shards = [s for s in entry.shards if any(overlap(Box(s.offsets, s.sizes), box) for box in boxes)]
        for shard in shards:
            shard_box = Box(shard.offsets, shard.sizes)
            sizes = [piece.nbytes for piece in shard.pieces]
            for piece, box in zip(shard.pieces, piece_boxes(shard_box, sizes, itemsize[path]), strict=True):
                if any(overlap(box, target) for target in boxes):
                    start, end = piece.byte_range
                    requests.append(RangeRequest(piece.location, start, end, len(requests)))
    return plan_read_batches(requests, max_batch_bytes=64 << 20)


def part_reshard(world: World, manifest: dict[str, Any], new_ranks: int, samples: int) -> Record:
    """Read planning for ranks of a ``new_ranks`` world: TP boxes on a (new_ranks/8, 8) mesh, the
    fully sharded state over ``new_ranks`` (each new box overlaps ranks/new_ranks stored boxes)."""
    rows = fsdp_shape(world.ranks)[0] // new_ranks
    per_rank: list[Record] = []
    for rank in sample_ranks(new_ranks, samples):
        targets = {f"tp/layer{i}.weight": [tp_box(rank % TP)] for i in range(world.tp)}
        targets.update({f"optim/fsdp{i}.exp_avg": [fsdp_box(rank, rows)] for i in range(world.fsdp)})
        itemsize = {p: 2 if p.startswith("tp/") else 4 for p in targets}
        scanned, scanning = measured(functools.partial(plan_reads, manifest, targets, itemsize, indexed=False))
        batches, timing = measured(functools.partial(plan_reads, manifest, targets, itemsize))
        assert batches == scanned, "the index found other shards than the scan"
        read = sum(b.nbytes for b in batches)
        needed = sum(math.prod(box.sizes) * itemsize[p] for p, boxes in targets.items() for box in boxes)
        per_rank.append(
            {
                "rank": rank,
                **timing,
                "scan_cpu_s": scanning["cpu_s"],
                "reads": len(batches),
                "read_bytes": read,
                "needed_bytes": needed,
            }
        )
    return {
        "new_ranks": new_ranks,
        "per_rank": per_rank,
        "max_time_s": max(r["time_s"] for r in per_rank),
        "total_time_s": sum(r["time_s"] for r in per_rank),
        "median_cpu_s": sorted(r["cpu_s"] for r in per_rank)[len(per_rank) // 2],
        "median_scan_cpu_s": sorted(r["scan_cpu_s"] for r in per_rank)[len(per_rank) // 2],
    }


# ----------------------------------------------------------------- report
def render(report: Record) -> str:
    take = report["take"]
    w = report["world"]
    d, b, i = take["decide"], take["balance"], take["infos"]
    lines = [
        R.machine_line(report["machine"], fs=False),
        f"world: {w['ranks']} ranks x {w['entries']} entries ({w['replicated']} replicated, {w['tp']} TP-sharded, "
        f"{w['fsdp']} fully sharded, {w['local']} rank-local), chunk {R.fmt_bytes(w['chunk_bytes'])}; one core",
        f"inputs: built and encoded in {i['time_s']:.1f} s, RSS +{R.fmt_bytes(i['peak_rss_over_baseline_bytes'])}; "
        f"one rank's description {R.fmt_bytes(i['pickled_rank_info_bytes'])}, {i['distinct_parts']} distinct parts; "
        f"the exchange: {R.fmt_bytes(i['header_bytes_per_rank'])} of headers, "
        f"{R.fmt_bytes(i['all_gather_bytes_per_rank'])} received in all by a rank (at most)",
        f"decide: {d['cpu_s']:.2f} s cpu ({d['time_s']:.2f} s wall), "
        f"peak RSS +{R.fmt_bytes(d['peak_rss_over_baseline_bytes'])}"
        + (f", tracemalloc peak {R.fmt_bytes(d['traced_peak_bytes'])}" if "traced_peak_bytes" in d else "")
        + f"; {d['pieces']} pieces, {d['distinct_boxes']} distinct boxes of {d['sharded_tensors']} sharded tensors, "
        f"{d['replicated']} replicated",
        f"balance: bytes per rank mean {R.fmt_bytes(b['mean_bytes'])}, max {R.fmt_bytes(b['max_bytes'])} "
        f"({b['max_over_mean']:.4f}x mean), min {R.fmt_bytes(b['min_bytes'])} ({b['min_over_mean']:.4f}x)",
        "",
        *R.table(
            "plan_rank rank>7|cpu s>9|RSS+>12|bytes>12|entries>9|objects>9|consistent>11",
            [
                (
                    p["rank"],
                    f"{p['cpu_s']:.3f}",
                    R.fmt_bytes(p["peak_rss_over_baseline_bytes"]),
                    R.fmt_bytes(p["plan_bytes"]),
                    p["entries"],
                    p["data_objects"],
                    p["consistent"],
                )
                for p in take["plan_rank"]
            ],
        ),
    ]
    if "merge" in report:
        m = report["merge"]
        lines += [
            "",
            f"merge_results on rank 0: {m['cpu_s']:.2f} s cpu, "
            f"peak RSS +{R.fmt_bytes(m['peak_rss_over_baseline_bytes'])}, {m['manifest_entries']} manifest entries",
        ]
    if "reshard" in report:
        r = report["reshard"]
        lines += [
            "",
            f"reshard {w['ranks']} -> {r['new_ranks']}: read planning per new rank (shards found through the "
            "BoxIndex; 'scan s': checking every shard, as before the index, same run)",
        ]
        lines += R.table(
            "rank>7|cpu s>9|scan s>9|reads>8|read>12|needed>12",
            [
                (
                    p["rank"],
                    f"{p['cpu_s']:.3f}",
                    f"{p['scan_cpu_s']:.3f}",
                    p["reads"],
                    R.fmt_bytes(p["read_bytes"]),
                    R.fmt_bytes(p["needed_bytes"]),
                )
                for p in r["per_rank"]
            ],
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = cli.BenchParser(__doc__)
    ap.add_argument("--ranks", type=int, default=16384)
    ap.add_argument("--replicated", type=int, default=300)
    ap.add_argument("--tp", type=int, default=400)
    ap.add_argument("--fsdp", type=int, default=100)
    ap.add_argument("--local", type=int, default=200)
    ap.add_argument("--reshard-ranks", type=int, default=8192)
    ap.add_argument("--samples", type=int, default=8, help="ranks whose plan (and new ranks whose reads) are timed")
    ap.add_argument("--chunk-bytes", type=cli.parse_size, default=16 * cli.MiB)
    ap.add_argument("--data-object-bytes", type=cli.parse_size, default=64 * cli.MiB)
    ap.add_argument(
        "--no-merge", action="store_true", help="skip merge_results and the reshard (it reads their manifest)"
    )
    ap.add_argument("--tracemalloc", action="store_true", help="also run decide under tracemalloc (slower)")
    ap.add_argument("--dir", default=None, help="unused (nothing is written); accepted for the smoke-test runner")
    ap.add_quick(
        "64 ranks x 100 entries",
        ranks=64,
        replicated=30,
        tp=40,
        fsdp=10,
        local=20,
        reshard_ranks=32,
        samples=3,
        tracemalloc=True,
    )
    ap.add_out(stem="bench_plan_scale")
    args = ap.parse(argv)
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})  # one core
    world = World(args.ranks, args.replicated, args.tp, args.fsdp, args.local, args.chunk_bytes, args.data_object_bytes)
    report = R.new_report(
        "bench_plan_scale",
        args.dir or "/tmp",
        args=vars(args),
        world={**dataclasses.asdict(world), "entries": world.entries},
    )
    report["take"], decision = part_take(world, args.samples, args.tracemalloc)
    if not args.no_merge:
        report["merge"], manifest = part_merge(world, decision)
        report["reshard"] = part_reshard(world, manifest, args.reshard_ranks, args.samples)
    report["activity"] = R.other_activity()
    R.write_report(report, args.out, render(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
