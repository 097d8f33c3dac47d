"""Pieces: where a stored byte range is, what checks it, and (format 4) who holds it.

A piece names a byte range of a data object by *location* (a relative path inside the snapshot,
validated so that no manifest can make a reader open a file outside it), its CRC-32C, from format
version 4 its content hash (``xxh3-128``, which incremental takes compare), and, for a piece an
incremental take reused, the *base* that holds it: ``"../<name>"``, another snapshot in the folder
that holds this one (``docs/format.md`` sections 3.1 and 8.2).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import posixpath
import re
from collections.abc import Callable
from typing import Any

from snapshotkit.errors import ManifestError, UnsafeLocationError

#: Name of the manifest object; its presence is the commit marker of a snapshot.
METADATA_FILENAME = ".snapshot_metadata"
#: Checksum algorithms a reader understands.
CHECKSUM_ALGORITHMS = ("crc32c",)
#: The content hash of format version 4: 128-bit XXH3, as ``"xxh3-128:<32 hex digits>"``.
HASH_ALGORITHM = "xxh3-128"
_CHECKSUM_TEXT = re.compile(r"crc32c:[0-9a-f]{8}")
_HASH_TEXT = re.compile(r"xxh3-128:[0-9a-f]{32}")
#: What a base location starts with: the folder that holds the snapshot.
BASE_PREFIX = "../"

#: JSON string literal of a str (C-accelerated; raw UTF-8).
_json_string: Callable[[str], str] = json.encoder.encode_basestring


def _fail(key: str, message: str) -> ManifestError:
    _, slash, logical_path = key.partition("/")
    where = f"{key!r} (logical path {logical_path!r})" if slash and logical_path else repr(key)
    return ManifestError(f"malformed manifest entry {where}: {message}")


def validate_location(location: object) -> str:
    """Return ``location`` if it names an object inside the snapshot, else raise.

    A location is a relative POSIX path of non-empty components without ``.``, ``..`` or
    backslashes; it may not be the manifest itself.
    """
    if isinstance(location, str):
        return _validate_location_text(location)
    raise UnsafeLocationError(f"location {location!r} is not a non-empty string")


@functools.lru_cache(maxsize=4096)  # a manifest names few distinct data objects, many times
def _validate_location_text(location: str) -> str:
    if not location:
        raise UnsafeLocationError(f"location {location!r} is not a non-empty string")
    parts = location.split("/")
    if (
        location.startswith("/")
        or "\\" in location
        or "\x00" in location
        or ":" in parts[0]
        or any(part in ("", ".", "..") for part in parts)
        or posixpath.normpath(location) != location
        or location == METADATA_FILENAME
    ):
        raise UnsafeLocationError(
            f"location {location!r} would leave the snapshot or is not a plain relative path; "
            "this manifest is corrupt or was crafted: do not read this snapshot"
        )
    return location


def validate_base_location(base: object) -> str:
    """Return ``base`` if it is ``"../<name>"`` with ``<name>`` a valid location (another snapshot in
    the folder that holds this one, never further out), else raise :class:`UnsafeLocationError`."""
    if isinstance(base, str) and base.startswith(BASE_PREFIX):
        name = base[len(BASE_PREFIX) :]
        try:
            validate_location(name)
        except UnsafeLocationError:
            pass
        else:
            return base
    raise UnsafeLocationError(
        f"base location {base!r} is not '../<name>' naming a snapshot in the folder that holds this one; "
        "this manifest is corrupt or was crafted: do not read this snapshot"
    )


@dataclasses.dataclass(frozen=True)
class Piece:
    """A stored byte range: ``[start, end)`` of data object ``location``, with its checksum.

    Attributes:
        location: the data object, relative to the snapshot that holds it.
        byte_range: ``(start, end)`` within it.
        checksum: ``"<algorithm>:<hex digest>"``, e.g. ``"crc32c:1a2b3c4d"``.
        hash: ``"xxh3-128:<32 hex digits>"`` of the bytes (format 4), or None (older formats).
        base: None when this snapshot holds the bytes; else the base snapshot that holds them,
            ``"../<name>"`` relative to this snapshot (an incremental take's reference).
    """

    location: str
    byte_range: tuple[int, int]
    checksum: str
    hash: str | None = None
    base: str | None = None

    @property
    def nbytes(self) -> int:
        return self.byte_range[1] - self.byte_range[0]

    @property
    def address(self) -> str:
        """Where the bytes are, relative to this snapshot: ``location``, or ``<base>/<location>``
        for a reference (the key readers fetch and group by)."""
        return self.location if self.base is None else f"{self.base}/{self.location}"

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "location": self.location,
            "byte_range": list(self.byte_range),
            "checksum": self.checksum,
        }
        if self.hash is not None:
            out["hash"] = self.hash
        if self.base is not None:
            out["base"] = self.base
        return out

    def to_json_line(self) -> str:
        """``to_json()`` as compact JSON text, built directly (manifests hold many pieces)."""
        start, end = self.byte_range
        text = (
            f'{{"location":{_json_string(self.location)},"byte_range":[{start},{end}],'
            f'"checksum":{_json_string(self.checksum)}'
        )
        if self.hash is not None:
            text += f',"hash":{_json_string(self.hash)}'
        if self.base is not None:
            text += f',"base":{_json_string(self.base)}'
        return text + "}"

    @classmethod
    def from_json(cls, key: str, raw: object) -> Piece:
        if not isinstance(raw, dict):
            raise _fail(key, f"piece {raw!r} is not a mapping")
        try:
            location = validate_location(raw.get("location"))
            base = raw.get("base")
            if base is not None:
                base = validate_base_location(base)
        except UnsafeLocationError as exc:
            raise UnsafeLocationError(str(_fail(key, str(exc)))) from None
        byte_range = raw.get("byte_range")
        if (
            type(byte_range) is not list
            or len(byte_range) != 2
            or type(byte_range[0]) is not int
            or type(byte_range[1]) is not int
            or not 0 <= byte_range[0] <= byte_range[1]
        ):
            raise _fail(key, f"byte_range {byte_range!r} is not [start, end) with 0 <= start <= end")
        checksum = raw.get("checksum")
        if type(checksum) is not str or _CHECKSUM_TEXT.fullmatch(checksum) is None:
            raise _fail(
                key, f"checksum {checksum!r} is not '<algorithm>:<hex>' with algorithm in {CHECKSUM_ALGORITHMS}"
            )
        digest = raw.get("hash")
        if "hash" in raw and (type(digest) is not str or _HASH_TEXT.fullmatch(digest) is None):
            raise _fail(key, f"hash {digest!r} is not '{HASH_ALGORITHM}:' and 32 lowercase hex digits")
        if "base" in raw and base is None:
            raise _fail(key, "a piece's base must be a string '../<name>'")
        return cls(location, (byte_range[0], byte_range[1]), checksum, digest, base)
