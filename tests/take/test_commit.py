"""``snapshotkit._take.commit``: takes that fail half-way (storage errors, Ctrl-C, a raising
``state_dict()``) delete what they wrote and commit nothing.
"""

from __future__ import annotations

import asyncio
import errno
import signal
import threading
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import torch
from _snapshots import ExplodingState, Net, assert_nothing_committed, data_objects, files_of, take_basic

from snapshotkit import Snapshot, StateDict, errors
from snapshotkit.errors import SnapshotNotFoundError
from snapshotkit.storage import FSStoragePlugin, register_storage_plugin

pytestmark = pytest.mark.usefixtures("clean_env")

MIB = 1 << 20


class FaultyFS(FSStoragePlugin):
    """The fs plugin, except that the ``fail_at``-th data-object write (and every later one) fails.

    The failing write waits until every earlier write has completed, so exactly ``fail_at - 1``
    data objects are on disk when the take fails, whatever the I/O concurrency.
    """

    def __init__(self, root: str, fail_at: int, make_exc: Callable[[], BaseException]) -> None:
        super().__init__(root)
        self.fail_at = fail_at
        self.make_exc = make_exc
        self.started = 0
        self.completed: list[str] = []
        self._earlier_done: asyncio.Event | None = None

    async def write(self, location: str, data: Any) -> None:
        if not location.startswith("data/"):
            await super().write(location, data)
            return
        if self._earlier_done is None:
            self._earlier_done = asyncio.Event()
            if self.fail_at == 1:
                self._earlier_done.set()
        self.started += 1
        if self.started >= self.fail_at:
            await self._earlier_done.wait()
            raise self.make_exc()
        await super().write(location, data)
        self.completed.append(location)
        if len(self.completed) == self.fail_at - 1:
            self._earlier_done.set()


@pytest.fixture
def faulty_scheme() -> Iterator[Callable[[int, Callable[[], BaseException]], list[FaultyFS]]]:
    """Register ``faulty://``; calling the fixture sets which write fails and returns the plugins made."""
    from snapshotkit.storage import _registry

    made: list[FaultyFS] = []

    def configure(fail_at: int, make_exc: Callable[[], BaseException]) -> list[FaultyFS]:
        def factory(root: str, storage_options: Mapping[str, Any]) -> FaultyFS:
            plugin = FaultyFS(root, fail_at, make_exc)
            made.append(plugin)
            return plugin

        register_storage_plugin("faulty", factory)
        return made

    yield configure
    _registry._registered.pop("faulty", None)


def big_app_state(count: int = 6) -> dict[str, Any]:
    """``count`` tensors of 1 MiB each: with 1 MiB data objects, one data object per tensor."""
    return {
        "model": Net(),
        "extras": StateDict({f"t{i}": torch.full((MIB // 4,), float(i)) for i in range(count)}),
    }


@pytest.mark.parametrize("io_concurrency", ["1", "4"])
@pytest.mark.parametrize("fail_at", [1, 3, 6])
def test_take_failing_half_way_deletes_what_it_wrote(
    tmp_path: Path,
    clean_env: pytest.MonkeyPatch,
    faulty_scheme: Callable[[int, Callable[[], BaseException]], list[FaultyFS]],
    fail_at: int,
    io_concurrency: str,
) -> None:
    clean_env.setenv("SNAPSHOTKIT_DATA_OBJECT_BYTES", str(MIB))
    clean_env.setenv("SNAPSHOTKIT_IO_CONCURRENCY", io_concurrency)
    plugins = faulty_scheme(fail_at, lambda: OSError(errno.EIO, "injected write failure"))
    path = tmp_path / "snap"

    with pytest.raises(OSError, match="injected write failure") as info:
        Snapshot.take(f"faulty://{path}", big_app_state())
    assert isinstance(info.value, errors.StorageError)
    assert str(path) in str(info.value)

    writer = next(p for p in plugins if p.started)
    assert len(writer.completed) == fail_at - 1  # the failure really came half-way
    assert_nothing_committed(path)
    with pytest.raises(SnapshotNotFoundError):
        _ = Snapshot(f"faulty://{path}").metadata


def test_take_failing_half_way_into_existing_directory_keeps_other_files(
    tmp_path: Path,
    clean_env: pytest.MonkeyPatch,
    faulty_scheme: Callable[[int, Callable[[], BaseException]], list[FaultyFS]],
) -> None:
    clean_env.setenv("SNAPSHOTKIT_DATA_OBJECT_BYTES", str(MIB))
    faulty_scheme(3, lambda: OSError(errno.ENOSPC, "injected: no space left"))
    path = tmp_path / "snap"
    path.mkdir()
    (path / "README").write_text("the user's file")

    with pytest.raises(OSError, match="no space left"):
        Snapshot.take(f"faulty://{path}", big_app_state())
    assert files_of(path) == {"README": b"the user's file"}


class StallingFS(FSStoragePlugin):
    """The fs plugin, except that the ``stall_at``-th data-object write waits until it is cancelled.

    ``stalled`` is set when that write starts.
    """

    def __init__(self, root: str, stall_at: int, stalled: threading.Event) -> None:
        super().__init__(root)
        self.stall_at = stall_at
        self.started = 0
        self.stalled = stalled

    async def write(self, location: str, data: Any) -> None:
        if location.startswith("data/"):
            self.started += 1
            if self.started == self.stall_at:
                self.stalled.set()
                await asyncio.Event().wait()  # until cancelled
        await super().write(location, data)


def test_ctrl_c_during_take_deletes_what_it_wrote_before_raising(tmp_path: Path, clean_env: pytest.MonkeyPatch) -> None:
    from snapshotkit.storage import _registry

    clean_env.setenv("SNAPSHOTKIT_DATA_OBJECT_BYTES", str(MIB))
    clean_env.setenv("SNAPSHOTKIT_IO_CONCURRENCY", "1")
    stalled = threading.Event()
    plugins: list[StallingFS] = []

    def factory(root: str, storage_options: Mapping[str, Any]) -> StallingFS:
        plugins.append(StallingFS(root, 3, stalled))
        return plugins[-1]

    register_storage_plugin("stalling", factory)
    armed = True
    delivered = threading.Event()
    missed: list[str] = []

    def press_ctrl_c() -> None:
        stalled.wait()
        if armed:
            signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)  # type: ignore[arg-type]
            # CPython can leave a SIGINT pending while the main thread blocks on a lock; the take's
            # waits end within a slice so that it is seen (snapshotkit._runtime.interrupt). If it
            # is not, press again rather than hang, and fail.
            if not delivered.wait(10):
                missed.append("the take kept waiting after Ctrl-C")
                signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)  # type: ignore[arg-type]

    def on_sigint(signum: int, frame: object) -> None:
        if not delivered.is_set():
            delivered.set()
            raise KeyboardInterrupt

    interrupter = threading.Thread(target=press_ctrl_c)
    # A process started in the background by a non-interactive shell ignores SIGINT: install a
    # handler, or the interrupt never arrives.
    previous_sigint = signal.signal(signal.SIGINT, on_sigint)
    interrupter.start()
    path = tmp_path / "snap"
    try:
        with pytest.raises(KeyboardInterrupt):
            Snapshot.take(f"stalling://{path}", big_app_state())
        # Looked at the moment the interrupt arrives: the take must have cleaned up first.
        left_at_raise = data_objects(path)
    finally:
        armed = False
        stalled.set()
        interrupter.join()
        signal.signal(signal.SIGINT, previous_sigint)
        _registry._registered.pop("stalling", None)

    assert missed == []
    assert max(p.started for p in plugins) == 3  # two data objects were written, the third stalled
    assert left_at_raise == [], "Snapshot.take re-raised KeyboardInterrupt before deleting what it wrote"
    assert_nothing_committed(path)


@pytest.mark.parametrize(
    "exc",
    [KeyboardInterrupt(), RuntimeError("state_dict exploded")],
    ids=["keyboard-interrupt", "runtime-error"],
)
def test_take_whose_state_dict_raises_writes_nothing(tmp_path: Path, exc: BaseException) -> None:
    path = tmp_path / "snap"
    app_state = {**big_app_state(2), "zz_last": ExplodingState(exc)}
    with pytest.raises(type(exc)):
        Snapshot.take(str(path), app_state)
    assert not path.exists()
    assert_nothing_committed(path)


def test_snapshotkit_still_works_after_failed_takes(tmp_path: Path) -> None:
    # The failures above must not leave the shared event loop broken.
    path = tmp_path / "snap"
    take_basic(path)
    assert Snapshot(str(path)).read_object("extras/step") == 3


class UndeletableFS(FaultyFS):
    """:class:`FaultyFS` whose deletions fail too (a store that refuses DELETE)."""

    async def delete(self, location: str) -> None:
        raise PermissionError(errno.EACCES, f"injected: deleting {location} refused")

    async def discard(self, locations: Any) -> None:
        for location in locations:
            await self.delete(location)


def test_a_failed_take_whose_data_cannot_be_deleted_says_so(
    tmp_path: Path, clean_env: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 24, item 7: when deleting a failed take's data objects failed, nothing was logged, so
    orphans on an object store went unnoticed."""
    from snapshotkit.storage import _registry

    clean_env.setenv("SNAPSHOTKIT_DATA_OBJECT_BYTES", str(MIB))
    clean_env.setenv("SNAPSHOTKIT_IO_CONCURRENCY", "1")
    made: list[UndeletableFS] = []

    def factory(root: str, storage_options: Mapping[str, Any]) -> UndeletableFS:
        made.append(UndeletableFS(root, 3, lambda: OSError(errno.EIO, "injected write failure")))
        return made[-1]

    register_storage_plugin("undeletable", factory)
    path = tmp_path / "snap"
    try:
        with caplog.at_level("WARNING", logger="snapshotkit.take"), pytest.raises(errors.StorageError):
            Snapshot.take(f"undeletable://{path}", big_app_state())
    finally:
        _registry._registered.pop("undeletable", None)
    left = data_objects(path)
    assert len(left) == 2  # the two written before the failure, which could not be deleted
    warnings = [r.getMessage() for r in caplog.records if "could not delete" in r.getMessage()]
    assert len(warnings) == 1, caplog.text
    for name in left:
        assert name in warnings[0]
    assert "PermissionError" in warnings[0] and "snapshotkit cleanup" in warnings[0]
    assert not (path / ".snapshot_metadata").exists()
