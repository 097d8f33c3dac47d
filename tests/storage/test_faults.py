"""Fault injection: take, async_take (both executors), restore and read_object through a flaky store.

``FaultInjectingPlugin`` is registered like a user's plugin, around the local filesystem plugin
and around the generic fsspec plugin (``local://``), and fails a seeded fraction of storage calls
with connection resets, timeouts, throttling and lost responses. Every operation must either
succeed with byte-exact data or raise a ``SnapshotkitError``; a failed take must leave nothing that
restores wrong data. Two regimes: *flaky* (15% of calls, 6 attempts: every operation must
succeed, and each test asserts it for its own operations) and *hostile* (50% of calls,
3 attempts: many operations give up).

Each test runs ``SNAPSHOTKIT_TEST_FAULT_EXAMPLES`` seeds (default 3); the outcome counts are
printed at the end of the module (``pytest -s``).
"""

from __future__ import annotations

import functools
import os
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from snapshotkit import Snapshot, StateDict
from snapshotkit.errors import SnapshotkitError
from snapshotkit.storage import register_storage_plugin
from snapshotkit.testing import FaultInjectingPlugin

pytestmark = pytest.mark.usefixtures("clean_env")

EXAMPLES = int(os.environ.get("SNAPSHOTKIT_TEST_FAULT_EXAMPLES", "3"))
REGIMES = {
    "flaky": ({"rate": 0.15}, {"max_attempts": 6, "initial_delay_seconds": 0.001, "max_delay_seconds": 0.004}),
    "hostile": ({"rate": 0.5}, {"max_attempts": 3, "initial_delay_seconds": 0.001, "max_delay_seconds": 0.002}),
}
#: scheme -> how to reach the same root without faults
BACKENDS = {"faulty-file": lambda path: str(path), "faulty-fsspec": lambda path: f"local://{path}"}

# At import, so the checkpoint daemon of executor="process" (started later) learns them too.
register_storage_plugin("faulty-file", FaultInjectingPlugin.factory("file"))
register_storage_plugin("faulty-fsspec", FaultInjectingPlugin.factory("local"))

OUTCOMES: Counter[tuple[str, str, str]] = Counter()


@pytest.fixture(scope="module", autouse=True)
def _report() -> Iterator[None]:
    yield
    print(f"\nfault injection outcomes ({EXAMPLES} seeds per case):")
    for (operation, regime, outcome), count in sorted(OUTCOMES.items()):
        print(f"  {operation:<22} {regime:<8} {outcome:<28} {count}")


def _state(seed: int) -> dict[str, Any]:
    generator = torch.Generator().manual_seed(seed)
    model = torch.nn.Linear(32, 16)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.copy_(torch.randn(parameter.shape, generator=generator))
    extras = StateDict(step=seed, name=f"run-{seed}", w=torch.randn(300, generator=generator), history=[0.5, seed])
    return {"model": model, "extras": extras}


def _blank() -> dict[str, Any]:
    return {"model": torch.nn.Linear(32, 16), "extras": StateDict()}


def _assert_same(restored: dict[str, Any], expected: dict[str, Any]) -> None:
    for name, tensor in expected["model"].state_dict().items():
        got = restored["model"].state_dict()[name]
        assert got.dtype == tensor.dtype and torch.equal(got.view(torch.uint8), tensor.view(torch.uint8)), name
    assert restored["extras"]["step"] == expected["extras"]["step"]
    assert restored["extras"]["name"] == expected["extras"]["name"]
    assert restored["extras"]["history"] == expected["extras"]["history"]
    assert torch.equal(restored["extras"]["w"].view(torch.uint8), expected["extras"]["w"].view(torch.uint8))


def _options(regime: str, seed: int) -> dict[str, Any]:
    faults, retry = REGIMES[regime]
    return {"faults": {**faults, "seed": seed}, "retry": retry}


def _outcome(operation: str, regime: str, run: Callable[[], None]) -> str:
    """Run ``run``; count and return ``"ok"`` or the SnapshotkitError's class (anything else fails).

    In the flaky regime the operation must succeed: its error is raised (the test fails with it).
    """
    try:
        run()
    except SnapshotkitError as exc:
        OUTCOMES[operation, regime, type(exc).__name__] += 1
        if regime == "flaky":
            raise  # 15% faults with 6 attempts must lose nothing
        return type(exc).__name__
    OUTCOMES[operation, regime, "ok"] += 1
    return "ok"


def _check_after_take(clean_uri: str, expected: dict[str, Any], outcome: str) -> None:
    """A committed take restores exactly; a failed one restores exactly or raises our error."""
    restored = _blank()
    if outcome == "ok":
        Snapshot(clean_uri).restore(restored)
        _assert_same(restored, expected)
        return
    try:
        Snapshot(clean_uri).restore(restored)
    except SnapshotkitError:
        return
    _assert_same(restored, expected)  # the commit took effect although its answer was lost


def _take(how: str, uri: str, state: dict[str, Any], options: dict[str, Any]) -> None:
    if how == "take":
        Snapshot.take(uri, state, storage_options=options)
    else:
        Snapshot.async_take(uri, state, storage_options=options, executor=how.split("/")[1]).wait()


#: (how, scheme) taken through faults; the daemon of executor="process" writes through the same
#: retry layer whatever the backend, so one backend is enough for it.
TAKE_CASES = [
    (how, scheme)
    for how in ("take", "async_take/thread", "async_take/process")
    for scheme in BACKENDS
    if not (how == "async_take/process" and scheme == "faulty-fsspec")
]


@pytest.mark.parametrize("regime", REGIMES)
@pytest.mark.parametrize(("how", "scheme"), TAKE_CASES)
def test_take_through_faults(tmp_path: Path, scheme: str, regime: str, how: str) -> None:
    for seed in range(EXAMPLES):
        state, path = _state(seed), tmp_path / f"snap-{seed}"
        take = functools.partial(_take, how, f"{scheme}://{path}", state, _options(regime, seed))
        _check_after_take(BACKENDS[scheme](path), state, _outcome(how, regime, take))


def _read(how: str, snapshot: Snapshot, expected: dict[str, Any]) -> None:
    """Restore, or read two objects, through ``snapshot``; if that works, the values are exact."""
    if how == "restore":
        restored = _blank()
        snapshot.restore(restored)
        _assert_same(restored, expected)
        return
    weight = snapshot.read_object("model/weight")
    extras = snapshot.read_object("extras")
    assert torch.equal(weight.view(torch.uint8), expected["model"].weight.detach().view(torch.uint8))
    assert extras["name"] == expected["extras"]["name"]
    assert torch.equal(extras["w"].view(torch.uint8), expected["extras"]["w"].view(torch.uint8))


@pytest.mark.parametrize("regime", REGIMES)
@pytest.mark.parametrize("scheme", BACKENDS)
@pytest.mark.parametrize("how", ["restore", "read_object"])
def test_read_through_faults(tmp_path: Path, scheme: str, regime: str, how: str) -> None:
    for seed in range(EXAMPLES):
        state, path = _state(seed), tmp_path / f"snap-{seed}"
        Snapshot.take(str(path), state)
        snapshot = Snapshot(f"{scheme}://{path}", storage_options=_options(regime, seed))
        _outcome(how, regime, functools.partial(_read, how, snapshot, state))
