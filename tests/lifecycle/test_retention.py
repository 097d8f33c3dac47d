"""The retention policy (``_lifecycle/retention.py``): examples, argument checks, and properties."""

from __future__ import annotations

import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from snapshotkit._lifecycle.retention import RetentionPolicy, StepRecord, best_steps, kept_steps
from snapshotkit.errors import ConfigError, InvalidArgumentError

FAST = settings(max_examples=300, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])


def records(*pairs: tuple[int, float | None]) -> list[StepRecord]:
    return [StepRecord(step, {} if loss is None else {"loss": loss}) for step, loss in pairs]


def test_no_limit_keeps_everything() -> None:
    steps = records((1, 0.5), (2, 0.4), (3, 0.3))
    assert kept_steps(steps, RetentionPolicy()) == {1, 2, 3}
    assert kept_steps(steps, RetentionPolicy(keep_every=2)) == {1, 2, 3}  # a period alone deletes nothing


def test_keep_last_keeps_the_newest_by_step_number() -> None:
    steps = records((10, None), (2, None), (30, None), (4, None))
    assert kept_steps(steps, RetentionPolicy(keep_last=2)) == {10, 30}


def test_keep_every_adds_multiples() -> None:
    steps = records(*[(s, None) for s in range(0, 100, 10)])
    assert kept_steps(steps, RetentionPolicy(keep_last=1, keep_every=40)) == {0, 40, 80, 90}


def test_keep_best_min_and_max_and_the_newest_always() -> None:
    steps = records((1, 0.9), (2, 0.1), (3, 0.5), (4, 0.7))
    assert kept_steps(steps, RetentionPolicy(keep_best=1, best_metric="loss")) == {2, 4}
    assert kept_steps(steps, RetentionPolicy(keep_best=2, best_metric="loss", best_mode="max")) == {1, 4}


def test_missing_and_non_finite_metrics_never_rank_as_best() -> None:
    steps = [StepRecord(1, {"loss": None}), StepRecord(2, {}), StepRecord(3, {"loss": 2.0}), StepRecord(4, {})]
    assert best_steps(steps, "loss", "min", 5) == [3]
    assert kept_steps(steps, RetentionPolicy(keep_best=3, best_metric="loss")) == {3, 4}


def test_ties_prefer_the_newer_step() -> None:
    assert best_steps(records((1, 0.5), (5, 0.5), (3, 0.5)), "loss", "min", 2) == [5, 3]


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"keep_last": 0}, ConfigError),
        ({"keep_last": -1}, ConfigError),
        ({"keep_last": 1.5}, InvalidArgumentError),
        ({"keep_last": True}, InvalidArgumentError),
        ({"keep_every": 0}, ConfigError),
        ({"keep_best": 2}, ConfigError),  # no best_metric
        ({"keep_best": 1, "best_metric": 3}, InvalidArgumentError),
        ({"best_mode": "lowest"}, ConfigError),
    ],
)
def test_bad_policies_are_refused(kwargs: dict[str, object], error: type[Exception]) -> None:
    with pytest.raises(error):
        RetentionPolicy(**kwargs)  # type: ignore[arg-type]


# --------------------------------------------------------------------------- properties

metric_values = st.one_of(st.none(), st.floats(allow_nan=True, allow_infinity=True, width=32))
histories = st.dictionaries(st.integers(0, 500), metric_values, min_size=0, max_size=25)
policies = st.builds(
    RetentionPolicy,
    keep_last=st.one_of(st.none(), st.integers(1, 6)),
    keep_every=st.one_of(st.none(), st.integers(1, 50)),
    keep_best=st.one_of(st.none(), st.integers(1, 4)),
    best_metric=st.just("loss"),
    best_mode=st.sampled_from(["min", "max"]),
)


def named_by_policy(step: int, history: dict[int, float | None], policy: RetentionPolicy) -> bool:
    """The policy's words, one step at a time (an oracle written independently of kept_steps)."""
    if policy.keep_last is None and policy.keep_best is None:
        return True
    newer = sum(1 for other in history if other > step)
    if newer == 0:
        return True
    if policy.keep_last is not None and newer < policy.keep_last:
        return True
    if policy.keep_every is not None and step % policy.keep_every == 0:
        return True
    value = history[step]
    if policy.keep_best is not None and value is not None and math.isfinite(value):
        sign = 1 if policy.best_mode == "min" else -1

        def better(other: int) -> bool:
            v = history[other]
            if v is None or not math.isfinite(v):
                return False
            return sign * v < sign * value or (v == value and other > step)

        return sum(1 for other in history if other != step and better(other)) < policy.keep_best
    return False


@FAST
@given(histories, policies)
def test_kept_steps_is_exactly_what_the_policy_names(history: dict[int, float | None], policy: RetentionPolicy) -> None:
    kept = kept_steps([StepRecord(s, {"loss": v}) for s, v in history.items()], policy)
    assert kept == {s for s in history if named_by_policy(s, history, policy)}


@FAST
@given(histories, policies)
def test_applying_after_every_save_keeps_what_applying_once_keeps(
    history: dict[int, float | None], policy: RetentionPolicy
) -> None:
    """A manager applies retention after each save and deleted steps never come back: that must
    end with the set the policy names for the whole history (membership only ever shrinks)."""
    alive: dict[int, float | None] = {}
    for step in sorted(history):
        alive[step] = history[step]
        keep = kept_steps([StepRecord(s, {"loss": v}) for s, v in alive.items()], policy)
        alive = {s: v for s, v in alive.items() if s in keep}
    assert set(alive) == kept_steps([StepRecord(s, {"loss": v}) for s, v in history.items()], policy)
