"""A storage plugin that makes any other plugin flaky, for testing how snapshotkit (and yours) copes.

:class:`FaultInjectingPlugin` wraps a plugin and fails a fraction of its calls the way a network
store fails: a connection reset or a timeout before the call reaches the store, throttling, or a
*lost response*: the call takes effect, then the caller sees a connection reset. Which calls fail
is drawn from a seeded generator, so a failing run replays exactly with the same seed and the
same sequence of calls.

Register it like any plugin, so that takes and restores reach it through a URI (and, being a
picklable factory, through the checkpoint daemon of ``async_take(executor="process")``)::

    register_storage_plugin("flaky", FaultInjectingPlugin.factory("file", rate=0.1, seed=7))
    Snapshot.take("flaky:///tmp/ckpt/step_1", app_state)   # 10% of storage calls fail

The storage option ``"faults"`` (a dict of ``rate``, ``kinds``, ``seed``) overrides the factory's
settings for one operation and never reaches the wrapped plugin.
"""

from __future__ import annotations

import builtins
import dataclasses
import random
import threading
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from snapshotkit.errors import ConfigError
from snapshotkit.storage import ByteRange, StoragePlugin, StoragePluginFactory, url_to_storage_plugin

if TYPE_CHECKING:
    from typing_extensions import Buffer

T = TypeVar("T")

_RESET = "reset"
_TIMEOUT = "timeout"
_THROTTLE = "throttle"
_LOST_RESPONSE = "lost_response"
#: Every fault kind, the default: ``"reset"`` (``ConnectionResetError`` before the call reaches
#: the store), ``"timeout"`` (``TimeoutError``, likewise), ``"throttle"`` (an HTTP 503 SlowDown,
#: :class:`InjectedThrottlingError`) and ``"lost_response"`` (the call takes effect, then the
#: connection is reset before the answer arrives).
FAULT_KINDS = (_RESET, _TIMEOUT, _THROTTLE, _LOST_RESPONSE)


class InjectedThrottlingError(OSError):
    """An injected "503 SlowDown": what an object store answers when asked to slow down."""

    status = 503


def _raise(kind: str, operation: str, location: str) -> None:
    where = f"injected {kind} on {operation} {location!r}"
    if kind == _TIMEOUT:
        raise TimeoutError(f"{where}: timed out")
    if kind == _THROTTLE:
        raise InjectedThrottlingError(f"{where}: 503 SlowDown, please reduce your request rate")
    raise ConnectionResetError(f"{where}: connection reset by peer")


class FaultInjectingPlugin(StoragePlugin):
    """``plugin`` with a fraction ``rate`` of its calls failing with faults drawn from ``kinds``.

    Every call but ``close`` may fail. The ``n``-th call of an instance fails, and how, as a
    function of ``(seed, n)`` only; plugins made by :meth:`factory` get distinct seeds
    (``"<seed>/<k>"`` for the ``k``-th plugin made with that seed in this process). A
    ``"lost_response"`` fault on a read or check is a reset after the call ran. Injected faults
    are counted in :attr:`injected` (kind -> count).

    Args:
        plugin: the plugin to wrap (closed with this one).
        rate: the probability, from 0 to 1, that a call fails.
        kinds: the fault kinds to draw from (:data:`FAULT_KINDS` by default).
        seed: the seed of the fault sequence.
    """

    def __init__(
        self, plugin: StoragePlugin, *, rate: float = 0.1, kinds: Sequence[str] = FAULT_KINDS, seed: int | str = 0
    ) -> None:
        if not 0.0 <= rate <= 1.0:
            raise ConfigError(f"FaultInjectingPlugin rate must be from 0 to 1, got {rate!r}")
        unknown = sorted(set(kinds) - set(FAULT_KINDS))
        if unknown or not kinds:
            raise ConfigError(f"FaultInjectingPlugin kinds must be a non-empty subset of {FAULT_KINDS}, got {kinds!r}")
        self.plugin = plugin
        self.rate = rate
        self.kinds = tuple(kinds)
        self.seed = seed
        self.capabilities = plugin.capabilities
        self.injected: Counter[str] = Counter()
        self._random = random.Random(seed)  # noqa: S311 - reproducible faults, not secrets
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"FaultInjectingPlugin({self.plugin!r}, rate={self.rate}, kinds={self.kinds}, seed={self.seed})"

    @classmethod
    def factory(
        cls,
        inner: str | StoragePluginFactory,
        *,
        rate: float = 0.1,
        kinds: Sequence[str] = FAULT_KINDS,
        seed: int = 0,
    ) -> StoragePluginFactory:
        """A factory to :func:`~snapshotkit.storage.register_storage_plugin`: each plugin it makes
        wraps ``inner`` (a scheme such as ``"file"`` or ``"s3"``, or a factory) for the same root.

        The factory is picklable when ``inner`` is, so it reaches the checkpoint daemon.
        """
        return _Factory(inner, rate, tuple(kinds), seed)

    def is_transient(self, exc: BaseException) -> bool:
        return self.plugin.is_transient(exc)

    def _draw(self) -> str | None:
        with self._lock:
            fails = self._random.random() < self.rate
            kind = self._random.choice(self.kinds)
        return kind if fails else None

    async def _call(self, operation: str, location: str, function: Callable[[], Awaitable[T]]) -> T:
        kind = self._draw()
        if kind is None:
            return await function()
        self.injected[kind] += 1
        if kind == _LOST_RESPONSE:
            await function()
            _raise(_RESET, operation, location)
        _raise(kind, operation, location)
        raise AssertionError("unreachable")  # pragma: no cover

    async def write(self, location: str, data: Buffer | Sequence[Buffer]) -> None:
        await self._call("write", location, lambda: self.plugin.write(location, data))

    async def write_exclusive(self, location: str, data: Buffer | Sequence[Buffer]) -> None:
        await self._call("write_exclusive", location, lambda: self.plugin.write_exclusive(location, data))

    async def replace(self, location: str, data: Buffer | Sequence[Buffer]) -> None:
        await self._call("replace", location, lambda: self.plugin.replace(location, data))

    async def read(self, location: str, byte_range: ByteRange | None = None) -> bytes | memoryview:
        return await self._call("read", location, lambda: self.plugin.read(location, byte_range))

    async def read_into(self, location: str, start: int, buffers: Sequence[memoryview]) -> None:
        await self._call("read_into", location, lambda: self.plugin.read_into(location, start, buffers))

    async def prefetch(self, location: str, byte_range: ByteRange) -> None:
        await self.plugin.prefetch(location, byte_range)  # a hint: no fault is injected into it

    async def exists(self, location: str) -> bool:
        return await self._call("exists", location, lambda: self.plugin.exists(location))

    async def delete(self, location: str) -> None:
        await self._call("delete", location, lambda: self.plugin.delete(location))

    async def list(self, prefix: str = "") -> list[str]:
        return await self._call("list", prefix, lambda: self.plugin.list(prefix))

    async def list_dirs(self, prefix: str = "") -> builtins.list[str]:
        return await self._call("list", prefix, lambda: self.plugin.list_dirs(prefix))

    async def remove_empty_dirs(self, prefix: str) -> None:
        await self._call("delete_prefix", prefix, lambda: self.plugin.remove_empty_dirs(prefix))

    async def delete_prefix(self, prefix: str) -> None:
        await self._call("delete_prefix", prefix, lambda: self.plugin.delete_prefix(prefix))

    async def discard(self, locations: Sequence[str]) -> None:
        await self._call("discard", "", lambda: self.plugin.discard(locations))

    async def close(self) -> None:
        await self.plugin.close()


@dataclasses.dataclass(frozen=True)
class _Factory:
    """The picklable factory :meth:`FaultInjectingPlugin.factory` returns."""

    inner: str | StoragePluginFactory
    rate: float
    kinds: tuple[str, ...]
    seed: int

    def __call__(self, root: str, storage_options: Mapping[str, Any]) -> StoragePlugin:
        options = dict(storage_options)
        overrides = dict(options.pop("faults", None) or {})
        unknown = sorted(set(overrides) - {"rate", "kinds", "seed"})
        if unknown:
            raise ConfigError(f"unknown faults option(s) {unknown}; known: ['kinds', 'rate', 'seed']")
        if isinstance(self.inner, str):
            plugin = url_to_storage_plugin(f"{self.inner}://{root}", options)
        else:
            plugin = self.inner(root, options)
        seed = int(overrides.get("seed", self.seed))
        with _MADE_LOCK:
            made = _MADE[seed]
            _MADE[seed] += 1
        return FaultInjectingPlugin(
            plugin,
            rate=float(overrides.get("rate", self.rate)),
            kinds=tuple(overrides.get("kinds", self.kinds)),
            seed=f"{seed}/{made}",  # each plugin its own fault sequence, reproducible in order
        )


#: seed -> plugins the factories made with it in this process.
_MADE: Counter[int] = Counter()
_MADE_LOCK = threading.Lock()
