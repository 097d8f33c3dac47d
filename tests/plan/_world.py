"""Simulated multi-rank takes for the planning tests: every rank's state described, without tensors.

Planning reads only sizes and kinds, so a :class:`~snapshotkit._plan.leaves.Payload` with no
tensor behind it is enough to run :func:`decide`, :func:`plan_rank` and the merge for any world
size in one process.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from typing import Any

from hypothesis import strategies as st

from snapshotkit._format.entries import DictEntry, PrimitiveEntry
from snapshotkit._format.serialization import RAW, TORCH_SAVE, dtype_from_name
from snapshotkit._format.sharded import Box
from snapshotkit._plan.decide import Decision, decide
from snapshotkit._plan.leaves import (
    Leaf,
    LocalState,
    ObjectLeaf,
    Payload,
    RankInfo,
    ShardBox,
    ShardedLeaf,
    TensorLeaf,
    rank_info,
)
from snapshotkit._plan.rank_plan import TakePlan, plan_rank

PATTERNS = ("model/*",)
TAKE_ID = "t0"


class StateBuilder:
    """One rank's :class:`LocalState`, leaf by leaf."""

    def __init__(self) -> None:
        self.leaves: dict[str, Leaf] = {}
        self.payloads: list[Payload] = []

    def tensor(
        self, path: str, shape: tuple[int, ...], dtype: str = "float32", *, serializer: str = RAW
    ) -> StateBuilder:
        itemsize = dtype_from_name(dtype).itemsize
        nbytes = math.prod(shape) * itemsize
        # a serialized tensor is a blob of torch.save bytes (never empty), like an object
        payload = Payload(nbytes, itemsize) if serializer == RAW else Payload.of_bytes(b"s" * (64 + nbytes))
        self.payloads.append(payload)
        self.leaves[path] = TensorLeaf(len(self.payloads) - 1, dtype, shape, serializer)
        return self

    def alias(self, path: str, of: str) -> StateBuilder:
        """A tensor tied to the one at ``of`` (same memory, so the same payload)."""
        target = self.leaves[of]
        assert isinstance(target, TensorLeaf)
        self.leaves[path] = dataclasses.replace(target, alias_of=of)
        return self

    def obj(self, path: str, nbytes: int) -> StateBuilder:
        self.payloads.append(Payload.of_bytes(b"x" * nbytes))
        self.leaves[path] = ObjectLeaf(len(self.payloads) - 1, "builtins.dict")
        return self

    def primitive(self, path: str, value: Any) -> StateBuilder:
        self.leaves[path] = PrimitiveEntry.of(value)
        return self

    def sharded(self, path: str, shape: tuple[int, ...], boxes: list[Box], dtype: str = "float32") -> StateBuilder:
        itemsize = dtype_from_name(dtype).itemsize
        local = []
        for box in boxes:
            self.payloads.append(Payload(math.prod(box.sizes) * itemsize, itemsize))
            local.append(ShardBox(box, len(self.payloads) - 1))
        self.leaves[path] = ShardedLeaf(dtype, shape, f"test layout of {path}", tuple(local))
        return self

    def build(self) -> LocalState:
        roots = sorted({path.split("/")[0] for path in self.leaves if "/" in path})  # one level of containers
        return LocalState({root: DictEntry(()) for root in roots}, dict(self.leaves), list(self.payloads))


@dataclasses.dataclass(frozen=True)
class World:
    """Every rank's state and what it tells the others, and the sizes the take uses."""

    states: tuple[LocalState, ...]
    chunk_bytes: int
    data_object_bytes: int

    @property
    def size(self) -> int:
        return len(self.states)

    def infos(self) -> list[RankInfo]:
        return [rank_info(state, "/ckpt", PATTERNS, f"id{rank}") for rank, state in enumerate(self.states)]

    def decide(self) -> Decision:
        return decide(self.infos(), chunk_bytes=self.chunk_bytes)

    def plans(self, decision: Decision) -> list[TakePlan]:
        return [
            plan_rank(
                state,
                decision,
                rank=rank,
                take_id=TAKE_ID,
                chunk_bytes=self.chunk_bytes,
                data_object_bytes=self.data_object_bytes,
            )
            for rank, state in enumerate(self.states)
        ]


DTYPES = ["float32", "float16", "int64", "uint8", "complex128"]


@st.composite
def worlds(draw: st.DrawFn, *, max_ranks: int = 4) -> World:
    """A take on 1..``max_ranks`` ranks: replicated tensors (one tied), a replicated object and
    primitive, a tensor that differs between ranks, rank-local tensors, and sharded tensors whose
    row blocks are held by one or several ranks each."""
    size = draw(st.integers(1, max_ranks))
    builders = [StateBuilder() for _ in range(size)]
    for index in range(draw(st.integers(0, 3))):
        shape = tuple(draw(st.lists(st.integers(0, 12), min_size=0, max_size=2)))
        dtype = draw(st.sampled_from(DTYPES))
        serializer = draw(st.sampled_from([RAW, RAW, TORCH_SAVE]))
        for builder in builders:
            builder.tensor(f"model/w{index}", shape, dtype, serializer=serializer)
    w0 = builders[0].leaves.get("model/w0")
    tieable = isinstance(w0, TensorLeaf) and w0.serializer == RAW and builders[0].payloads[w0.payload].nbytes
    if tieable and draw(st.booleans()):  # as a take finds tied weights: raw and not empty
        for builder in builders:
            builder.alias("model/tied", "model/w0")
    if draw(st.booleans()):
        nbytes = draw(st.integers(1, 80))
        for builder in builders:
            builder.obj("model/meta", nbytes)
    if draw(st.booleans()):
        for builder in builders:
            builder.primitive("model/step", 7)
    if draw(st.booleans()):
        for rank, builder in enumerate(builders):
            builder.tensor("model/diff", (rank + 1,))  # differs between ranks: stored per rank
    for rank, builder in enumerate(builders):
        for index in range(draw(st.integers(0, 3))):
            builder.tensor(f"optim/{rank}/{index}", (draw(st.integers(0, 30)),), draw(st.sampled_from(DTYPES)))
    for index in range(draw(st.integers(0, 2))):
        rows, cols = draw(st.integers(0, 12)), draw(st.integers(1, 4))
        cuts = sorted(draw(st.lists(st.integers(0, rows), max_size=3)))
        edges = [0, *cuts, rows]
        # an empty box sits at the end of dim 0, as torch places the empty shards of a DTensor
        boxes = list(
            dict.fromkeys(
                Box((low if high > low else rows, 0), (high - low, cols)) for low, high in itertools.pairwise(edges)
            )
        )
        # every box has a holder and every rank a box; some boxes are held by several ranks
        held: list[set[Box]] = [{boxes[rank % len(boxes)]} for rank in range(size)]
        for number, box in enumerate(boxes):
            held[number % size].add(box)
            for rank in draw(st.lists(st.integers(0, size - 1), max_size=2)):
                held[rank].add(box)
        dtype = draw(st.sampled_from(DTYPES))
        for rank, builder in enumerate(builders):
            mine = [box for box in boxes if box in held[rank]]  # in global order, as a DTensor lists them
            builder.sharded(f"dt/{index}", (rows, cols), mine, dtype)
    return World(
        tuple(builder.build() for builder in builders),
        chunk_bytes=draw(st.integers(1, 200)),
        data_object_bytes=draw(st.integers(1, 1000)),
    )
