"""The one retry layer: every plugin snapshotkit opens is wrapped in :class:`RetryingStoragePlugin`.

Each operation of the wrapped plugin runs under the :class:`~snapshotkit.storage.RetryPolicy` of
the ``retry`` storage option: an attempt that fails with an error the plugin calls transient
(:meth:`~snapshotkit.storage.StoragePlugin.is_transient`) is retried after a backoff, logged at
WARNING on ``snapshotkit.storage``; anything else propagates at once, unchanged. A plugin that
retries its own requests (``capabilities.own_retries``) is not wrapped, so attempts never
multiply.

Which operations are safe to send again, and why:

* ``read``, ``read_into``, ``exists``, ``list``: they change nothing.
* ``write``: it replaces the whole object, so a second attempt leaves the same object.
* ``delete``: a ``FileNotFoundError`` on a retry, after an attempt whose answer was lost, means
  the object is gone as asked: success. ``discard`` and ``delete_prefix`` skip missing objects.
* ``write_exclusive`` (the commit marker): a retry after an attempt whose answer was lost is
  refused by the object that attempt wrote. The layer then reads the object back, and only if
  it holds exactly this call's bytes is the write a success (snapshotkit's exclusive payloads
  are unique: a manifest names its take); otherwise ``FileExistsError`` stands. The same check
  runs once more when the retries are exhausted, since any attempt may have taken effect.
* ``close`` is never retried.
"""

from __future__ import annotations

import builtins
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, TypeVar

from snapshotkit.errors import RetriesExhaustedError
from snapshotkit.storage._base import ByteRange, StoragePlugin, as_buffers
from snapshotkit.storage._retry import RetryPolicy, logger, retry_async

if TYPE_CHECKING:
    from typing_extensions import Buffer

T = TypeVar("T")


class RetryingStoragePlugin(StoragePlugin):
    """``plugin`` with each operation retried under ``policy`` on transient failures.

    Args:
        plugin: the plugin to wrap; it is closed with the wrapper.
        policy: how hard to retry.
        where: the snapshot URI, to name the objects in logs and errors.
    """

    def __init__(self, plugin: StoragePlugin, policy: RetryPolicy, where: str = "") -> None:
        self.plugin = plugin
        self.policy = policy
        self.where = where.rstrip("/")
        self.capabilities = plugin.capabilities

    def __repr__(self) -> str:
        return f"RetryingStoragePlugin({self.plugin!r}, {self.policy!r})"

    def _describe(self, operation: str, location: str) -> str:
        return f"{operation} {self.where}/{location}" if self.where else f"{operation} {location}"

    def is_transient(self, exc: BaseException) -> bool:
        return self.plugin.is_transient(exc)

    async def _retry(
        self,
        operation: str,
        location: str,
        function: Callable[[], Awaitable[T]],
        on_retry: Callable[[BaseException], None] | None = None,
    ) -> T:
        return await retry_async(
            function,
            describe=self._describe(operation, location),
            policy=self.policy,
            is_transient=self.plugin.is_transient,
            on_retry=on_retry,
        )

    async def write(self, location: str, data: Buffer | Sequence[Buffer]) -> None:
        buffers = as_buffers(data)
        await self._retry("write", location, lambda: self.plugin.write(location, buffers))

    async def replace(self, location: str, data: Buffer | Sequence[Buffer]) -> None:
        buffers = as_buffers(data)  # repeating it is harmless: the same bytes replace the object again
        await self._retry("write", location, lambda: self.plugin.replace(location, buffers))

    async def read(self, location: str, byte_range: ByteRange | None = None) -> bytes | memoryview:
        return await self._retry("read", location, lambda: self.plugin.read(location, byte_range))

    async def read_into(self, location: str, start: int, buffers: Sequence[memoryview]) -> None:
        await self._retry("read", location, lambda: self.plugin.read_into(location, start, buffers))

    async def prefetch(self, location: str, byte_range: ByteRange) -> None:
        await self.plugin.prefetch(location, byte_range)  # a hint: never raises, nothing to retry

    async def exists(self, location: str) -> bool:
        return await self._retry("exists", location, lambda: self.plugin.exists(location))

    async def list(self, prefix: str = "") -> list[str]:
        return await self._retry("list", prefix, lambda: self.plugin.list(prefix))

    async def list_dirs(self, prefix: str = "") -> builtins.list[str]:
        return await self._retry("list", prefix, lambda: self.plugin.list_dirs(prefix))

    async def delete(self, location: str) -> None:
        failed: list[BaseException] = []
        try:
            await self._retry("delete", location, lambda: self.plugin.delete(location), failed.append)
        except FileNotFoundError:
            if not failed:
                raise
            # An earlier attempt failed transiently: it may have deleted the object, its answer lost.

    async def remove_empty_dirs(self, prefix: str) -> None:
        await self._retry("delete_prefix", prefix, lambda: self.plugin.remove_empty_dirs(prefix))

    async def delete_prefix(self, prefix: str) -> None:
        await self._retry("delete_prefix", prefix, lambda: self.plugin.delete_prefix(prefix))

    async def discard(self, locations: Sequence[str]) -> None:
        await self._retry("discard", "", lambda: self.plugin.discard(locations))

    async def _holds(self, location: str, payload: bytes) -> bool:
        """Whether ``location`` holds exactly ``payload``.

        Raises:
            RetriesExhaustedError: reading it back failed, so the write's outcome is unknown.
        """
        try:
            return bytes(await self.read(location)) == payload
        except FileNotFoundError:
            return False
        except Exception as exc:
            describe = self._describe("write_exclusive", location)
            raise RetriesExhaustedError(
                f"{describe}: an attempt whose answer was lost may have written the object, and reading it "
                f"back to tell failed ({type(exc).__name__}: {exc}), so whether this write took effect is "
                "unknown. Open the snapshot to see whether it was committed, or take again to a new path"
            ) from exc

    async def write_exclusive(self, location: str, data: Buffer | Sequence[Buffer]) -> None:
        buffers = as_buffers(data)
        failed: list[BaseException] = []
        try:
            await self._retry(
                "write_exclusive", location, lambda: self.plugin.write_exclusive(location, buffers), failed.append
            )
        except (FileExistsError, RetriesExhaustedError) as exc:
            # Refused after a failed attempt, or every attempt failed: one of them may have
            # written the object and lost the answer.
            may_have_written = isinstance(exc, RetriesExhaustedError) or bool(failed)
            if not may_have_written or not await self._holds(location, b"".join(buffers)):
                raise
            lost = exc.__cause__ if isinstance(exc, RetriesExhaustedError) else failed[-1]
            logger.warning(
                "%s: an attempt whose answer was lost (%s: %s) had written the object; the write succeeded",
                self._describe("write_exclusive", location),
                type(lost).__name__,
                lost,
            )

    async def close(self) -> None:
        await self.plugin.close()


def with_retries(plugin: StoragePlugin, policy: RetryPolicy, where: str = "") -> StoragePlugin:
    """``plugin`` behind the retry layer, unless it retries itself or is wrapped already."""
    if plugin.capabilities.own_retries or isinstance(plugin, RetryingStoragePlugin):
        return plugin
    return RetryingStoragePlugin(plugin, policy, where)
