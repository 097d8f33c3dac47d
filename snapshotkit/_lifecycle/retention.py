"""Which snapshots a manager keeps: a pure function of the committed steps, their metrics and the policy.

No I/O here: the manager lists the root, builds :class:`StepRecord` values, and deletes what
:func:`kept_steps` leaves out. The policy is a union (Orbax's preservation policies, combined):

* the newest ``keep_last`` steps;
* every step that is a multiple of ``keep_every``;
* the ``keep_best`` steps with the best finite ``best_metric`` (``best_mode`` ``"min"`` or ``"max"``,
  ties broken towards the newer step);
* always the newest step, so a job can resume from its latest save whatever the metrics say.

With neither ``keep_last`` nor ``keep_best`` set, nothing is deleted.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping
from typing import Literal

from snapshotkit.errors import ConfigError, InvalidArgumentError

BestMode = Literal["min", "max"]


@dataclasses.dataclass(frozen=True)
class StepRecord:
    """A committed snapshot the manager wrote.

    Attributes:
        step: the training step it was saved for.
        metrics: the metrics saved with it (a value is ``None`` when it was not finite).
    """

    step: int
    metrics: Mapping[str, float | None] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class RetentionPolicy:
    """What a :class:`~snapshotkit.SnapshotManager` keeps (see the module docstring).

    Attributes:
        keep_last: keep the newest this many (None: no limit by recency).
        keep_every: keep every step that is a multiple of this (None: none by period).
        keep_best: keep the best this many by ``best_metric`` (None: none by metric).
        best_metric: the metric ``keep_best`` and ``best_step()`` rank by.
        best_mode: ``"min"`` (lower is better) or ``"max"``.
    """

    keep_last: int | None = None
    keep_every: int | None = None
    keep_best: int | None = None
    best_metric: str | None = None
    best_mode: BestMode = "min"

    def __post_init__(self) -> None:
        for name in ("keep_last", "keep_every", "keep_best"):
            value = getattr(self, name)
            if value is None:
                continue
            if type(value) is not int:
                raise InvalidArgumentError(f"{name} must be an int or None, got {type(value).__name__} {value!r}")
            if value < 1:
                raise ConfigError(f"{name}={value} must be at least 1 (or None for no limit of that kind)")
        if self.best_metric is not None and not isinstance(self.best_metric, str):
            raise InvalidArgumentError(f"best_metric must be a str naming a metric, got {self.best_metric!r}")
        if self.best_mode not in ("min", "max"):
            raise ConfigError(f"best_mode must be 'min' or 'max', got {self.best_mode!r}")
        if self.keep_best is not None and self.best_metric is None:
            raise ConfigError(
                f"keep_best={self.keep_best} needs best_metric: name the metric to rank by "
                "(e.g. best_metric='val_loss')"
            )

    @property
    def deletes(self) -> bool:
        """Whether this policy ever deletes anything."""
        return self.keep_last is not None or self.keep_best is not None


def metric_value(record: StepRecord, metric: str | None) -> float | None:
    """``record``'s finite value of ``metric``, or None."""
    if metric is None:
        return None
    value = record.metrics.get(metric)
    if value is None or not math.isfinite(value):
        return None
    return float(value)


def best_steps(records: Iterable[StepRecord], metric: str | None, mode: BestMode, count: int) -> list[int]:
    """The ``count`` steps with the best finite ``metric``, best first (ties: newer step first)."""
    ranked = [(value, r.step) for r in records if (value := metric_value(r, metric)) is not None]
    sign = 1.0 if mode == "min" else -1.0
    ranked.sort(key=lambda item: (sign * item[0], -item[1]))
    return [step for _, step in ranked[:count]]


def kept_steps(records: Iterable[StepRecord], policy: RetentionPolicy) -> frozenset[int]:
    """The steps of ``records`` that ``policy`` keeps; every other one may be deleted."""
    records = list(records)
    steps = sorted({r.step for r in records})
    if not steps or not policy.deletes:
        return frozenset(steps)
    kept = {steps[-1]}
    if policy.keep_last is not None:
        kept.update(steps[-policy.keep_last :])
    if policy.keep_every is not None:
        kept.update(s for s in steps if s % policy.keep_every == 0)
    if policy.keep_best is not None:
        kept.update(best_steps(records, policy.best_metric, policy.best_mode, policy.keep_best))
    return frozenset(kept)
