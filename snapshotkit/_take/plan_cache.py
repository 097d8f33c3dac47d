"""The last plan of each process group, reused by the next take of the same structure.

A training job takes snapshots of one structure again and again. Planning a take from scratch
exchanges every rank's description (an all-gather of O(entries) bytes per rank), decides who
writes what and lays out every piece; a take whose structure did not change since the last take
on its process group skips all of it. What each take still does itself: describe the state (the
payloads are the caller's current tensors), and :func:`~snapshotkit._plan.rank_plan.finish_plan`
(primitive values, serialized bytes, the take's data object names).

IMPORTANT: never a stale plan. A plan is reused only if *every* rank finds, in one all-reduce of
five int64 (:func:`agree`):

* its :func:`~snapshotkit._plan.digest.structure_digest` equal to the one it planned with (so a
  shape, dtype, path, kind, tie, box or pattern changed on any single rank makes every rank plan
  again), with the same ``chunk_bytes`` and ``data_object_bytes``;
* the serialized bytes of every replicated leaf it holds the size they were planned with (their
  pieces are in the shared decision);
* the same plan generation as every other rank (a token drawn by rank 0 at the full plan), so
  no rank reuses a plan another rank has replaced or never made;
* the same path and the same values of the replicated primitives as every other rank
  (:func:`~snapshotkit._plan.digest.shared_values_digest`).

Otherwise every rank plans from scratch and remembers the new plan. A primitive or object that
differed between the ranks when the plan was made stays stored per rank while the plan is reused
(correct, just not deduplicated), and writers are balanced with the object sizes of the take that
planned. The cache holds no tensors, keeps one plan per process group, and at most
:data:`MAX_GROUPS` groups (least recently used dropped).
"""

from __future__ import annotations

import collections
import dataclasses
import secrets
import threading
from collections.abc import Mapping

from snapshotkit._config import Config
from snapshotkit._dist import Group
from snapshotkit._format.entries import PrimitiveEntry
from snapshotkit._plan.decide import Decision
from snapshotkit._plan.digest import DIGEST_LIMIT
from snapshotkit._plan.leaves import LocalState, ObjectLeaf, TensorLeaf
from snapshotkit._plan.rank_plan import FixedPlan

#: Process groups whose last plan is kept.
MAX_GROUPS = 4

_INT64_MAX = (1 << 63) - 1


@dataclasses.dataclass(frozen=True)
class CachedPlan:
    """A rank's plan of an earlier take, and what decides whether it still holds.

    Attributes:
        digest: the structure digest this rank planned with.
        token: the plan's generation, the same on every rank.
        chunk_bytes: the configuration it was planned with (with ``data_object_bytes``).
        decision: the shared decision.
        fixed: this rank's structural plan.
        replicated_sizes: payload index -> size, for the serialized bytes of the replicated leaves
            this rank holds.
        replicated_primitives: logical paths of the replicated primitives, sorted.
    """

    digest: int
    token: int
    chunk_bytes: int
    data_object_bytes: int
    decision: Decision
    fixed: FixedPlan
    replicated_sizes: Mapping[int, int]
    replicated_primitives: tuple[str, ...]

    @classmethod
    def of(
        cls, local: LocalState, *, digest: int, token: int, config: Config, decision: Decision, fixed: FixedPlan
    ) -> CachedPlan:
        """The plan a take of ``local`` just made, to keep."""
        sizes: dict[int, int] = {}
        primitives: list[str] = []
        for path in decision.replicated:
            leaf = local.leaves[path]
            if isinstance(leaf, PrimitiveEntry):
                primitives.append(path)
            elif isinstance(leaf, (TensorLeaf, ObjectLeaf)) and local.payloads[leaf.payload].data is not None:
                sizes[leaf.payload] = local.payloads[leaf.payload].nbytes
        return cls(
            digest,
            token,
            config.chunk_bytes,
            config.data_object_bytes,
            decision,
            fixed,
            sizes,
            tuple(sorted(primitives)),
        )

    def fits(self, local: LocalState, digest: int, config: Config) -> bool:
        """Whether this rank's side of the plan holds for ``local`` (of structure ``digest``)."""
        return (
            digest == self.digest
            and config.chunk_bytes == self.chunk_bytes
            and config.data_object_bytes == self.data_object_bytes
            and all(local.payloads[index].nbytes == nbytes for index, nbytes in self.replicated_sizes.items())
        )


@dataclasses.dataclass(frozen=True)
class Agreement:
    """What the ranks agreed on.

    Attributes:
        reused: the plan every rank reuses; None: every rank plans from scratch.
        take_id: the take's id (rank 0's random draw), the same on every rank.
        token: the generation of a plan made now (the same random draw).
    """

    reused: CachedPlan | None
    take_id: str
    token: int


def agree(group: Group, candidate: CachedPlan | None, shared_digest: int, what: str) -> Agreement:
    """Whether every rank reuses its plan (module docstring): ``candidate`` is this rank's plan if
    it fits this take (else None), ``shared_digest`` the
    :func:`~snapshotkit._plan.digest.shared_values_digest` of this take. Every rank calls this,
    with or without a plan: one all-reduce (MIN) of five int64, nothing without a process group."""
    token = candidate.token if candidate is not None else 0
    nonce = secrets.randbelow(DIGEST_LIMIT - 1) + 1 if group.rank == 0 else _INT64_MAX
    low = group.all_reduce_min([token, -token, shared_digest, -shared_digest, nonce], what)
    # min(token) == max(token) > 0: every rank holds a fitting plan of the same generation
    same = low[0] > 0 and low[0] == -low[1] and low[2] == -low[3]
    return Agreement(candidate if same else None, f"{low[4] % (1 << 32):08x}", low[4])


_plans: collections.OrderedDict[tuple[object, ...], CachedPlan] = collections.OrderedDict()
_lock = threading.Lock()


def lookup(group: Group) -> CachedPlan | None:
    """The last plan made on ``group`` in this process, if any."""
    key = group.identity()
    with _lock:
        found = _plans.get(key)
        if found is not None:
            _plans.move_to_end(key)
        return found


def remember(group: Group, plan: CachedPlan) -> None:
    """Keep ``plan`` as ``group``'s last plan (replacing the one before)."""
    key = group.identity()
    with _lock:
        _plans[key] = plan
        _plans.move_to_end(key)
        while len(_plans) > MAX_GROUPS:
            _plans.popitem(last=False)


def forget() -> None:
    """Drop every kept plan (the next take on every group plans from scratch)."""
    with _lock:
        _plans.clear()
