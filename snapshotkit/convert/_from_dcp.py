"""A DCP (``torch.distributed.checkpoint``) checkpoint directory as app state.

The layout ``FileSystemWriter`` writes: ``.metadata`` is a pickled ``Metadata`` whose
``state_dict_metadata`` describes every flattened key (fqn) as a tensor (dtype, global size, the
chunks it was saved in) or as bytes (any other value); ``storage_data`` maps (fqn, chunk offsets)
to a byte range of a ``*.distcp`` file holding one ``torch.save`` archive; ``planner_data`` maps
each fqn to its path in the nested state dict (``"model.0.weight" -> ("model", "0.weight")``).

None of DCP's loading code runs (it unpickles ``.metadata`` with plain ``pickle`` and values with
``weights_only=False``): ``.metadata`` goes through an unpickler that builds only DCP's metadata
classes (plain pickle only with ``weights_only=False``); a tensor chunk loads through torch's
weights-only unpickler with its storage *mapped* from the ``.distcp`` file, as
``torch.load(mmap=True)`` maps a whole file; other values load with
``torch.load(weights_only=weights_only)``. A tensor saved in several chunks (several ranks) is
assembled in memory.

DCP stores dict keys as strings: an optimizer state dict (``state`` and ``param_groups`` whose
``params`` are ints) gets its int parameter ids back, so ``optimizer.load_state_dict`` takes it.
"""

from __future__ import annotations

import importlib
import io
import itertools
import math
import pickle
from pathlib import Path
from typing import Any

import torch

from snapshotkit._format.foreign import DCP_METADATA
from snapshotkit.convert._files import MappedFiles
from snapshotkit.convert._source import Loaded, load_object, split_top_level
from snapshotkit.errors import ImportSourceError

_DCP = "torch.distributed.checkpoint"
#: The classes a DCP ``.metadata`` pickle may build: module -> names.
_METADATA_CLASSES = {
    f"{_DCP}.metadata": {
        "Metadata",
        "TensorStorageMetadata",
        "BytesStorageMetadata",
        "ChunkStorageMetadata",
        "TensorProperties",
        "MetadataIndex",
        "StorageMeta",
        "_MEM_FORMAT_ENCODING",
    },
    f"{_DCP}.filesystem": {"_StorageInfo"},
    "torch.distributed._shard.sharded_tensor.metadata": {"TensorProperties", "MEM_FORMAT_ENCODING"},
    "torch.serialization": {"_get_layout"},
    "torch": {"Size"},
    "pathlib": {"PosixPath", "PurePosixPath", "WindowsPath", "PureWindowsPath"},
    "pathlib._local": {"PosixPath", "PurePosixPath", "WindowsPath", "PureWindowsPath"},
    "collections": {"OrderedDict"},
}


def read_dcp(src: Path, *, key: str, weights_only: bool) -> Loaded:
    """The state of the DCP checkpoint in directory ``src``.

    Raises:
        UnsafeObjectError: ``weights_only`` refused a value.
        ImportSourceError: ``.metadata`` is not DCP's (or not allowed by ``weights_only``), a data
            file is missing or truncated, or a chunk is not what ``.metadata`` says.
    """
    metadata = _read_metadata(src, weights_only=weights_only)
    files = MappedFiles(src, src)
    infos = {(index.fqn, _offsets(index.offset)): info for index, info in metadata.storage_data.items()}
    planner_data = getattr(metadata, "planner_data", None)
    paths: dict[str, tuple[Any, ...]] = {}
    if isinstance(planner_data, dict):
        paths.update((fqn, tuple(path)) for fqn, path in planner_data.items() if fqn in metadata.state_dict_metadata)
    paths.update((fqn, (fqn,)) for fqn in metadata.state_dict_metadata if fqn not in paths)
    flat: dict[tuple[Any, ...], Any] = {}
    for fqn, path in paths.items():
        item = metadata.state_dict_metadata[fqn]
        if hasattr(item, "chunks"):
            flat[path] = _tensor(files, infos, fqn, item, src)
        else:
            info = _info(infos, fqn, None, src)
            where = files.resolve(info.relative_path, f"value {fqn!r}")
            data = files.read_bytes(where, info.offset, info.offset + info.length, f"value {fqn!r}")
            flat[path] = load_object(data, weights_only=weights_only, what=f"value {fqn!r}", src=src)
    root = _nest(flat, src)
    _restore_param_ids(root)
    return Loaded(split_top_level(root, key))


class _MetadataUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        allowed = _METADATA_CLASSES.get(module, set())
        if name in allowed:
            return getattr(importlib.import_module(module), name)
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        raise pickle.UnpicklingError(f"{module}.{name} is not a class DCP metadata is made of")


def _read_metadata(src: Path, *, weights_only: bool) -> Any:
    path = src / DCP_METADATA
    try:
        with open(path, "rb") as f:
            metadata = _MetadataUnpickler(f).load() if weights_only else pickle.load(f)  # noqa: S301 - opted in
    except pickle.UnpicklingError as exc:
        raise ImportSourceError(
            f"{path} is not DCP metadata import can read safely ({exc}); if you trust this checkpoint, pass "
            "weights_only=False to import_snapshot"
        ) from exc
    except Exception as exc:
        raise ImportSourceError(f"{path} cannot be unpickled as DCP metadata ({exc}); it is corrupt") from exc
    if not (isinstance(getattr(metadata, "state_dict_metadata", None), dict) and hasattr(metadata, "storage_data")):
        raise ImportSourceError(f"{path} holds a {type(metadata).__name__}, not DCP Metadata")
    return metadata


def _offsets(offset: Any) -> tuple[int, ...] | None:
    return None if offset is None else tuple(int(o) for o in offset)


def _info(infos: dict[tuple[str, Any], Any], fqn: str, offsets: tuple[int, ...] | None, src: Path) -> Any:
    info = infos.get((fqn, offsets))
    if info is None:
        where = "" if offsets is None else f" (chunk at offsets {list(offsets)})"
        raise ImportSourceError(f"{src}/{DCP_METADATA} says where every value is, but not {fqn!r}{where}")
    if getattr(info, "transform_descriptors", None):
        raise ImportSourceError(
            f"{src}: {fqn!r} is stored through DCP extensions {list(info.transform_descriptors)} (compression?), "
            "which import does not read; load the checkpoint with DCP and torch.save it, then import that file"
        )
    return info


def _tensor(files: MappedFiles, infos: dict[tuple[str, Any], Any], fqn: str, item: Any, src: Path) -> torch.Tensor:
    dtype, size = item.properties.dtype, tuple(int(s) for s in item.size)
    chunks = [(tuple(int(o) for o in c.offsets), tuple(int(s) for s in c.sizes)) for c in item.chunks]
    if len(chunks) == 1 and chunks[0] == ((0,) * len(size), size):
        return _chunk(files, _info(infos, fqn, chunks[0][0], src), fqn, dtype, size, src)
    full = torch.empty(size, dtype=dtype)
    covered = 0
    for offsets, sizes in chunks:
        chunk = _chunk(files, _info(infos, fqn, offsets, src), fqn, dtype, sizes, src)
        box = full
        for dim, (offset, length) in enumerate(zip(offsets, sizes, strict=True)):
            box = box.narrow(dim, offset, length)
        box.copy_(chunk)
        covered += math.prod(sizes)
    if covered != full.numel():
        raise ImportSourceError(
            f"{src}: the chunks of tensor {fqn!r} hold {covered} elements of its {full.numel()}; the checkpoint "
            "is incomplete"
        )
    return full


def _chunk(
    files: MappedFiles, info: Any, fqn: str, dtype: torch.dtype, sizes: tuple[int, ...], src: Path
) -> torch.Tensor:
    what = f"tensor {fqn!r}"
    path = files.resolve(info.relative_path, what)
    start, end = info.offset, info.offset + info.length
    files.check_range(path, start, end, what)
    try:
        value = _load_mapped(files, path, start, end, what)
    except Exception:  # a torch without the private loader used: read it instead (same result)
        value = load_object(files.read_bytes(path, start, end, what), weights_only=True, what=what, src=src)
    if not isinstance(value, torch.Tensor) or value.dtype != dtype or tuple(value.shape) != sizes:
        found = f"{value.dtype} {list(value.shape)}" if isinstance(value, torch.Tensor) else type(value).__name__
        raise ImportSourceError(
            f"{src}: {what} should be {dtype} {list(sizes)} at bytes [{start}, {end}) of {info.relative_path}, "
            f"but that holds {found}; the checkpoint is corrupt"
        )
    return value


def _load_mapped(files: MappedFiles, path: Path, start: int, end: int, what: str) -> Any:
    """The tensor in the ``torch.save`` archive at ``[start, end)``, its storage mapped (not read)."""
    from torch import _weights_only_unpickler

    window = files.storage_window(path, start, end, what)
    with open(path, "rb") as f:
        reader = io.BufferedReader(_Window(f, start, end - start))
        with torch.serialization._open_zipfile_reader(reader) as archive:
            # What torch.load(mmap=True, weights_only=True) does, for an archive inside a file.
            load: Any = torch.serialization._load
            return load(archive, "cpu", _weights_only_unpickler, overall_storage=window)


class _Window(io.RawIOBase):
    """A read-only file object over bytes ``[start, start + length)`` of an open file."""

    def __init__(self, f: Any, start: int, length: int) -> None:
        super().__init__()
        self._f, self._start, self._length, self._position = f, start, length, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._position

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._position, io.SEEK_END: self._length}[whence]
        self._position = max(0, base + offset)
        return self._position

    def readinto(self, buffer: Any) -> int:
        count = max(0, min(len(buffer), self._length - self._position))
        self._f.seek(self._start + self._position)
        got: int = self._f.readinto(memoryview(buffer)[:count])
        self._position += got
        return got


def _nest(flat: dict[tuple[Any, ...], Any], src: Path) -> dict[str, Any]:
    """The nested state dict from ``path -> value`` (an int path part indexes a list)."""
    root: dict[str, Any] = {}
    for path, value in flat.items():
        node: Any = root
        for part, following in itertools.pairwise(path):
            child = _child(node, part)
            if child is None:
                child = [] if isinstance(following, int) else {}
                _put(node, part, child, path, src)
            node = child
        _put(node, path[-1], value, path, src)
    return root


def _child(node: Any, part: Any) -> Any:
    if isinstance(node, dict):
        return node.get(part)
    return node[part] if isinstance(part, int) and part < len(node) else None


def _put(node: Any, part: Any, value: Any, path: tuple[Any, ...], src: Path) -> None:
    if isinstance(node, dict) and not isinstance(part, int):
        node[part] = value
    elif isinstance(node, list) and isinstance(part, int):
        node.extend([None] * (part + 1 - len(node)))
        node[part] = value
    else:
        raise ImportSourceError(f"{src}/{DCP_METADATA}: the paths of the values disagree at {path!r}")


def _restore_param_ids(obj: Any) -> None:
    """Give optimizer state dicts below ``obj`` their int parameter ids back (see the module docstring)."""
    stack = [obj]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            state, groups = node.get("state"), node.get("param_groups")
            if isinstance(state, dict) and state and isinstance(groups, list):
                ids = {
                    str(param): param
                    for group in groups
                    if isinstance(group, dict)
                    for param in group.get("params") or ()
                    if type(param) is int
                }
                if all(isinstance(name, str) and name in ids for name in state):
                    node["state"] = {ids[name]: value for name, value in state.items()}
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
