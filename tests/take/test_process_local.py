"""A process-local store (``memory://``) is refused wherever another process would write to it.

Before: ``async_take(executor="process")`` to ``memory://`` had the checkpoint daemon write the
data objects into its own memory while the trainer committed a manifest pointing at nothing;
``wait()`` succeeded and every read failed.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from snapshotkit import Snapshot, SnapshotManager, StateDict
from snapshotkit.errors import ConfigError
from snapshotkit.storage import MemoryStoragePlugin, register_storage_plugin
from snapshotkit.storage._memory import _STORE
from snapshotkit.testing import FaultInjectingPlugin

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(autouse=True)
def _fresh(fresh_writers: dict[tuple[str, int], Any]) -> None:
    """Every test starts without background writers (``fresh_writers``, tests/take/conftest.py)."""


class Recording(StateDict):
    """Counts ``state_dict()`` calls: a refused take must not even read the state."""

    calls = 0

    def state_dict(self) -> dict[str, Any]:
        Recording.calls += 1
        return super().state_dict()


def _written_under(root: str) -> list[str]:
    prefix = root.removeprefix("memory://").strip("/") + "/"
    return [key for key in list(_STORE) if key.startswith(prefix)]


def test_the_process_executor_refuses_a_memory_store_before_anything_is_read_or_written(
    fresh_writers: dict[tuple[str, int], Any],
) -> None:
    Recording.calls = 0
    state = {"s": Recording(x=torch.ones(1000))}
    with pytest.raises(ConfigError, match='executor="thread"') as info:
        Snapshot.async_take("memory://refused/step_1", state, executor="process")
    assert "'memory://refused/step_1'" in str(info.value)
    assert isinstance(info.value, ValueError)
    assert Recording.calls == 0
    assert _written_under("memory://refused") == []
    assert fresh_writers == {}  # no checkpoint daemon was started for it


def test_the_thread_executor_writes_to_a_memory_store() -> None:
    state = {"s": StateDict(x=torch.arange(1000.0))}
    Snapshot.async_take("memory://thread-ok/step_1", state, executor="thread").wait()
    assert torch.equal(Snapshot("memory://thread-ok/step_1").read_object("s/x"), torch.arange(1000.0))


def test_the_capability_is_seen_through_a_wrapping_plugin() -> None:
    assert MemoryStoragePlugin.capabilities.process_local
    register_storage_plugin("flakymemory", FaultInjectingPlugin.factory("memory", rate=0.0))
    with pytest.raises(ConfigError, match="process-local"):
        Snapshot.async_take("flakymemory://wrapped", {"s": StateDict(x=torch.ones(10))}, executor="process")
    assert _written_under("memory://wrapped") == []


def test_a_manager_refuses_the_process_executor_for_a_memory_root() -> None:
    with pytest.raises(ConfigError, match='executor="thread"'):
        SnapshotManager("memory://refused-run", async_executor="process", preemption_signals=())
    assert _written_under("memory://refused-run") == []


def test_a_manager_save_with_the_process_executor_to_a_memory_root_raises_and_records_nothing() -> None:
    with SnapshotManager("memory://run-save", preemption_signals=()) as manager:
        state = {"s": StateDict(x=torch.ones(10))}
        with pytest.raises(ConfigError, match='executor="thread"'):
            manager.save(1, state, async_take=True, executor="process")
        assert manager.steps() == []
        manager.save(1, state, async_take=True).wait()  # the thread executor: fine
        assert manager.steps() == [1]
