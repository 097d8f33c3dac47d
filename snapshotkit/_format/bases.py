"""Snapshot ids and base references (format version 4): how an incremental snapshot names the
snapshots that hold the bytes it reuses.

Every version-4 manifest has a ``snapshot_id`` (32 lowercase hex digits, random), and may have a
``bases`` header member: base location (``"../<name>"``, a snapshot in the folder that holds this
one) -> that base's ``snapshot_id``. A piece with ``"base": "../<name>"`` is read from that
snapshot, after the reader checked that the snapshot there still has that id (so a base that was
deleted and replaced by another snapshot of the same name is never read as the original).

The path arithmetic here is pure: ``parent_of``, :func:`base_location_for` (take side) and
:func:`resolve_base` (read side) treat local paths and ``scheme://`` URIs alike.
"""

from __future__ import annotations

import os
import re
import uuid
from collections.abc import Mapping

from snapshotkit._format.pieces import BASE_PREFIX, validate_base_location, validate_location
from snapshotkit.errors import ConfigError, ManifestError, UnsafeLocationError

#: The header members of format version 4.
SNAPSHOT_ID_MEMBER = "snapshot_id"
BASES_MEMBER = "bases"
#: The first format version with snapshot ids, content hashes and base references.
BASES_SINCE = 4
SNAPSHOT_ID_TEXT = re.compile(r"[0-9a-f]{32}")


def new_snapshot_id() -> str:
    """A fresh, unique snapshot id: 128 random bits as 32 lowercase hex digits."""
    return uuid.uuid4().hex


def _split(path: str) -> tuple[str, str]:
    """``(prefix, rest)``: ``("s3://", "bucket/run/step")`` for a URI, ``("", "/abs/run/step")`` for a
    local path (made absolute)."""
    scheme, sep, rest = path.partition("://")
    if sep and "/" not in scheme and scheme:
        return f"{scheme}://", rest.rstrip("/")
    return "", os.path.abspath(path)


def parent_of(path: str) -> str | None:
    """The folder that holds the snapshot at ``path`` (None for a bucket or filesystem root)."""
    prefix, rest = _split(path)
    head, sep, name = rest.rpartition("/")
    if not sep or not name or (prefix and not head):
        return None
    return prefix + (head or "/")


def base_location_for(path: str, base_path: str) -> str:
    """The base location (``"../<name>"``) of the snapshot at ``base_path`` as seen from a new
    snapshot at ``path``.

    Raises:
        ConfigError: the base does not lie in the folder that holds ``path`` (or below it), or is
            ``path`` itself: a reference may not leave that folder.
    """
    parent = parent_of(path)
    base_prefix, base_rest = _split(base_path)
    candidate = base_prefix + base_rest
    if parent is not None:
        inside = parent.rstrip("/") + "/"
        if candidate.startswith(inside):
            name = candidate[len(inside) :]
            try:
                validate_location(name)
            except UnsafeLocationError:
                pass
            else:
                if candidate != "".join(_split(path)):
                    return BASE_PREFIX + name
    raise ConfigError(
        f"base={base_path!r} must be another snapshot in the folder that holds {path!r} (or below it), such as "
        f"{(parent or '<parent>').rstrip('/')}/step_100: an incremental snapshot references its base by a path "
        "relative to that folder. Nothing was written; take a full snapshot (no base), or take the new one beside "
        "the base"
    )


def resolve_base(path: str, base: str) -> str:
    """The path of the base at base location ``base`` of the snapshot at ``path``."""
    name = validate_base_location(base)[len(BASE_PREFIX) :]
    parent = parent_of(path)
    if parent is None:
        raise ManifestError(f"the snapshot at {path!r} references base {base!r} but has no parent folder to find it in")
    return f"{parent.rstrip('/')}/{name}"


def decode_bases(document: Mapping[str, object], version: int) -> tuple[str | None, dict[str, str]]:
    """The ``snapshot_id`` and ``bases`` header members of a decoded document (version 4: the id is
    required; earlier versions have neither)."""
    if version < BASES_SINCE:
        return None, {}
    snapshot_id = document.get(SNAPSHOT_ID_MEMBER)
    if type(snapshot_id) is not str or SNAPSHOT_ID_TEXT.fullmatch(snapshot_id) is None:
        raise ManifestError(
            f"the header member {SNAPSHOT_ID_MEMBER!r} must be 32 lowercase hex digits, got {snapshot_id!r}"
        )
    raw = document.get(BASES_MEMBER, {})
    if not isinstance(raw, dict):
        raise ManifestError(f"the header member {BASES_MEMBER!r} must be a JSON object, got {type(raw).__name__}")
    bases: dict[str, str] = {}
    for location, base_id in raw.items():
        validate_base_location(location)
        if type(base_id) is not str or SNAPSHOT_ID_TEXT.fullmatch(base_id) is None:
            raise ManifestError(f"base {location!r} has snapshot id {base_id!r}, not 32 lowercase hex digits")
        if base_id == snapshot_id:
            raise ManifestError(f"base {location!r} has this snapshot's own id; the manifest is corrupt or crafted")
        bases[location] = base_id
    return snapshot_id, bases
