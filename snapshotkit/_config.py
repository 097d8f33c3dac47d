"""Configuration: explicit arguments first, then ``SNAPSHOTKIT_*`` variables, then defaults.

The environment is read once per operation into a frozen :class:`Config`; nothing here is a
mutable module-level knob.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re
from collections.abc import Mapping
from typing import Literal

from snapshotkit.errors import ConfigError, InvalidArgumentError

_MIB = 1 << 20
_GIB = 1 << 30

#: Fraction of available RAM the default memory budget may use.
_AVAILABLE_MEMORY_FRACTION = 0.6
#: Upper bound on the default memory budget, whatever the machine has.
_MAX_DEFAULT_BUDGET_BYTES = 32 * _GIB
#: Lower bound on the default memory budget, so tiny containers still make progress in pieces.
_MIN_DEFAULT_BUDGET_BYTES = 64 * _MIB


#: ``scheme://`` with nothing after it: a URI that names no snapshot.
_EMPTY_URI = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]+://$")


def snapshot_path(path: object) -> str:
    """The snapshot path or URI ``path`` names, checked before anything is read or written.

    A local path (plain, or ``file://``) starting with ``~`` is expanded like the shell does.

    Raises:
        InvalidArgumentError: ``path`` is not a ``str`` or ``os.PathLike`` of one (``None``).
        ConfigError: ``path`` is empty, blank, or a URI with nothing after ``scheme://``.
    """
    text = os.fspath(path) if isinstance(path, os.PathLike) else path
    if not isinstance(text, str):
        raise InvalidArgumentError(
            f"the snapshot path must be a str or os.PathLike (a directory or a URI such as s3://bucket/run/step_100), "
            f"got {type(path).__name__} {path!r}"
        )
    if not text.strip() or _EMPTY_URI.match(text):
        raise ConfigError(
            f"the snapshot path {text!r} names no location; pass a directory (e.g. 'checkpoints/step_100') or a URI "
            "with a path after the scheme (e.g. 's3://bucket/run/step_100')"
        )
    if text.startswith("~"):
        return os.path.expanduser(text)
    if text[:8].lower() == "file://~":
        return "file://" + os.path.expanduser(text[7:])
    return text


def available_memory_bytes() -> int:
    """Bytes of RAM the kernel reports as available for new allocations."""
    # Linux: the MemAvailable line psutil reports, without importing psutil (~25 ms, paid by the
    # first restore of a process otherwise).
    with contextlib.suppress(OSError, ValueError), open("/proc/meminfo", "rb") as meminfo:
        for line in meminfo:
            if line.startswith(b"MemAvailable:"):
                return int(line.split()[1]) * 1024
    try:
        import psutil

        return int(psutil.virtual_memory().available)
    except ImportError:  # pragma: no cover - psutil is a declared dependency
        return int(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))


def default_memory_budget_bytes(local_world_size: int = 1) -> int:
    """The budget used when neither an argument nor the environment sets one."""
    share = int(available_memory_bytes() * _AVAILABLE_MEMORY_FRACTION) // max(1, local_world_size)
    return max(_MIN_DEFAULT_BUDGET_BYTES, min(share, _MAX_DEFAULT_BUDGET_BYTES))


@dataclasses.dataclass(frozen=True)
class Config:
    """Tunables of one take, restore or read.

    Attributes:
        memory_budget_bytes: host bytes the pipeline may hold in staging/bounce buffers at once.
        chunk_bytes: tensors larger than this are stored as several pieces of at most this size.
        data_object_bytes: target size of one data object; small pieces are packed up to it.
        io_concurrency: storage operations in flight at once per process.
        verify_checksums: verify the checksum of every piece read.
        collective_timeout_seconds: how long a rank waits for the others in one collective
            step of a multi-rank take or restore before raising ``CollectiveTimeoutError``.
        background_niceness: scheduling niceness (0-19) of ``async_take``'s background writer
            threads and checkpoint daemon, so that they take only the CPU time training leaves
            idle; 0 keeps normal priority.
        min_reference_bytes: an incremental take references a base's piece instead of writing
            it only if the piece holds at least this many bytes; smaller pieces are always
            written (their reference would cost about as much as the bytes, and a read).
        share_replicated_reads: on a restore by several ranks of a gloo group, read each piece
            every rank wants (replicated state) on one rank and broadcast it to the others,
            instead of every rank reading it from storage. ``"auto"`` (the default) shares
            unless every rank is on one host and the store reads through that host's page cache
            (a local file system: the cache already reads the bytes once); ``True`` always
            shares; ``False`` never does, for clusters whose storage is faster than the network
            between ranks. Sharing happens only if no rank turned it off.
    """

    memory_budget_bytes: int
    chunk_bytes: int = 16 * _MIB
    data_object_bytes: int = 64 * _MIB
    io_concurrency: int = 4
    verify_checksums: bool = True
    collective_timeout_seconds: float = 1800.0
    background_niceness: int = 19
    min_reference_bytes: int = 64 * 1024
    share_replicated_reads: bool | Literal["auto"] = "auto"

    def __post_init__(self) -> None:
        positive = ("memory_budget_bytes", "chunk_bytes", "data_object_bytes", "io_concurrency", "min_reference_bytes")
        for name in positive:
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ConfigError(f"{name} must be a positive integer, got {value!r}")
        timeout = self.collective_timeout_seconds
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
            raise ConfigError(f"collective_timeout_seconds must be a positive number, got {timeout!r}")
        niceness = self.background_niceness
        if isinstance(niceness, bool) or not isinstance(niceness, int) or not 0 <= niceness <= 19:
            raise ConfigError(f"background_niceness must be an integer from 0 to 19, got {niceness!r}")
        share = self.share_replicated_reads
        if share not in (True, False, "auto") or type(share) is int:
            raise ConfigError(f"share_replicated_reads must be True, False or 'auto', got {share!r}")

    @classmethod
    def resolve(
        cls,
        *,
        memory_budget_bytes: int | None = None,
        verify_checksums: bool | None = None,
        share_replicated_reads: bool | Literal["auto"] | None = None,
        environ: Mapping[str, str] | None = None,
    ) -> Config:
        """Build the config for one call: arguments win over the environment, which wins over defaults."""
        env = os.environ if environ is None else environ
        budget = memory_budget_bytes
        if budget is None:
            budget = _env_int(env, "SNAPSHOTKIT_MEMORY_BUDGET_BYTES")
        if budget is None:
            # Ranks sharing a host (torchrun sets LOCAL_WORLD_SIZE) share its memory.
            budget = default_memory_budget_bytes(_env_int(env, "LOCAL_WORLD_SIZE") or 1)
        if verify_checksums is None:
            verify_checksums = _env_bool(env, "SNAPSHOTKIT_VERIFY_CHECKSUMS", default=True)
        if share_replicated_reads is None:
            raw = env.get("SNAPSHOTKIT_SHARE_REPLICATED_READS", "").strip().lower()
            share_replicated_reads = (
                "auto" if raw in ("", "auto") else _env_bool(env, "SNAPSHOTKIT_SHARE_REPLICATED_READS", default=True)
            )
        fields: dict[str, int] = {}
        for field, var in (
            ("chunk_bytes", "SNAPSHOTKIT_CHUNK_BYTES"),
            ("data_object_bytes", "SNAPSHOTKIT_DATA_OBJECT_BYTES"),
            ("io_concurrency", "SNAPSHOTKIT_IO_CONCURRENCY"),
            ("min_reference_bytes", "SNAPSHOTKIT_MIN_REFERENCE_BYTES"),
        ):
            value = _env_int(env, var)
            if value is not None:
                fields[field] = value
        niceness = _env_int(env, "SNAPSHOTKIT_BACKGROUND_NICENESS", minimum=0, maximum=19)
        if niceness is not None:
            fields["background_niceness"] = niceness
        config = cls(
            memory_budget_bytes=budget,
            verify_checksums=verify_checksums,
            share_replicated_reads=share_replicated_reads,
            **fields,
        )
        timeout = _env_float(env, "SNAPSHOTKIT_COLLECTIVE_TIMEOUT_SECONDS")
        return config if timeout is None else dataclasses.replace(config, collective_timeout_seconds=timeout)


def _env_float(env: Mapping[str, str], name: str) -> float | None:
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return None
    try:
        value = float(raw)
    except ValueError:
        raise ConfigError(f"{name}={raw!r} is not a number") from None
    if not value > 0:
        raise ConfigError(f"{name}={raw!r} must be a positive number of seconds")
    return value


def _env_int(env: Mapping[str, str], name: str, *, minimum: int = 1, maximum: int | None = None) -> int | None:
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return None
    try:
        value = int(raw.strip().replace("_", ""))
    except ValueError:
        hint = "a byte count such as 268435456" if name.endswith("_BYTES") else "a whole number"
        raise ConfigError(f"{name}={raw!r} is not an integer; set it to {hint}") from None
    if value < minimum:
        wanted = "positive" if minimum == 1 else f">= {minimum}"
        raise ConfigError(f"{name}={raw!r} must be {wanted}")
    if maximum is not None and value > maximum:
        raise ConfigError(f"{name}={raw!r} must be at most {maximum}")
    return value


def _env_bool(env: Mapping[str, str], name: str, *, default: bool) -> bool:
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return default
    lowered = raw.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise ConfigError(f"{name}={raw!r} is not a boolean; use 1/0, true/false, yes/no or on/off")
