"""Compare two snapshots: logical paths added, removed and changed, tensor values within a tolerance.

    from snapshotkit.diff import diff_snapshots

    report = diff_snapshots("ckpt/step_1000", "ckpt/step_2000", atol=1e-6)
    for change in report.changed:
        print(change.logical_path, change.what, change.max_abs_diff)

Values are read tensor by tensor under one memory budget (never a whole snapshot), with every
checksum verified, through the restore side's read pipeline; objects are compared by their
stored bytes and never unpickled. ``snapshotkit diff`` is the command-line face of it.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from snapshotkit._config import Config, snapshot_path
from snapshotkit._inspect.compare import PathChange, compare_snapshots
from snapshotkit._inspect.reader import SnapshotReader
from snapshotkit._runtime.budget import MemoryBudget
from snapshotkit.errors import ConfigError
from snapshotkit.snapshot import Snapshot

__all__ = ["DiffReport", "PathChange", "diff_snapshots"]


@dataclasses.dataclass(frozen=True)
class DiffReport:
    """What :func:`diff_snapshots` found, from A to B.

    Attributes:
        a: snapshot A's path.
        b: snapshot B's path.
        added: logical paths only B has (in B's order).
        removed: logical paths only A has (in A's order).
        changed: paths both have whose contents differ (in A's order).
        compared: how many logical paths both have.
        atol: the absolute tolerance used.
        rtol: the relative tolerance used.
    """

    a: str
    b: str
    added: tuple[str, ...]
    removed: tuple[str, ...]
    changed: tuple[PathChange, ...]
    compared: int
    atol: float
    rtol: float

    @property
    def identical(self) -> bool:
        """Whether the snapshots hold the same logical paths with equal contents (within the tolerance)."""
        return not (self.added or self.removed or self.changed)


def diff_snapshots(
    a: str,
    b: str,
    *,
    atol: float = 0.0,
    rtol: float = 0.0,
    storage_options: dict[str, Any] | None = None,
    memory_budget_bytes: int | None = None,
) -> DiffReport:
    """Compare snapshot ``a`` with snapshot ``b``.

    The logical paths compared are the leaves (tensors, objects, primitives, empty containers).
    Tensor elements are equal when ``torch.isclose(x, y, rtol=rtol, atol=atol, equal_nan=True)``
    holds in float64 (integers without a tolerance compare exactly); primitive numbers use the
    same tolerance; objects must have the same stored bytes.

    Memory: tensor pairs that fit in ``memory_budget_bytes`` together are read in groups that
    fit it; a larger pair is compared one stored piece of each side at a time (pieces are at
    most the take's chunk size, 16 MiB by default), except when its two sides are stored in
    different layouts (a sharded tensor with other boxes, a ``torch_save`` tensor): such a pair
    is read whole.

    Args:
        a: snapshot A (any path or URI :class:`~snapshotkit.Snapshot` opens).
        b: snapshot B.
        atol: absolute tolerance (>= 0).
        rtol: relative tolerance (>= 0), relative to B's value.
        storage_options: passed to the storage plugin of both snapshots.
        memory_budget_bytes: host bytes for values and buffers at once (default as for restore).

    Returns:
        The :class:`DiffReport`; ``report.identical`` is true when nothing differs.

    Raises:
        SnapshotNotFoundError: nothing is at ``a`` or ``b``.
        IntegrityError: stored bytes of a value compared are corrupt (run ``verify_snapshot``).
        ManifestError: a manifest is damaged, malformed or from a newer snapshotkit.
        StorageError: the store failed.
        ConfigError: a tolerance is negative or not finite, or the budget is not positive.
    """
    for name, value in (("atol", atol), ("rtol", rtol)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
            raise ConfigError(f"{name} must be a finite number >= 0, got {value!r}")
    where_a, where_b = snapshot_path(a), snapshot_path(b)
    options = dict(storage_options or {})
    config = Config.resolve(memory_budget_bytes=memory_budget_bytes, verify_checksums=True)
    metadata_a = Snapshot(where_a, storage_options=options).metadata
    metadata_b = Snapshot(where_b, storage_options=options).metadata
    budget = MemoryBudget(config.memory_budget_bytes)
    with (
        SnapshotReader(where_a, options, config, budget, metadata_a.bases) as reader_a,
        SnapshotReader(where_b, options, config, budget, metadata_b.bases) as reader_b,
    ):
        found = compare_snapshots(reader_a, metadata_a, reader_b, metadata_b, atol=float(atol), rtol=float(rtol))
    changed = found.changed
    return DiffReport(where_a, where_b, found.added, found.removed, changed, found.compared, float(atol), float(rtol))
