"""The hint cases of the conformance suite (``prefetch``).

Mixed into :class:`~snapshotkit.testing.StoragePluginConformance`, which supplies the harness;
every plugin runs them (the default ``prefetch`` does nothing, and passes).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, TypeVar

from snapshotkit.storage._base import ByteRange, StoragePlugin

T = TypeVar("T")


class HintCases:
    """Read-ahead hint test cases; the harness methods come from the conformance class."""

    if TYPE_CHECKING:

        def _run(self, root: str, scenario: Callable[[StoragePlugin], Awaitable[T]]) -> T: ...
        def _assert_stored(self, root: str, location: str, expected: bytes) -> None: ...
        def ground_truth_write(self, root: str, location: str, data: bytes) -> None: ...
        def ground_truth_read(self, root: str, location: str) -> bytes | None: ...

    def test_prefetch_is_a_hint_that_changes_nothing(self, root: str) -> None:
        payload = bytes((i * 31 + (i >> 8) * 7 + 17) % 251 for i in range(5000))
        self.ground_truth_write(root, "object.bin", payload)

        async def scenario(plugin: StoragePlugin) -> bytes | memoryview:
            await plugin.prefetch("object.bin", ByteRange(100, 4100))
            await plugin.prefetch("object.bin", ByteRange(0, 0))
            # a hint never raises: the reads that follow report a missing or short object
            await plugin.prefetch("missing.bin", ByteRange(0, 10))
            await plugin.prefetch("object.bin", ByteRange(4000, 9000))
            return await plugin.read("object.bin", ByteRange(100, 4100))

        assert bytes(self._run(root, scenario)) == payload[100:4100]
        self._assert_stored(root, "object.bin", payload)
        assert self.ground_truth_read(root, "missing.bin") is None
