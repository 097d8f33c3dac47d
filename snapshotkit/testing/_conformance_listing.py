"""The listing cases of the conformance suite (``list``, ``list_dirs``, ``delete_prefix``).

Mixed into :class:`~snapshotkit.testing.StoragePluginConformance`, which supplies the harness;
they run only for plugins that declare ``capabilities.listing``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, TypeVar

import pytest

from snapshotkit.storage._base import StoragePlugin

T = TypeVar("T")


class ListingCases:
    """Listing test cases; the harness methods come from the conformance class."""

    if TYPE_CHECKING:

        def _run(self, root: str, scenario: Callable[[StoragePlugin], Awaitable[T]]) -> T: ...
        def ground_truth_write(self, root: str, location: str, data: bytes) -> None: ...
        def ground_truth_read(self, root: str, location: str) -> bytes | None: ...

    def _require_listing(self, root: str) -> None:
        async def capable(plugin: StoragePlugin) -> bool:
            return plugin.capabilities.listing

        if not self._run(root, capable):
            pytest.skip("plugin does not declare capabilities.listing")

    def test_list_is_sorted_and_filtered_by_prefix(self, root: str) -> None:
        self._require_listing(root)
        locations = ["run/b/2.bin", "run/a.bin", "run/b/1.bin", "runner.bin", "other/x.bin", "z.bin"]
        for location in locations:
            self.ground_truth_write(root, location, location.encode())

        async def scenario(plugin: StoragePlugin) -> tuple[list[str], list[str], list[str], list[str]]:
            return (
                await plugin.list(""),
                await plugin.list("run/"),
                await plugin.list("run/b/"),
                await plugin.list("nothing/"),
            )

        everything, run, run_b, nothing = self._run(root, scenario)
        assert everything == sorted(locations)
        assert run == ["run/a.bin", "run/b/1.bin", "run/b/2.bin"]
        assert run_b == ["run/b/1.bin", "run/b/2.bin"]
        assert nothing == []

    def test_list_empty_root(self, root: str) -> None:
        self._require_listing(root)

        async def scenario(plugin: StoragePlugin) -> list[str]:
            return await plugin.list("")

        assert self._run(root, scenario) == []

    def test_list_sees_plugin_writes(self, root: str) -> None:
        self._require_listing(root)

        async def scenario(plugin: StoragePlugin) -> list[str]:
            await plugin.write("b/2.bin", b"2")
            await plugin.write("a.bin", b"1")
            await plugin.write_exclusive("COMMIT", b"c")
            return await plugin.list()

        assert self._run(root, scenario) == ["COMMIT", "a.bin", "b/2.bin"]

    def test_list_dirs_names_the_directories_directly_below_a_prefix(self, root: str) -> None:
        self._require_listing(root)
        for location in ["step_1/data/0.bin", "step_1/meta", "step_2/x", "notes.txt", "a/b/c/d.bin"]:
            self.ground_truth_write(root, location, b"x")

        async def scenario(plugin: StoragePlugin) -> tuple[list[str], list[str], list[str], list[str]]:
            return (
                await plugin.list_dirs(""),
                await plugin.list_dirs("step_1/"),
                await plugin.list_dirs("a/b/"),
                await plugin.list_dirs("nothing/"),
            )

        top, step_1, a_b, nothing = self._run(root, scenario)
        assert top == ["a", "step_1", "step_2"]
        assert step_1 == ["step_1/data"]
        assert a_b == ["a/b/c"]
        assert nothing == []

    def test_delete_prefix(self, root: str) -> None:
        self._require_listing(root)
        for location in ["step/0.bin", "step/deep/1.bin", "keep/0.bin", "stepper.bin"]:
            self.ground_truth_write(root, location, b"data")

        async def scenario(plugin: StoragePlugin) -> tuple[list[str], list[str]]:
            await plugin.delete_prefix("step/")
            await plugin.delete_prefix("nothing-here/")
            return await plugin.list("step/"), await plugin.list()

        under_prefix, remaining = self._run(root, scenario)
        assert under_prefix == []
        assert remaining == ["keep/0.bin", "stepper.bin"]
        assert self.ground_truth_read(root, "step/0.bin") is None
        assert self.ground_truth_read(root, "step/deep/1.bin") is None
        assert self.ground_truth_read(root, "keep/0.bin") == b"data"
