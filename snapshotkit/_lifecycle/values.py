"""Checks of what a manager is given: steps, metrics, user metadata and take keywords.

Every check runs before anything is written, and raises ``TypeError``/``ValueError`` subclasses
from :mod:`snapshotkit.errors`.
"""

from __future__ import annotations

import math
import operator
import signal
from collections.abc import Mapping
from typing import Any

from snapshotkit._lifecycle.catalog import MANAGER_KEY
from snapshotkit.errors import ConfigError, InvalidArgumentError

#: ``save()`` keywords the manager sets itself.
_MANAGED_KEYWORDS = ("metadata", "pg", "storage_options", "path", "app_state")


def check_step(step: object) -> int:
    """``step`` as a non-negative int (any integer type: int, NumPy, 0-d integer tensor; not bool)."""
    try:
        if isinstance(step, bool):
            raise TypeError
        value = operator.index(step)  # type: ignore[arg-type]
    except TypeError:
        raise InvalidArgumentError(
            f"step must be an int (the training step), got {type(step).__name__} {step!r}"
        ) from None
    if value < 0:
        raise ConfigError(f"step must be at least 0, got {value}")
    return value


def clean_metrics(metrics: object) -> dict[str, float | None]:
    """``metrics`` as ``{name: float | None}``; 0-d tensors and NumPy scalars become floats, and
    None or values that are not finite stay or become None (stored, never ranked as best)."""
    if metrics is None:
        return {}
    if not isinstance(metrics, Mapping):
        raise InvalidArgumentError(f"metrics must be a dict of name -> number, got {type(metrics).__name__}")
    clean: dict[str, float | None] = {}
    for name, value in metrics.items():
        if not isinstance(name, str):
            raise InvalidArgumentError(f"metric names must be str, got {type(name).__name__} {name!r}")
        if value is None:  # e.g. a validation loss only rank 0 computed: only rank 0's metrics are stored
            clean[name] = None
            continue
        if isinstance(value, bool):
            raise ConfigError(f"metric {name!r} is {value!r}; pass a number (a float, int or 0-d tensor)")
        try:
            number = float(value)
        except (TypeError, ValueError, RuntimeError) as exc:
            raise ConfigError(
                f"metric {name!r} is {type(value).__name__} {value!r}, not a number; pass a float, int or 0-d tensor"
            ) from exc
        clean[name] = number if math.isfinite(number) else None
    return clean


def check_metadata(metadata: object) -> dict[str, Any]:
    """The user's metadata as a dict; the manager's own key is refused (``Snapshot.take``
    checks that the rest is JSON)."""
    if metadata is None:
        return {}
    if not isinstance(metadata, Mapping):
        raise InvalidArgumentError(f"metadata must be a dict, got {type(metadata).__name__}")
    if MANAGER_KEY in metadata:
        raise ConfigError(f"metadata key {MANAGER_KEY!r} is the manager's own (step, metrics); use another key")
    return dict(metadata)


def check_signals(signals: object) -> tuple[int, ...]:
    """``preemption_signals`` as a tuple of signal numbers (a single signal is accepted too)."""
    if isinstance(signals, int):
        signals = (signals,)
    if not isinstance(signals, (list, tuple)) or not all(
        isinstance(s, int) and not isinstance(s, bool) for s in signals
    ):
        raise InvalidArgumentError(
            "preemption_signals must be signal numbers such as (signal.SIGTERM, signal.SIGUSR1), or (), "
            f"got {signals!r}"
        )
    valid = set(signal.valid_signals())
    for number in signals:
        if number not in valid or number in (signal.SIGKILL, getattr(signal, "SIGSTOP", -1)):
            raise ConfigError(f"preemption_signals: {number!r} is not a signal a handler can catch")
    return tuple(int(s) for s in dict.fromkeys(signals))


def check_interval(save_interval_steps: object) -> int | None:
    """``save_interval_steps``: None or an int >= 1."""
    if save_interval_steps is None:
        return None
    return _count_of_steps("save_interval_steps", save_interval_steps, "an int or None")


def check_check_every(preemption_check_every: object) -> int:
    """``preemption_check_every``: an int >= 1."""
    return _count_of_steps(
        "preemption_check_every", preemption_check_every, "an int (calls of should_save between agreements)"
    )


def _count_of_steps(name: str, value: object, expected: str) -> int:
    """``value`` of the argument ``name``: an int >= 1 (``expected`` words the type wanted)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidArgumentError(f"{name} must be {expected}, got {type(value).__name__} {value!r}")
    if value < 1:
        raise ConfigError(f"{name} must be at least 1, got {value}")
    return value


def on_interval(step: int, save_interval_steps: int | None) -> bool:
    """Whether ``step`` is a multiple of ``save_interval_steps`` (never, without one)."""
    return save_interval_steps is not None and step % save_interval_steps == 0


def check_take_keywords(take_kwargs: Mapping[str, Any], *, incremental: bool = False) -> None:
    """Refuse ``save()`` keywords the manager sets itself (``base`` too when it is incremental)."""
    if incremental and "base" in take_kwargs:
        raise InvalidArgumentError(
            "save() of an incremental SnapshotManager chooses base= itself (the newest snapshot); drop base=, "
            "or use SnapshotManager(..., incremental=False) to pass your own"
        )
    for name in _MANAGED_KEYWORDS:
        if name in take_kwargs:
            raise InvalidArgumentError(
                f"save() sets {name}= itself; pass pg and storage_options to SnapshotManager(...), "
                "and metadata through save(metadata=...)"
            )
