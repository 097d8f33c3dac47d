"""The raw manifest document: its integrity line, and bytes <-> JSON object.

From format version 3 every manifest begins with an *integrity line* that holds the SHA-256
of everything after it (``docs/format.md`` section 2.1):

    {"integrity": "sha256:<64 lowercase hex digits>",
    "format": "snapshotkit",
    ...

so any changed byte of the manifest is detected before anything in it is used. This module
adds and verifies that line and parses the JSON strictly (unique member names, too-deep nesting an error,
no YAML for a document that starts like JSON). It does no semantic validation: that is
:meth:`snapshotkit.manifest.SnapshotMetadata.from_text`.
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any

from snapshotkit.errors import ManifestError, ManifestIntegrityError

#: The header member that holds the manifest's digest.
INTEGRITY_MEMBER = "integrity"
#: The first format version whose manifests carry (and must carry) the integrity line.
INTEGRITY_SINCE = 3
_PREFIX = b'{"integrity": "sha256:'
_LINE = re.compile(rb'\{"integrity": "sha256:([0-9a-f]{64})",\n')
_LINE_LENGTH = len(_PREFIX) + 64 + 3


def seal(body: bytes) -> bytes:
    """The manifest bytes for ``body``: the integrity line, then ``body``.

    ``body`` is the JSON document text without its opening ``{``: the header members, the
    manifest and the closing ``}``.
    """
    return _PREFIX + hashlib.sha256(body).hexdigest().encode("ascii") + b'",\n' + body


def encode_document(doc: dict[str, Any]) -> bytes:
    """Serialize a raw manifest document (a JSON object) with its integrity line.

    The result passes :func:`decode_document` unchanged; any ``"integrity"`` member of ``doc``
    is replaced by the new check. No semantic validation is done: this is the codec tools and
    tests use to write a manifest, valid or deliberately not.

    Raises:
        TypeError: ``doc`` is not a dict, or holds a value JSON cannot encode.
        ValueError: ``doc`` is empty (a manifest has at least its header), nests too deep, or
            holds a NaN or infinite float, or a string with a lone surrogate.
    """
    if not isinstance(doc, dict):
        raise TypeError(f"encode_document() takes a dict, not {type(doc).__name__}")
    members = {key: value for key, value in doc.items() if key != INTEGRITY_MEMBER}
    if not members:
        raise ValueError("encode_document() needs a non-empty document (a manifest has at least its header)")
    try:
        text = json.dumps(members, ensure_ascii=False, allow_nan=False)
    except RecursionError as exc:
        raise ValueError("the document nests too deep to encode") from exc
    try:
        body = text[1:].encode("utf-8") + b"\n"
    except UnicodeEncodeError as exc:
        raise ValueError(f"the document holds a string with no UTF-8 form (a lone surrogate): {exc}") from exc
    return seal(body)


def decode_document(data: bytes) -> dict[str, Any]:
    """Verify and parse raw manifest bytes into the JSON object they hold.

    A manifest that begins with the integrity line must match its digest, byte for byte, and is
    parsed as strict JSON only (unique member names). One without it is accepted only from
    format versions 1 and 2 (older writers); it is parsed as JSON when it starts like JSON
    (``{``) and otherwise as YAML, for a version-1 manifest a human rewrote. The returned
    dict has no ``"integrity"`` member.

    Raises:
        ManifestIntegrityError: the digest does not match, the integrity line is malformed, or a
            manifest of format version 3 or later has no integrity line.
        ManifestError: the bytes are not UTF-8 JSON (or YAML) holding an object, nest too deep
            to parse, repeat a member name or hold an integer too long to parse.
        TypeError: ``data`` is not bytes.
    """
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise TypeError(f"decode_document() takes bytes, not {type(data).__name__}")
    data = bytes(data)
    if data.startswith(_PREFIX[:2]) and data[:_LINE_LENGTH].startswith(b'{"integrity"'):
        return _decode_sealed(data)
    document = _parse_legacy(data)
    version = document.get("format_version")
    if type(version) is int and version >= INTEGRITY_SINCE:
        raise ManifestIntegrityError(
            f"the manifest says format version {version} but does not begin with its integrity line "
            '({"integrity": "sha256:<digest>",); it is corrupt or was edited by hand'
        )
    if INTEGRITY_MEMBER in document:
        raise ManifestIntegrityError(
            "the manifest has an integrity member that is not its first line; it is corrupt or was edited by hand"
        )
    return document


def _decode_sealed(data: bytes) -> dict[str, Any]:
    line = _LINE.match(data)
    if line is None:
        raise ManifestIntegrityError(
            'the manifest\'s first line is not {"integrity": "sha256:<64 lowercase hex digits>",; '
            "it is corrupt or was edited by hand"
        )
    digest = hashlib.sha256(memoryview(data)[line.end() :]).hexdigest()  # the body, hashed without a copy
    if digest.encode("ascii") != line.group(1):
        raise ManifestIntegrityError(
            f"the manifest's content does not match its integrity check (sha256 {digest}, the manifest "
            f"says {line.group(1).decode()}): it was damaged or edited after the take. Do not restore "
            "it; restore an earlier snapshot"
        )
    document = _parse_json(data)
    document.pop(INTEGRITY_MEMBER, None)
    return document


def _parse_legacy(data: bytes) -> dict[str, Any]:
    if data.lstrip(b" \t\r\n").startswith(b"{"):
        return _parse_json(data)
    return _parse_yaml(data)


def _parse_json(data: bytes) -> dict[str, Any]:
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ManifestError(f"the manifest is not UTF-8 text ({exc}); the file is corrupt") from exc
    try:
        document = json.loads(text, object_pairs_hook=_unique_members)
    except _DuplicateMemberError as exc:
        raise ManifestError(
            f"the manifest names {exc.args[0]!r} more than once; it is corrupt or was edited by hand"
        ) from None
    except (ValueError, RecursionError) as exc:
        raise ManifestError(f"the manifest is not valid JSON ({exc}); the file is corrupt") from exc
    if not isinstance(document, dict):
        raise ManifestError("the manifest is not a mapping; the file is corrupt or not a snapshotkit manifest")
    return document


def _parse_yaml(data: bytes) -> dict[str, Any]:
    import yaml

    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    try:
        document = yaml.load(data, Loader=loader)  # noqa: S506 - a safe loader
    except (yaml.YAMLError, ValueError, RecursionError) as exc:
        raise ManifestError(f"the manifest is neither JSON nor YAML ({exc}); the file is corrupt") from exc
    if not isinstance(document, dict):
        raise ManifestError("the manifest is not a mapping; the file is corrupt or not a snapshotkit manifest")
    if not all(isinstance(key, str) for key in document):
        raise ManifestError("the manifest has a member name that is not a string; the file is corrupt")
    return document


class _DuplicateMemberError(Exception):
    pass


def _unique_members(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    members = dict(pairs)
    if len(members) != len(pairs):
        seen: set[str] = set()
        for name, _ in pairs:
            if name in seen:
                raise _DuplicateMemberError(name)
            seen.add(name)
    return members
