"""Checksums of stored pieces: CRC-32C (Castagnoli), the checksum GCS and S3 also offer.

The ``crc32c`` extension uses the CPU's CRC instruction (SSE4.2 / ARMv8) and releases the GIL,
so checksums run beside I/O on other threads.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import crc32c as _crc32c
import xxhash as _xxhash

if TYPE_CHECKING:
    from typing_extensions import Buffer

ALGORITHM = "crc32c"
#: The content hash of format version 4 (what incremental takes compare).
HASH_ALGORITHM = "xxh3-128"


def crc32c(data: Buffer, value: int = 0) -> int:
    """CRC-32C of ``data``, continuing from ``value`` (the CRC of the bytes before it)."""
    return int(_crc32c.crc32c(data, value))


def crc32c_each(pieces: Iterable[Buffer]) -> list[int]:
    """:func:`crc32c` of each of ``pieces`` (one C call per piece, no Python frame)."""
    return list(map(_crc32c.crc32c, pieces))


def format_checksum(value: int) -> str:
    """The manifest's text for a CRC-32C value: ``"crc32c:%08x"``."""
    return f"{ALGORITHM}:{value:08x}"


def parse_checksum(text: str) -> int:
    """Inverse of :func:`format_checksum` (the manifest decoder already validated ``text``)."""
    return int(text.partition(":")[2], 16)


def content_hash(data: Buffer) -> str:
    """The manifest's content hash of ``data``: ``"xxh3-128:<32 hex digits>"`` (128-bit XXH3; the
    ``xxhash`` extension releases the GIL, like ``crc32c``)."""
    return f"{HASH_ALGORITHM}:{_xxhash.xxh3_128_hexdigest(data)}"


def content_hasher() -> Any:
    """A streaming :func:`content_hash`: ``update()`` it with consecutive bytes, then :func:`finish_hash`."""
    return _xxhash.xxh3_128()


def finish_hash(hasher: Any) -> str:
    """The manifest's text for a :func:`content_hasher` fed every byte of a piece."""
    return f"{HASH_ALGORITHM}:{hasher.hexdigest()}"


#: Block size of :func:`checksum_and_hash`: small enough to stay in a core's cache between the two
#: passes over it, large enough that the per-block calls cost nothing.
_FUSED_BLOCK_BYTES = 1 << 20


def checksum_and_hash(data: Buffer) -> tuple[int, str]:
    """:func:`crc32c` and :func:`content_hash` of ``data`` in one pass over memory: block by block,
    each block is checksummed and hashed while it is in the cache (about 5% faster than two passes
    over a large piece, which matters when every stored byte goes through both)."""
    view = memoryview(data).cast("B")
    hasher = _xxhash.xxh3_128()
    value = 0
    for start in range(0, view.nbytes, _FUSED_BLOCK_BYTES):
        block = view[start : start + _FUSED_BLOCK_BYTES]
        value = int(_crc32c.crc32c(block, value))
        hasher.update(block)
    return value, f"{HASH_ALGORITHM}:{hasher.hexdigest()}"
