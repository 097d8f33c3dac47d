"""Digests that tell a take whether the plan of an earlier take still holds (pure: no I/O).

A plan (:func:`~snapshotkit._plan.decide.decide`, :func:`~snapshotkit._plan.rank_plan.fix_plan`)
depends on each rank's *structure*: containers, logical paths, each leaf's kind and description
(dtype, shape, serializer, tied tensors, sharded boxes and their payload indices) and the
``replicated=`` patterns. It does not depend on primitive values or on the sizes of rank-local
serialized bytes, which every take lays out anew. :func:`structure_digest` covers exactly the
former.

Two values are not local: a replicated primitive is stored once only while every rank holds the
same value, and every rank must write to rank 0's path. :func:`shared_values_digest` condenses
those into one integer that is equal on two ranks exactly when they agree (up to a 2**-62 chance).
"""

from __future__ import annotations

import hashlib
import itertools
import operator
from collections.abc import Sequence

from snapshotkit._format.entries import PrimitiveEntry
from snapshotkit._plan.leaves import LocalState

#: Digests are non-negative and below this (they travel as int64).
DIGEST_LIMIT = 1 << 62


def structure_digest(local: LocalState, patterns: Sequence[str], *, rank: int, world_size: int) -> int:
    """A digest of the structure of ``local`` (module docstring) as rank ``rank`` of ``world_size``
    with ``patterns``: equal for two descriptions whose plans are the same.

    Process-local (Python's ``hash``: strings hash differently in other processes), so it is
    only ever compared with a digest this process computed. One pass in C over the leaves plus
    one hash of each non-primitive leaf: about a fifth of a microsecond per leaf.
    """
    values = tuple(local.leaves.values())
    kinds = tuple(map(type, values))
    # A primitive's value changes from take to take; its kind and path are in `kinds` and the keys.
    described = tuple(itertools.compress(values, map(operator.is_not, kinds, itertools.repeat(PrimitiveEntry))))
    return hash(
        (
            rank,
            world_size,
            tuple(patterns),
            tuple(local.containers.items()),
            tuple(local.leaves),
            kinds,
            described,
        )
    )


def shared_values_digest(path: str, local: LocalState, replicated_primitives: Sequence[str]) -> int:
    """A digest, the same in every process, of ``path`` and of the values (type and ``repr``, as
    :func:`~snapshotkit._plan.leaves.signature` compares them) of the primitives at
    ``replicated_primitives``: equal on two ranks when both agree on all of them."""
    values = []
    for leaf_path in replicated_primitives:
        leaf = local.leaves.get(leaf_path)
        values.append((leaf_path, leaf.value_type, repr(leaf.value)) if isinstance(leaf, PrimitiveEntry) else None)
    data = repr((path, values)).encode("utf-8", "surrogatepass")
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little") % DIGEST_LIMIT
