"""What a local path holds, for ``import_snapshot``: which reader opens it, and where.

A directory, by what it holds (the first that applies):

    .snapshot_metadata  ours: refused (it already is a snapshot); torchsnapshot's: torchsnapshot
    .metadata + *.distcp                        dcp
    one *.safetensors.index.json                safetensors (a Hugging Face sharded checkpoint)
    one *.safetensors                           safetensors
    one *.pt / *.pth / *.bin / *.ckpt that is a torch.save file           torch

A file, by its first bytes (:func:`snapshotkit._format.foreign.classify_file`): a torch.save
zip or legacy pickle is ``torch``; a safetensors header is ``safetensors``. A ``.snapshot_metadata``
or DCP ``.metadata`` file stands for its directory, a ``*.safetensors.index.json`` for its
sharded checkpoint. The rules are the ones ``Snapshot(path)`` uses to name what it found.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

from snapshotkit._format.codec import decode_document
from snapshotkit._format.entries import FORMAT_NAME, METADATA_FILENAME
from snapshotkit._format.foreign import (
    DCP_METADATA,
    SAFETENSORS_INDEX_SUFFIX,
    SOURCE_FORMATS,
    classify_file,
    is_torchsnapshot_document,
)
from snapshotkit._text import first_few
from snapshotkit.errors import Advice, ImportSourceError, SnapshotkitError

_TORCH_SUFFIXES = (".pt", ".pth", ".bin", ".ckpt")


@dataclasses.dataclass(frozen=True)
class Detected:
    """A source: its format (one of ``SOURCE_FORMATS``), what its reader opens, and what it is.

    Attributes:
        source_format: ``"dcp"``, ``"safetensors"``, ``"torch"`` or ``"torchsnapshot"``.
        path: the file or directory the reader opens.
        description: for messages ("a DCP checkpoint").
    """

    source_format: str
    path: Path
    description: str


def detect(src: Path, source: str | None = None) -> Detected:
    """The source at ``src``: detected, or (``source`` given) checked to be of that format.

    Raises:
        ImportSourceError: nothing is at ``src``; it is already a snapshot; no format matches; it
            matches several alike (two torch files); or it is not the ``source`` format.
    """
    if not src.exists():
        raise ImportSourceError(f"nothing is at {src}; pass the path of a checkpoint file or directory")
    if src.is_dir():
        candidates = _in_directory(src)
    elif src.is_file():
        candidates = _of_file(src)
    else:
        raise ImportSourceError(f"{src} is neither a regular file nor a directory")
    if source is not None:
        matching = [c for c in candidates if c.source_format == source]
        if matching:
            return _one(src, matching)
        if source == "torch" and src.is_file() and not candidates:
            return Detected("torch", src, "a file")  # a torch.save variant the sniffing misses: torch.load decides
        found = f"it holds {candidates[0].description}" if candidates else "its format is not recognized"
        problem = f"{src} is not a {source} checkpoint: {found}"
        error = ImportSourceError(f"source={source!r} was given, but {problem}")
        raise error.advised(Advice(problem, "format_given", (source,)))
    if not candidates:
        problem = (
            f"{src} is not a checkpoint import recognizes ({_contents(src)}); it reads torch.save files, safetensors "
            "files and Hugging Face sharded directories, DCP and torchsnapshot directories"
        )
        error = ImportSourceError(f"{problem} (source= one of {', '.join(SOURCE_FORMATS)})")
        raise error.advised(Advice(problem, "name_the_format", tuple(SOURCE_FORMATS)))
    return _one(src, [c for c in candidates if c.source_format == candidates[0].source_format])


def _one(src: Path, candidates: list[Detected]) -> Detected:
    if len(candidates) > 1:
        names = first_few(candidates, show=lambda c: c.path.name)
        raise ImportSourceError(
            f"{src} holds {len(candidates)} {candidates[0].source_format} checkpoints ({names}); import one at a "
            "time: pass its path as src"
        )
    return candidates[0]


def _in_directory(src: Path) -> list[Detected]:
    names = sorted(os.listdir(src))
    if METADATA_FILENAME in names:
        return [_manifest_owner(src)]
    found: list[Detected] = []
    if DCP_METADATA in names and any(name.endswith(".distcp") for name in names):
        found.append(Detected("dcp", src, "a DCP (torch.distributed.checkpoint) checkpoint"))
    indexes = [name for name in names if name.endswith(SAFETENSORS_INDEX_SUFFIX)]
    found.extend(Detected("safetensors", src / name, f"a Hugging Face sharded checkpoint ({name})") for name in indexes)
    if not indexes:
        found.extend(
            Detected("safetensors", src / name, f"a safetensors file ({name})")
            for name in names
            if name.endswith(".safetensors") and _head_format(src / name) == "safetensors"
        )
    found.extend(
        Detected("torch", src / name, f"a torch.save file ({name})")
        for name in names
        if name.endswith(_TORCH_SUFFIXES) and _head_format(src / name) == "torch"
    )
    return found


def _of_file(src: Path) -> list[Detected]:
    if src.name == METADATA_FILENAME:
        return [_manifest_owner(src.parent)]
    if src.name == DCP_METADATA:
        return [c for c in _in_directory(src.parent) if c.source_format == "dcp"]
    if src.name.endswith(SAFETENSORS_INDEX_SUFFIX):
        return [Detected("safetensors", src, "a Hugging Face sharded checkpoint")]
    kind = _head_format(src)
    if kind == "torch":
        return [Detected("torch", src, "a torch.save file")]
    if kind == "safetensors":
        return [Detected("safetensors", src, "a safetensors file")]
    return []


def _manifest_owner(directory: Path) -> Detected:
    """Whose ``.snapshot_metadata`` this is: torchsnapshot's, or ours (refused)."""
    data = (directory / METADATA_FILENAME).read_bytes()
    try:
        document = decode_document(data)
    except (SnapshotkitError, ValueError) as exc:
        raise ImportSourceError(f"{directory}/{METADATA_FILENAME} cannot be parsed ({exc}); it is corrupt") from exc
    if is_torchsnapshot_document(document):
        return Detected("torchsnapshot", directory, "a torchsnapshot snapshot")
    if document.get("format") == FORMAT_NAME:
        raise ImportSourceError(
            f"{directory} already is a snapshotkit snapshot: open it with Snapshot({str(directory)!r}); there is "
            "nothing to import"
        )
    raise ImportSourceError(f"{directory}/{METADATA_FILENAME} is neither a snapshotkit nor a torchsnapshot manifest")


def _head_format(path: Path) -> str | None:
    found = classify_file(path)
    return None if found is None else found.source_format


def _contents(src: Path) -> str:
    if src.is_file():
        with open(src, "rb") as f:
            return f"a file beginning {f.read(16)!r}"
    names = sorted(os.listdir(src))
    if not names:
        return "an empty directory"
    return f"a directory holding {first_few(names, show=str)}"
