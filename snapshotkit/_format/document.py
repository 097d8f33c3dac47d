"""The ``.snapshot_metadata`` document: header fields and the manifest, to and from text."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from snapshotkit._format.entries import (
    _COMPACT_JSON,
    _KIND_SINCE,
    _RANK_TEXT,
    FORMAT_NAME,
    FORMAT_VERSION,
    Entry,
    TensorEntry,
    _fail,
    _field,
    _json_string,
    check_containers,
    decode_entry,
)
from snapshotkit.errors import ManifestError, UnsupportedFormatVersionError


@dataclasses.dataclass(frozen=True)
class SnapshotMetadata:
    """The decoded ``.snapshot_metadata`` document.

    Attributes:
        format_version: on-disk format version (1, or 2 when the manifest holds sharded tensors).
        snapshotkit_version: version of the snapshotkit that wrote the snapshot.
        torch_version: ``torch.__version__`` of the writer.
        created_at: UTC time the take committed, ISO 8601.
        world_size: number of ranks that took the snapshot.
        manifest: ``"<rank>/<logical path>"`` -> entry, in flatten order.
    """

    format_version: int
    snapshotkit_version: str
    torch_version: str
    created_at: str
    world_size: int
    manifest: dict[str, Entry]

    @property
    def version(self) -> str:
        """The writer's snapshotkit version (torchsnapshot's name for it)."""
        return self.snapshotkit_version

    def to_json_text(self) -> str:
        """The manifest document as JSON text (valid YAML), one entry per line."""
        head = {
            "format": FORMAT_NAME,
            "format_version": self.format_version,
            "snapshotkit_version": self.snapshotkit_version,
            "torch_version": self.torch_version,
            "created_at": self.created_at,
            "world_size": self.world_size,
        }
        encode = _COMPACT_JSON.encode
        lines = ["{"]
        lines.extend(f"{json.dumps(k)}: {json.dumps(v)}," for k, v in head.items())
        if self.manifest:
            lines.append('"manifest": {')
            body = [
                f"{_json_string(k)}: {e.to_json_line() if isinstance(e, TensorEntry) else encode(e.to_json())}"
                for k, e in self.manifest.items()
            ]
            lines.append(",\n".join(body))
            lines.append("}")
        else:
            lines.append('"manifest": {}')
        lines.append("}")
        return "\n".join(lines) + "\n"

    @classmethod
    def from_text(cls, text: str | bytes) -> SnapshotMetadata:
        """Parse a manifest document: JSON, or any YAML a human may have rewritten it as."""
        try:
            document = json.loads(text, object_pairs_hook=_unique_members)
        except _DuplicateMemberError as exc:
            raise ManifestError(
                f"the manifest names {exc.args[0]!r} more than once; it is corrupt or was edited by hand"
            ) from None
        except ValueError:
            document = _load_yaml(text)
        if not isinstance(document, dict):
            raise ManifestError("the manifest is not a mapping; the file is corrupt or not a snapshotkit manifest")
        if document.get("format") != FORMAT_NAME:
            raise ManifestError(
                f"the manifest's format is {document.get('format')!r}, not {FORMAT_NAME!r}; "
                "this is not a snapshotkit snapshot (a torchsnapshot one? restore it with torchsnapshot, "
                "then take it again with snapshotkit)"
            )
        version = document.get("format_version")
        if type(version) is not int or version < 1:
            raise ManifestError(f"format_version {version!r} is not a positive integer")
        if version > FORMAT_VERSION:
            raise UnsupportedFormatVersionError(
                f"this snapshot has format version {version} (written by snapshotkit "
                f"{document.get('snapshotkit_version')!r}); this snapshotkit reads versions up to {FORMAT_VERSION}. "
                "Upgrade: pip install -U snapshotkit"
            )
        head: dict[str, Any] = {}
        for name, expected in (
            ("snapshotkit_version", str),
            ("torch_version", str),
            ("created_at", str),
            ("world_size", int),
        ):
            head[name] = _field("<header>", document, name, expected)
        if head["world_size"] < 1:
            raise ManifestError(f"world_size {head['world_size']!r} must be at least 1")
        raw_manifest = _field("<header>", document, "manifest", dict)
        manifest: dict[str, Entry] = {}
        for key, raw in raw_manifest.items():
            rank, slash, _ = key.partition("/")
            if not slash or _RANK_TEXT.fullmatch(rank) is None or int(rank) >= head["world_size"]:
                raise ManifestError(
                    f"manifest key {key!r} is not '<rank>/<logical path>' with rank < world_size {head['world_size']}"
                )
            entry = decode_entry(key, raw)
            if _KIND_SINCE.get(entry.kind, 1) > version:
                raise _fail(
                    key,
                    f"entry kind {entry.kind!r} needs format version {_KIND_SINCE[entry.kind]}, "
                    f"the manifest says {version}",
                )
            manifest[key] = entry
        check_containers(manifest)
        return cls(format_version=version, manifest=manifest, **head)


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


def _load_yaml(text: str | bytes) -> Any:
    import yaml

    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    try:
        return yaml.load(text, Loader=loader)  # noqa: S506 - a safe loader
    except yaml.YAMLError as exc:
        raise ManifestError(f"the manifest is neither JSON nor YAML ({exc}); the file is corrupt") from None
