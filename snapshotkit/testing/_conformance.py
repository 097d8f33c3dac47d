"""The storage plugin conformance suite: one test class every storage plugin must pass.

A plugin author subclasses :class:`StoragePluginConformance` in a pytest module, names the
subclass ``Test*`` and supplies a factory, a URI, a fresh root per test and two ground-truth
helpers that reach the backend without going through the plugin. ``docs/plugins.md`` walks
through a complete subclass; ``plugins/snapshotkit-sqlite`` is a working one.

Every case is a plain synchronous test method that runs one ``async`` scenario with
:func:`asyncio.run`, so the suite needs pytest but no async pytest plugin.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

import pytest

from snapshotkit._format.entries import METADATA_FILENAME
from snapshotkit.storage._base import ByteRange, StoragePlugin
from snapshotkit.testing._conformance_hints import HintCases
from snapshotkit.testing._conformance_listing import ListingCases

if TYPE_CHECKING:
    from pathlib import Path

T = TypeVar("T")


def _pattern(size_bytes: int, seed: int = 0) -> bytes:
    """Deterministic bytes with no short period, so an offset error changes what is read."""
    return bytes((i * 31 + (i >> 8) * 7 + seed) % 251 for i in range(size_bytes))


class StoragePluginConformance(ListingCases, HintCases):
    """Test base class that checks a :class:`~snapshotkit.storage.StoragePlugin` keeps the SPI contract.

    Subclass it in a test module under a ``Test*`` name; pytest then collects every ``test_*``
    method below against your plugin. Each test gets a fresh, empty root from the :meth:`root`
    fixture and creates its plugin with :meth:`make_plugin` inside the event loop that runs the
    case, so plugins that bind to a loop (aiohttp sessions, fsspec async filesystems) work.
    The plugin is always closed at the end of the case.

    What subclasses supply:
        * :meth:`root`: a pytest fixture returning a fresh, unique root per test. The default is
          a directory below ``tmp_path``; override it (same name, ``@pytest.fixture``) for
          backends whose roots are bucket prefixes or names, and clean up after yielding.
        * :meth:`make_plugin`: ``async`` factory of a plugin serving that root.
        * :meth:`uri`: the snapshot URI of that root, as users pass it to
          :class:`~snapshotkit.Snapshot` (the plugin must be reachable through the registry).
        * :meth:`ground_truth_write` / :meth:`ground_truth_read`: put and get an object by
          going straight to the backend, never through the plugin, so a plugin bug cannot
          hide itself by being symmetric.

    To mark a case your backend cannot pass yet, override the method in the subclass, decorate
    it with ``@pytest.mark.xfail(strict=True, reason=...)`` and call ``super()``.

    Attributes:
        large_object_bytes: size of the large-object round trip; raise it above your backend's
            multipart or chunking threshold so that path is exercised.
        concurrent_writes: how many writes the concurrency case issues at once.
        concurrent_reads: how many ranged reads the concurrency case issues at once.
    """

    large_object_bytes: ClassVar[int] = 24 * 1024 * 1024
    concurrent_writes: ClassVar[int] = 64
    concurrent_reads: ClassVar[int] = 32

    # ----------------------------------------------------------------- what subclasses supply

    @pytest.fixture
    def root(self, tmp_path: Path) -> str:
        """A fresh, unique, empty root for one test (default: a directory below ``tmp_path``)."""
        return (tmp_path / "conformance-root").as_posix()

    async def make_plugin(self, root: str) -> StoragePlugin:
        """Return a plugin serving ``root``; called inside the event loop that runs the case."""
        raise NotImplementedError(f"{type(self).__name__} must implement async make_plugin(root)")

    def uri(self, root: str) -> str:
        """Return the snapshot URI (``scheme://...``) whose plugin serves ``root``."""
        raise NotImplementedError(f"{type(self).__name__} must implement uri(root)")

    def incremental_uris(self, root: str) -> tuple[str, str]:
        """Two snapshot URIs in one folder, cleaned up with ``root``: a base and an incremental
        snapshot that references it. Default: ``<uri(root)>/base`` and ``<uri(root)>/incremental``;
        override it where a snapshot root cannot hold others (a database file)."""
        return f"{self.uri(root)}/base", f"{self.uri(root)}/incremental"

    def ground_truth_write(self, root: str, location: str, data: bytes) -> None:
        """Store ``data`` as ``location`` below ``root`` without using the plugin."""
        raise NotImplementedError(f"{type(self).__name__} must implement ground_truth_write(root, location, data)")

    def ground_truth_read(self, root: str, location: str) -> bytes | None:
        """Return the bytes of ``location`` below ``root`` without using the plugin; None if missing."""
        raise NotImplementedError(f"{type(self).__name__} must implement ground_truth_read(root, location)")

    # ----------------------------------------------------------------- harness

    @contextlib.asynccontextmanager
    async def _open(self, root: str) -> AsyncIterator[StoragePlugin]:
        plugin = await self.make_plugin(root)
        try:
            yield plugin
        finally:
            await plugin.close()

    def _run(self, root: str, scenario: Callable[[StoragePlugin], Awaitable[T]]) -> T:
        """Run ``scenario(plugin)`` on a fresh event loop with a plugin that is closed afterwards."""

        async def main() -> T:
            async with self._open(root) as plugin:
                return await scenario(plugin)

        return asyncio.run(main())

    def _assert_stored(self, root: str, location: str, expected: bytes) -> None:
        actual = self.ground_truth_read(root, location)
        assert actual is not None, f"{location}: the plugin's write left no object in the backend"
        assert len(actual) == len(expected), f"{location}: stored {len(actual)} bytes, expected {len(expected)}"
        assert actual == expected, f"{location}: stored bytes differ from what was written"

    # ----------------------------------------------------------------- write

    @pytest.mark.parametrize(
        "kind", ["bytes", "bytearray", "memoryview", "memoryview_slice", "empty", "buffer_list", "empty_list"]
    )
    def test_write_then_ground_truth_read(self, root: str, kind: str) -> None:
        payload = _pattern(4099, seed=3)
        data: Any
        expected = payload
        if kind == "bytes":
            data = payload
        elif kind == "bytearray":
            data = bytearray(payload)
        elif kind == "memoryview":
            data = memoryview(payload)
        elif kind == "memoryview_slice":
            data = memoryview(payload)[100:1100]
            expected = payload[100:1100]
        elif kind == "empty":
            data = expected = b""
        elif kind == "buffer_list":
            data = [payload[:10], bytearray(payload[10:2000]), b"", memoryview(payload)[2000:]]
        else:
            data, expected = [], b""

        async def scenario(plugin: StoragePlugin) -> None:
            await plugin.write("object.bin", data)

        self._run(root, scenario)
        self._assert_stored(root, "object.bin", expected)

    def test_write_non_byte_memoryview(self, root: str) -> None:
        numpy = pytest.importorskip("numpy")
        array = numpy.arange(1000, dtype=numpy.float32).reshape(10, 100) * numpy.float32(1.5)
        view = memoryview(array)
        assert view.format != "B"

        async def scenario(plugin: StoragePlugin) -> None:
            await plugin.write("floats.bin", view)
            await plugin.write("floats_twice.bin", [view, memoryview(array[0])])

        self._run(root, scenario)
        self._assert_stored(root, "floats.bin", array.tobytes())
        self._assert_stored(root, "floats_twice.bin", array.tobytes() + array[0].tobytes())

    def test_write_replaces_existing_object(self, root: str) -> None:
        self.ground_truth_write(root, "object.bin", _pattern(5000, seed=1))

        async def scenario(plugin: StoragePlugin) -> None:
            await plugin.write("object.bin", b"longer than before" * 10)
            await plugin.write("object.bin", b"short")

        self._run(root, scenario)
        self._assert_stored(root, "object.bin", b"short")

    def test_nested_locations(self, root: str) -> None:
        async def scenario(plugin: StoragePlugin) -> tuple[bytes, bytes]:
            await plugin.write("a/b/c/d.bin", b"deep")
            await plugin.write("a/b/sibling.bin", b"shallower")
            return bytes(await plugin.read("a/b/c/d.bin")), bytes(await plugin.read("a/b/sibling.bin"))

        assert self._run(root, scenario) == (b"deep", b"shallower")
        self._assert_stored(root, "a/b/c/d.bin", b"deep")
        self._assert_stored(root, "a/b/sibling.bin", b"shallower")

    # ----------------------------------------------------------------- read

    def test_ground_truth_write_then_read(self, root: str) -> None:
        payload = _pattern(10_007, seed=5)
        self.ground_truth_write(root, "object.bin", payload)
        self.ground_truth_write(root, "x/y/nested.bin", b"nested")
        self.ground_truth_write(root, "empty.bin", b"")

        async def scenario(plugin: StoragePlugin) -> list[bytes]:
            return [bytes(await plugin.read(name)) for name in ("object.bin", "x/y/nested.bin", "empty.bin")]

        assert self._run(root, scenario) == [payload, b"nested", b""]

    @pytest.mark.parametrize(
        ("start", "end"),
        [(0, 0), (500, 500), (1000, 1000), (0, 1), (999, 1000), (0, 1000), (123, 877)],
        ids=["empty_at_start", "empty_in_middle", "empty_at_end", "first_byte", "last_byte", "whole", "middle"],
    )
    def test_read_byte_range(self, root: str, start: int, end: int) -> None:
        payload = _pattern(1000, seed=7)
        self.ground_truth_write(root, "object.bin", payload)

        async def scenario(plugin: StoragePlugin) -> bytes:
            return bytes(await plugin.read("object.bin", ByteRange(start, end)))

        assert self._run(root, scenario) == payload[start:end]

    def test_read_into_several_buffers(self, root: str) -> None:
        numpy = pytest.importorskip("numpy")
        payload = _pattern(4096, seed=11)
        self.ground_truth_write(root, "object.bin", payload)
        floats = numpy.zeros(16, dtype=numpy.float32)
        first, second, empty, third = bytearray(7), bytearray(1000), bytearray(0), bytearray(33)

        async def scenario(plugin: StoragePlugin) -> None:
            buffers = [memoryview(first), memoryview(second), memoryview(empty), memoryview(floats), memoryview(third)]
            await plugin.read_into("object.bin", 100, buffers)

        self._run(root, scenario)
        expected = payload[100 : 100 + 7 + 1000 + 64 + 33]
        assert bytes(first) == expected[:7]
        assert bytes(second) == expected[7:1007]
        assert floats.tobytes() == expected[1007:1071]
        assert bytes(third) == expected[1071:]

    def test_read_into_up_to_the_last_byte(self, root: str) -> None:
        payload = _pattern(300, seed=13)
        self.ground_truth_write(root, "object.bin", payload)
        head, tail = bytearray(100), bytearray(100)

        async def scenario(plugin: StoragePlugin) -> None:
            await plugin.read_into("object.bin", 100, [memoryview(head), memoryview(tail)])

        self._run(root, scenario)
        assert bytes(head + tail) == payload[100:]

    @pytest.mark.parametrize(
        ("start", "end"),
        [(999, 1001), (0, 1001), (1000, 1001), (2000, 2010)],
        ids=["straddling", "whole_plus_one", "at_end", "beyond"],
    )
    def test_range_past_the_end_raises_eof(self, root: str, start: int, end: int) -> None:
        self.ground_truth_write(root, "object.bin", _pattern(1000))

        async def read(plugin: StoragePlugin) -> None:
            await plugin.read("object.bin", ByteRange(start, end))

        async def read_into(plugin: StoragePlugin) -> None:
            await plugin.read_into("object.bin", start, [memoryview(bytearray(end - start))])

        with pytest.raises(EOFError):
            self._run(root, read)
        with pytest.raises(EOFError):
            self._run(root, read_into)

    # ----------------------------------------------------------------- missing objects

    @pytest.mark.parametrize(
        "location", ["missing.bin", "no/such/dir/missing.bin"], ids=["top_level", "in_missing_directory"]
    )
    def test_missing_object(self, root: str, location: str) -> None:
        self.ground_truth_write(root, "present.bin", b"present")
        self._check_missing(root, location)

    def test_missing_object_below_an_object(self, root: str) -> None:
        # Object stores have no directories: "file.bin/child" is simply absent.
        self.ground_truth_write(root, "file.bin", b"an object, not a directory")
        self._check_missing(root, "file.bin/child")

    def test_prefix_of_objects_is_not_an_object(self, root: str) -> None:
        # Object stores have no directories: "dir" is absent even though "dir/object.bin" exists.
        self.ground_truth_write(root, "dir/object.bin", b"inside")
        self._check_missing(root, "dir")
        assert self.ground_truth_read(root, "dir/object.bin") == b"inside"

    def _check_missing(self, root: str, location: str) -> None:
        async def exists(plugin: StoragePlugin) -> bool:
            return await plugin.exists(location)

        async def read(plugin: StoragePlugin) -> None:
            await plugin.read(location)

        async def read_range(plugin: StoragePlugin) -> None:
            await plugin.read(location, ByteRange(0, 1))

        async def read_into(plugin: StoragePlugin) -> None:
            await plugin.read_into(location, 0, [memoryview(bytearray(1))])

        async def delete(plugin: StoragePlugin) -> None:
            await plugin.delete(location)

        assert self._run(root, exists) is False, f"exists({location!r}) is True for a missing object"
        # Every operation is tried, so one failure reports them all.
        wrong: list[str] = []
        for operation in (read, read_range, read_into, delete):
            try:
                self._run(root, operation)
            except FileNotFoundError:
                continue
            except Exception as exc:
                wrong.append(f"{operation.__name__} raised {type(exc).__name__}: {exc}")
            else:
                wrong.append(f"{operation.__name__} returned normally")
        assert not wrong, f"missing object {location!r} must raise FileNotFoundError; instead " + "; ".join(wrong)

    def test_exists_and_delete(self, root: str) -> None:
        self.ground_truth_write(root, "object.bin", b"x")
        self.ground_truth_write(root, "empty.bin", b"")

        async def scenario(plugin: StoragePlugin) -> tuple[bool, bool, bool]:
            before = await plugin.exists("object.bin")
            empty = await plugin.exists("empty.bin")
            await plugin.delete("object.bin")
            return before, empty, await plugin.exists("object.bin")

        assert self._run(root, scenario) == (True, True, False)
        assert self.ground_truth_read(root, "object.bin") is None
        assert self.ground_truth_read(root, "empty.bin") == b""

    # ----------------------------------------------------------------- write_exclusive

    def test_write_exclusive_refuses_existing_object(self, root: str) -> None:
        self.ground_truth_write(root, "COMMIT", b"first")

        async def scenario(plugin: StoragePlugin) -> None:
            await plugin.write_exclusive("COMMIT", b"second")

        with pytest.raises(FileExistsError):
            self._run(root, scenario)
        assert self.ground_truth_read(root, "COMMIT") == b"first"

    def test_write_exclusive_writes_new_object(self, root: str) -> None:
        async def scenario(plugin: StoragePlugin) -> None:
            await plugin.write_exclusive("COMMIT", [b"com", memoryview(b"mitted")])
            await plugin.write_exclusive("nested/dir/COMMIT", b"nested")

        self._run(root, scenario)
        self._assert_stored(root, "COMMIT", b"committed")
        self._assert_stored(root, "nested/dir/COMMIT", b"nested")

    def test_write_exclusive_after_plugin_write_refuses(self, root: str) -> None:
        async def scenario(plugin: StoragePlugin) -> None:
            await plugin.write("COMMIT", b"first")
            with pytest.raises(FileExistsError):
                await plugin.write_exclusive("COMMIT", b"second")

        self._run(root, scenario)
        assert self.ground_truth_read(root, "COMMIT") == b"first"

    # ----------------------------------------------------------------- replace

    def test_replace_writes_over_an_object_and_a_new_one(self, root: str) -> None:
        self.ground_truth_write(root, "COMMIT", b"first")

        async def scenario(plugin: StoragePlugin) -> None:
            await plugin.replace("COMMIT", [b"sec", memoryview(b"ond")])
            await plugin.replace("nested/dir/COMMIT", b"new")

        self._run(root, scenario)
        self._assert_stored(root, "COMMIT", b"second")
        self._assert_stored(root, "nested/dir/COMMIT", b"new")

    # ----------------------------------------------------------------- size and concurrency

    def test_large_object_round_trip(self, root: str) -> None:
        size_bytes = self.large_object_bytes
        payload = os.urandom(size_bytes)
        half = size_bytes // 2

        async def scenario(plugin: StoragePlugin) -> tuple[bytes, bytes, bytes]:
            # Two buffers, so multi-buffer writes cross the same thresholds as single ones.
            await plugin.write("large.bin", [memoryview(payload)[:half], memoryview(payload)[half:]])
            whole = bytes(await plugin.read("large.bin"))
            tail = bytes(await plugin.read("large.bin", ByteRange(size_bytes - 4096, size_bytes)))
            into = bytearray(size_bytes - 1)
            await plugin.read_into("large.bin", 1, [memoryview(into)])
            return whole, tail, bytes(into)

        whole, tail, into = self._run(root, scenario)
        assert whole == payload
        assert tail == payload[-4096:]
        assert into == payload[1:]
        self._assert_stored(root, "large.bin", payload)

    def test_concurrent_writes(self, root: str) -> None:
        count = self.concurrent_writes
        payloads = {f"concurrent/{i:03d}.bin": _pattern(1000 + 37 * i, seed=i) for i in range(count)}

        async def scenario(plugin: StoragePlugin) -> None:
            await asyncio.gather(*(plugin.write(location, data) for location, data in payloads.items()))

        self._run(root, scenario)
        for location, data in payloads.items():
            self._assert_stored(root, location, data)

    def test_concurrent_ranged_reads(self, root: str) -> None:
        payload = _pattern(64 * 1024, seed=17)
        self.ground_truth_write(root, "object.bin", payload)
        step = len(payload) // self.concurrent_reads
        ranges = [ByteRange(i * step + i, (i + 1) * step) for i in range(self.concurrent_reads)]

        async def scenario(plugin: StoragePlugin) -> list[bytes]:
            results: Sequence[bytes | memoryview] = await asyncio.gather(
                *(plugin.read("object.bin", r) for r in ranges)
            )
            return [bytes(result) for result in results]

        got = self._run(root, scenario)
        assert got == [payload[r.start : r.end] for r in ranges]

    # ----------------------------------------------------------------- lifecycle

    def test_close_is_idempotent(self, root: str) -> None:
        async def scenario() -> None:
            plugin = await self.make_plugin(root)
            await plugin.write("object.bin", b"x")
            await plugin.close()
            await plugin.close()

        asyncio.run(scenario())
        self._assert_stored(root, "object.bin", b"x")

    def test_close_unused_plugin(self, root: str) -> None:
        async def scenario() -> None:
            plugin = await self.make_plugin(root)
            await plugin.close()
            await plugin.close()

        asyncio.run(scenario())

    # ----------------------------------------------------------------- end to end

    def test_snapshot_take_restore_read_object(self, root: str) -> None:
        torch = pytest.importorskip("torch")
        from snapshotkit import Snapshot, StateDict

        uri = self.uri(root)
        weight = torch.randn(64, 32, generator=torch.Generator().manual_seed(0))
        state = StateDict(weight=weight.clone(), step=7, ints=torch.arange(1000, dtype=torch.int64))
        Snapshot.take(uri, {"state": state})

        target = StateDict(weight=torch.zeros(64, 32), step=0, ints=torch.zeros(1000, dtype=torch.int64))
        Snapshot(uri).restore({"state": target})
        assert torch.equal(target["weight"], weight)
        assert target["step"] == 7
        assert torch.equal(target["ints"], torch.arange(1000, dtype=torch.int64))
        assert torch.equal(Snapshot(uri).read_object("state/weight"), weight)
        assert Snapshot(uri).read_object("state/step") == 7

        # The snapshot went through the plugin's root: its manifest is an object there.
        assert self.ground_truth_read(root, METADATA_FILENAME) is not None

    def test_incremental_snapshot_beside_its_base(self, root: str) -> None:
        torch = pytest.importorskip("torch")
        from snapshotkit import Snapshot, StateDict
        from snapshotkit._format.entries import pieces_of

        base_uri, uri = self.incremental_uris(root)
        frozen = torch.randn(256, 256, generator=torch.Generator().manual_seed(1))  # 256 KiB: referenced
        state = StateDict(frozen=frozen.clone(), step=1, small=torch.zeros(8))
        Snapshot.take(base_uri, {"state": state})
        state["step"], state["small"] = 2, torch.ones(8)
        snapshot = Snapshot.take(uri, {"state": state}, base=base_uri)

        (piece,) = pieces_of(snapshot.metadata.manifest["0/state/frozen"])
        assert piece.base is not None
        assert list(snapshot.metadata.bases) == [piece.base]
        target = StateDict(frozen=torch.zeros(256, 256), step=0, small=torch.zeros(8))
        Snapshot(uri).restore({"state": target})
        assert torch.equal(target["frozen"], frozen)
        assert target["step"] == 2
        assert torch.equal(target["small"], torch.ones(8))
        assert torch.equal(Snapshot(uri).read_object("state/frozen"), frozen)

    def test_a_process_local_store_is_refused_by_the_process_executor(self, root: str) -> None:
        """A plugin whose objects live in one process's memory declares ``capabilities.process_local``;
        ``async_take(executor="process")`` (a checkpoint daemon, another process) then refuses it
        before anything is written. A plugin that does not declare it is accepted by that check
        (its objects must then be reachable from the daemon's process)."""
        from snapshotkit._take.prepare import refuse_process_local

        async def local(plugin: StoragePlugin) -> bool:
            return plugin.capabilities.process_local

        declared = self._run(root, local)
        assert isinstance(declared, bool)
        if not declared:
            refuse_process_local(self.uri(root), {}, caller='async_take(executor="process")')
            return
        torch = pytest.importorskip("torch")
        from snapshotkit import Snapshot, StateDict
        from snapshotkit.errors import ConfigError

        state: dict[str, Any] = {"state": StateDict(x=torch.ones(8))}
        with pytest.raises(ConfigError, match='executor="thread"'):
            Snapshot.async_take(self.uri(root), state, executor="process")
        assert self.ground_truth_read(root, METADATA_FILENAME) is None
        Snapshot.async_take(self.uri(root), state, executor="thread").wait()
        assert self.ground_truth_read(root, METADATA_FILENAME) is not None
