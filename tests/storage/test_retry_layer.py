"""The one retry layer (``snapshotkit.storage._retry_layer``) around every plugin snapshotkit opens.

Registered plugins here are real file-system plugins whose calls fail in scripted ways, so every
retry decision is checked against a real store.
"""

from __future__ import annotations

import asyncio
import errno
import logging
from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

import pytest
import torch

from snapshotkit import Snapshot, StateDict
from snapshotkit.errors import ConfigError, RetriesExhaustedError, SnapshotkitError, StorageError
from snapshotkit.storage import (
    ByteRange,
    Capabilities,
    FSStoragePlugin,
    MemoryStoragePlugin,
    RetryingStoragePlugin,
    RetryPolicy,
    StoragePlugin,
    is_transient_error,
    open_storage_plugin,
    register_storage_plugin,
    url_to_storage_plugin,
)
from snapshotkit.storage._base import as_buffers

pytestmark = pytest.mark.usefixtures("clean_env")

FAST = {"max_attempts": 4, "initial_delay_seconds": 0.001, "max_delay_seconds": 0.002}


class FirstAttemptFails(FSStoragePlugin):
    """Every call's first attempt (per operation and location) fails with a connection reset."""

    seen: ClassVar[Counter[tuple[str, str]]] = Counter()

    def _flake(self, operation: str, location: str) -> None:
        key = (f"{self.root}:{operation}", location)
        FirstAttemptFails.seen[key] += 1
        if FirstAttemptFails.seen[key] == 1:
            raise ConnectionResetError(errno.ECONNRESET, f"{operation} {location}: connection reset by peer")

    async def write(self, location: str, data: Any) -> None:
        self._flake("write", location)
        await super().write(location, data)

    async def write_exclusive(self, location: str, data: Any) -> None:
        self._flake("write_exclusive", location)
        await super().write_exclusive(location, data)

    async def read(self, location: str, byte_range: ByteRange | None = None) -> bytes | memoryview:
        self._flake("read", location)
        return await super().read(location, byte_range)

    async def read_into(self, location: str, start: int, buffers: Any) -> None:
        self._flake(f"read_into@{start}", location)
        await super().read_into(location, start, buffers)

    async def exists(self, location: str) -> bool:
        self._flake("exists", location)
        return await super().exists(location)


def _first_attempt_fails(root: str, options: Mapping[str, Any]) -> StoragePlugin:
    return FirstAttemptFails(root)


register_storage_plugin("resets", _first_attempt_fails)


def _state() -> dict[str, Any]:
    return {"model": torch.nn.Linear(16, 8), "progress": StateDict(step=7, name="run", w=torch.arange(5.0))}


def test_a_registered_plugin_survives_connection_resets(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Issue 13, item 6: before the retry layer, one reset from a registered plugin failed the take."""
    state, path = _state(), f"resets://{tmp_path / 'snap'}"
    with caplog.at_level(logging.WARNING, logger="snapshotkit.storage"):
        Snapshot.take(path, state, storage_options={"retry": FAST})
        fresh = _state()
        snapshot = Snapshot(path, storage_options={"retry": FAST})
        snapshot.restore(fresh)
        weight = snapshot.read_object("model/weight")
    assert all(torch.equal(fresh["model"].state_dict()[k], v) for k, v in state["model"].state_dict().items())
    assert torch.equal(weight, state["model"].weight.detach())
    assert fresh["progress"]["step"] == 7
    retries = [r for r in caplog.records if r.name == "snapshotkit.storage" and "retrying in" in r.getMessage()]
    assert retries and all(r.levelno == logging.WARNING for r in retries)
    messages = " ".join(r.getMessage() for r in retries)
    assert "write_exclusive resets://" in messages and ".snapshot_metadata" in messages
    assert "ConnectionResetError" in messages


class Scripted(StoragePlugin):
    """A memory-backed plugin whose calls raise the queued errors first, in order.

    ``lose`` names operations whose next attempt takes effect and then fails with a reset.
    """

    def __init__(self, errors: list[BaseException] | None = None, lose: tuple[str, ...] = ()) -> None:
        self.objects: dict[str, bytes] = {}
        self.errors = list(errors or [])
        self.lose = list(lose)
        self.attempts = 0

    def _next(self, operation: str) -> bool:
        self.attempts += 1
        if self.errors:
            raise self.errors.pop(0)
        if operation in self.lose:
            self.lose.remove(operation)
            return True
        return False

    async def write(self, location: str, data: Any) -> None:
        lost = self._next("write")
        self.objects[location] = b"".join(as_buffers(data))
        if lost:
            raise ConnectionResetError("lost response")

    async def write_exclusive(self, location: str, data: Any) -> None:
        lost = self._next("write_exclusive")
        if location in self.objects:
            raise FileExistsError(location)
        self.objects[location] = b"".join(as_buffers(data))
        if lost:
            raise ConnectionResetError("lost response")

    async def read(self, location: str, byte_range: ByteRange | None = None) -> bytes:
        self._next("read")
        try:
            data = self.objects[location]
        except KeyError:
            raise FileNotFoundError(location) from None
        return data if byte_range is None else data[byte_range.start : byte_range.end]

    async def delete(self, location: str) -> None:
        lost = self._next("delete")
        try:
            del self.objects[location]
        except KeyError:
            raise FileNotFoundError(location) from None
        if lost:
            raise ConnectionResetError("lost response")

    async def close(self) -> None:
        pass


def _retrying(plugin: StoragePlugin, **policy: Any) -> RetryingStoragePlugin:
    return RetryingStoragePlugin(plugin, RetryPolicy(**{**FAST, **policy}), "scripted://root")


@pytest.mark.parametrize(
    "error",
    [ConnectionResetError("reset"), ConnectionAbortedError("aborted"), TimeoutError("timed out")],
    ids=["reset", "abort", "timeout"],
)
def test_transient_errors_are_retried(error: BaseException) -> None:
    plugin = Scripted([error, error])
    asyncio.run(_retrying(plugin).write("a", b"x"))
    assert plugin.objects == {"a": b"x"}
    assert plugin.attempts == 3


class Throttled(OSError):
    status = 429


def test_throttling_by_http_status_is_transient() -> None:
    assert is_transient_error(Throttled("SlowDown"))
    plugin = Scripted([Throttled("slow down")])
    plugin.objects["a"] = b"1"
    assert bytes(asyncio.run(_retrying(plugin).read("a"))) == b"1"
    assert plugin.attempts == 2


@pytest.mark.parametrize(
    "error",
    [PermissionError("403"), FileNotFoundError("a"), ValueError("bad"), StorageError("mapped already")],
    ids=["permission", "missing", "value", "storage"],
)
def test_other_errors_propagate_at_once(error: BaseException) -> None:
    plugin = Scripted([error])
    with pytest.raises(type(error)):
        asyncio.run(_retrying(plugin).read("a"))
    assert plugin.attempts == 1


def test_giving_up_names_the_object_and_keeps_the_last_error() -> None:
    plugin = Scripted([TimeoutError(f"timeout #{n}") for n in range(1, 10)])
    with pytest.raises(RetriesExhaustedError, match=r"read scripted://root/data/x failed 3 time\(s\)") as info:
        asyncio.run(_retrying(plugin, max_attempts=3).read("data/x"))
    assert isinstance(info.value, SnapshotkitError)
    assert isinstance(info.value.__cause__, TimeoutError)
    assert str(info.value.__cause__) == "timeout #3"
    assert "storage_options={'retry'" in str(info.value)
    assert plugin.attempts == 3


def test_a_plugin_marks_its_own_errors_transient() -> None:
    class Busy(Exception):
        pass

    class Marking(Scripted):
        def is_transient(self, exc: BaseException) -> bool:
            return isinstance(exc, Busy) or super().is_transient(exc)

    plugin = Marking([Busy("try again")])
    asyncio.run(_retrying(plugin).write("a", b"x"))
    assert plugin.attempts == 2
    with pytest.raises(Busy):
        asyncio.run(_retrying(Scripted([Busy("not marked")])).write("a", b"x"))


def test_exclusive_write_whose_answer_was_lost_succeeds(caplog: pytest.LogCaptureFixture) -> None:
    plugin = Scripted(lose=("write_exclusive",))
    with caplog.at_level(logging.WARNING, logger="snapshotkit.storage"):
        asyncio.run(_retrying(plugin).write_exclusive(".snapshot_metadata", b"manifest of take 1"))
    assert plugin.objects == {".snapshot_metadata": b"manifest of take 1"}
    assert any("had written the object" in r.getMessage() for r in caplog.records)


def test_exclusive_write_refused_by_another_writers_object_stays_refused() -> None:
    # The first attempt fails before reaching the store, and meanwhile another take commits.
    plugin = Scripted([ConnectionResetError("reset")])
    plugin.objects[".snapshot_metadata"] = b"manifest of take 2"
    with pytest.raises(FileExistsError):
        asyncio.run(_retrying(plugin).write_exclusive(".snapshot_metadata", b"manifest of take 1"))
    assert plugin.objects == {".snapshot_metadata": b"manifest of take 2"}


def test_exclusive_write_refused_without_a_failed_attempt_is_not_read_back() -> None:
    plugin = Scripted()
    plugin.objects["m"] = b"same bytes"
    with pytest.raises(FileExistsError):  # even with equal bytes: nothing says this call wrote them
        asyncio.run(_retrying(plugin).write_exclusive("m", b"same bytes"))
    assert plugin.attempts == 1


def test_exclusive_write_that_outlasted_the_retries_is_checked_once_more() -> None:
    plugin = Scripted(lose=("write_exclusive",))
    retrying = _retrying(plugin, max_attempts=1)
    asyncio.run(retrying.write_exclusive("m", b"mine"))  # the one attempt took effect: success
    assert plugin.objects == {"m": b"mine"}
    with pytest.raises(RetriesExhaustedError):
        asyncio.run(_retrying(Scripted([TimeoutError("t")]), max_attempts=1).write_exclusive("m", b"mine"))


def test_delete_whose_answer_was_lost_succeeds() -> None:
    plugin = Scripted(lose=("delete",))
    plugin.objects["a"] = b"x"
    asyncio.run(_retrying(plugin).delete("a"))
    assert plugin.objects == {}
    with pytest.raises(FileNotFoundError):  # a missing object with no failed attempt is still missing
        asyncio.run(_retrying(plugin).delete("a"))


class RetriesItself(MemoryStoragePlugin):
    capabilities = Capabilities(listing=True, own_retries=True)


def test_every_opened_plugin_is_wrapped_once_unless_it_retries_itself(tmp_path: Path) -> None:
    register_storage_plugin("retries-itself", lambda root, options: RetriesItself(root))
    assert type(open_storage_plugin("retries-itself://x")) is RetriesItself
    opened = open_storage_plugin(str(tmp_path), {"retry": 2})
    assert isinstance(opened, RetryingStoragePlugin)
    assert isinstance(opened.plugin, FSStoragePlugin)
    assert opened.policy == RetryPolicy(max_attempts=2)
    assert opened.capabilities == FSStoragePlugin.capabilities
    # url_to_storage_plugin is unchanged: the plugin itself.
    assert type(url_to_storage_plugin(str(tmp_path))) is FSStoragePlugin


def test_the_retry_option_never_reaches_a_factory() -> None:
    seen: list[dict[str, Any]] = []

    def factory(root: str, options: Mapping[str, Any]) -> StoragePlugin:
        seen.append(dict(options))
        return MemoryStoragePlugin(root)

    register_storage_plugin("records-options", factory)
    open_storage_plugin("records-options://x", {"retry": {"max_attempts": 2}, "endpoint": "e"})
    url_to_storage_plugin("records-options://x", {"retry": 3, "endpoint": "e"})
    assert seen == [{"endpoint": "e"}, {"endpoint": "e"}]
    with pytest.raises(ConfigError, match="unknown retry option"):
        open_storage_plugin("records-options://x", {"retry": {"attempts": 2}})
