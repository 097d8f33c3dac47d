"""The first take's exchange: every rank learns every rank's description, each distinct part once.

A take that cannot reuse its plan needs every rank's :class:`~snapshotkit._plan.leaves.RankInfo`
on every rank. Sent whole, that is an all-gather of O(entries) bytes from each rank: at 16,384
ranks x 1,000 entries, about 1 GiB received by every rank. But ranks of one job mostly describe
the same thing: the same replicated leaves, and sharded tensors on the same meshes (a
:class:`~snapshotkit._plan.grid.Grid` is the same on every rank of its mesh). So a rank's
description travels as two *parts* (:class:`~snapshotkit._plan.gathered.RankParts`: replicated
candidates with path and patterns, and sharded tensors), in two rounds:

1. every rank all-gathers a :class:`Header` of :data:`HEADER_INT64` int64: whether it failed, its
   byte count, and the digest and size of each part;
2. each *distinct* part (by digest) is broadcast once, from the lowest rank holding it. A kind of
   part with more than :data:`MAX_BROADCAST_PARTS` distinct ones (ranks describing their shards
   box by box, each differently) is all-gathered instead, as before.

A rank receives ``world_size`` headers plus the distinct parts. A rank that failed while
describing makes every rank raise at the same step (:meth:`~snapshotkit._dist.Group.exchange`);
a rank lost in either round raises :class:`~snapshotkit.errors.RankFailedError` or
:class:`~snapshotkit.errors.CollectiveTimeoutError` on the others.
"""

from __future__ import annotations

import dataclasses
import pickle
from collections.abc import Mapping, Sequence
from typing import cast

import numpy as np

from snapshotkit._dist import Group
from snapshotkit._plan.gathered import Gathered, RankParts, ReplicatedPart, encode_part, part_digest
from snapshotkit._plan.leaves import RankInfo, ShardedDescription

#: int64 in a rank's header: failed, total bytes, then per part kind a 16-byte digest (two int64) and a size.
HEADER_INT64 = 8
#: Above this many distinct parts of one kind, that kind is all-gathered rather than broadcast part by part.
MAX_BROADCAST_PARTS = 64


@dataclasses.dataclass(frozen=True)
class Header:
    """A rank's round-1 message: whether it failed, its byte count, each part's digest and size."""

    failed: bool
    total_bytes: int
    replicated_digest: bytes
    replicated_bytes: int
    sharded_digest: bytes
    sharded_bytes: int

    def to_int64(self) -> list[int]:
        return [
            int(self.failed),
            self.total_bytes,
            *_words(self.replicated_digest),
            self.replicated_bytes,
            *_words(self.sharded_digest),
            self.sharded_bytes,
        ]

    @classmethod
    def of_int64(cls, values: Sequence[int]) -> Header:
        failed, total, r0, r1, rn, s0, s1, sn = values
        return cls(bool(failed), total, _digest(r0, r1), rn, _digest(s0, s1), sn)


FAILED = Header(True, 0, bytes(16), 0, bytes(16), 0)


def _words(digest: bytes) -> tuple[int, int]:
    return int.from_bytes(digest[:8], "little", signed=True), int.from_bytes(digest[8:], "little", signed=True)


def _digest(low: int, high: int) -> bytes:
    return low.to_bytes(8, "little", signed=True) + high.to_bytes(8, "little", signed=True)


@dataclasses.dataclass(frozen=True)
class Encoded:
    """A rank's description as it is sent: its header and the bytes of its two parts."""

    header: Header
    replicated: bytes
    sharded: bytes

    @classmethod
    def of(cls, info: RankInfo) -> Encoded:
        parts = RankParts.of(info)
        replicated, sharded = encode_part(parts.replicated), encode_part(parts.sharded)
        header = Header(
            False, info.total_bytes, part_digest(replicated), len(replicated), part_digest(sharded), len(sharded)
        )
        return cls(header, replicated, sharded)


@dataclasses.dataclass(frozen=True)
class Distinct:
    """The distinct parts of one kind, in the order of the first rank holding each.

    Attributes:
        sources: per distinct part, the lowest rank holding it.
        sizes: per distinct part, its size in bytes.
        of: per rank, the index of its part.
    """

    sources: tuple[int, ...]
    sizes: tuple[int, ...]
    of: tuple[int, ...]

    @classmethod
    def of_headers(cls, digests: Sequence[bytes], sizes: Sequence[int]) -> Distinct:
        index: dict[bytes, int] = {}
        sources: list[int] = []
        distinct_sizes: list[int] = []
        of: list[int] = []
        for rank, (digest, size) in enumerate(zip(digests, sizes, strict=True)):
            if (known := index.get(digest)) is None:
                known = index[digest] = len(sources)
                sources.append(rank)
                distinct_sizes.append(size)
            of.append(known)
        return cls(tuple(sources), tuple(distinct_sizes), tuple(of))

    @property
    def broadcast(self) -> bool:
        """Whether the parts go one broadcast each (else one all-gather of every rank's part)."""
        return len(self.sources) <= MAX_BROADCAST_PARTS

    def received_bytes(self, rank: int, world_size: int) -> int:
        """What ``rank`` receives for this kind: each distinct part it does not hold itself, or
        the all-gather's (sizes, then every rank's part padded to the longest)."""
        if self.broadcast:
            return sum(size for source, size in zip(self.sources, self.sizes, strict=True) if source != rank)
        # Group.all_gather_object: the sizes, then every rank's pickled part padded to the longest
        longest = len(pickle.dumps(bytes(max(self.sizes, default=0)), protocol=pickle.HIGHEST_PROTOCOL))
        return 8 * world_size + world_size * longest


@dataclasses.dataclass(frozen=True)
class Exchanged:
    """What the exchange delivered to this rank.

    Attributes:
        gathered: every rank's description, each distinct part once.
        received_bytes: every byte this rank received in both rounds.
    """

    gathered: Gathered
    received_bytes: int


def header_bytes(world_size: int) -> int:
    """What every rank receives in round 1."""
    return 8 * HEADER_INT64 * world_size


def exchange_descriptions(
    group: Group, info: RankInfo | None, error: BaseException | None, what: str, consequence: str
) -> Exchanged:
    """Every rank's description (module docstring); ``error``: this rank failed to describe its state.

    Raises:
        the ``error`` of this rank, or :class:`~snapshotkit.errors.RankFailedError` naming another
        rank's (with ``consequence`` in its message); :class:`~snapshotkit.errors.RankFailedError`
        or :class:`~snapshotkit.errors.CollectiveTimeoutError` when a rank is lost.
    """
    if not group.distributed:
        if error is not None:
            raise error
        assert info is not None
        return Exchanged(Gathered.of_parts([RankParts.of(info)], group.member_ranks()), 0)
    if error is not None:
        encoded = None
        mine = FAILED
    else:
        assert info is not None
        encoded = Encoded.of(info)
        mine = encoded.header
    headers = [Header.of_int64(values) for values in group.all_gather_int64(mine.to_int64(), what)]
    if any(header.failed for header in headers):
        # every rank raises here: the failing rank its own error, the others a RankFailedError
        group.exchange(None, error, what, consequence)
        raise AssertionError("unreachable: the exchange raises when a rank failed")  # pragma: no cover
    assert encoded is not None
    received = header_bytes(group.world_size)
    replicated = Distinct.of_headers([h.replicated_digest for h in headers], [h.replicated_bytes for h in headers])
    sharded = Distinct.of_headers([h.sharded_digest for h in headers], [h.sharded_bytes for h in headers])
    replicated_parts = _receive(group, replicated, encoded.replicated, what)
    sharded_parts = _receive(group, sharded, encoded.sharded, what)
    received += replicated.received_bytes(group.rank, group.world_size)
    received += sharded.received_bytes(group.rank, group.world_size)
    gathered = Gathered(
        np.asarray([h.total_bytes for h in headers], dtype=np.int64),
        tuple(cast("list[ReplicatedPart]", replicated_parts)),
        np.asarray(replicated.of, dtype=np.int64),
        tuple(cast("list[Mapping[str, ShardedDescription]]", sharded_parts)),
        np.asarray(sharded.of, dtype=np.int64),
        np.asarray(group.member_ranks(), dtype=np.int64),
    )
    return Exchanged(gathered, received)


def _receive(group: Group, distinct: Distinct, mine: bytes, what: str) -> list[object]:
    """The distinct parts of one kind, decoded, in :class:`Distinct` order."""
    if distinct.broadcast:
        data = [
            group.broadcast_bytes(mine if source == group.rank else None, size, source, what)
            for source, size in zip(distinct.sources, distinct.sizes, strict=True)
        ]
    else:
        every = group.all_gather_bytes(mine, what)
        data = [every[source] for source in distinct.sources]
    return [pickle.loads(part) for part in data]  # noqa: S301 - our own ranks' messages
