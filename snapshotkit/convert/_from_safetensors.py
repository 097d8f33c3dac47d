"""A safetensors file, or a Hugging Face sharded directory, as the state dict of one app-state key.

The format (https://github.com/huggingface/safetensors, "Format"): an 8-byte little-endian
header size N, N bytes of a JSON object mapping each tensor name to ``{"dtype", "shape",
"data_offsets": [begin, end]}`` (offsets relative to the end of the header; an optional
``"__metadata__"`` of strings), then the data, little-endian, row-major. The header is parsed
here, strictly (safetensors is not a dependency), and each tensor maps its byte range of the
file. A sharded checkpoint's ``*.safetensors.index.json`` maps every tensor name to its file
(``{"weight_map": {name: "model-00001-of-00002.safetensors"}}``).
"""

from __future__ import annotations

import json
import math
import struct
import sys
from pathlib import Path
from typing import Any

import torch

from snapshotkit._format.foreign import SAFETENSORS_INDEX_SUFFIX, SAFETENSORS_MAX_HEADER_BYTES
from snapshotkit._text import first_few
from snapshotkit.convert._files import MappedFiles
from snapshotkit.convert._source import Loaded
from snapshotkit.errors import ImportSourceError

#: safetensors dtype names -> torch dtypes (those this torch has).
_DTYPES: dict[str, torch.dtype] = {
    name: getattr(torch, attr)
    for name, attr in {
        "BOOL": "bool",
        "U8": "uint8",
        "I8": "int8",
        "U16": "uint16",
        "I16": "int16",
        "U32": "uint32",
        "I32": "int32",
        "U64": "uint64",
        "I64": "int64",
        "F16": "float16",
        "BF16": "bfloat16",
        "F32": "float32",
        "F64": "float64",
        "C64": "complex64",
        "F8_E4M3": "float8_e4m3fn",
        "F8_E4M3FNUZ": "float8_e4m3fnuz",
        "F8_E5M2": "float8_e5m2",
        "F8_E5M2FNUZ": "float8_e5m2fnuz",
        "F8_E8M0": "float8_e8m0fnu",
    }.items()
    if hasattr(torch, attr)
}
#: The largest ``__metadata__`` recorded in the snapshot's user metadata, as JSON.
_MAX_RECORDED_METADATA_BYTES = 64 * 1024


def read_safetensors(src: Path, *, key: str, weights_only: bool) -> Loaded:
    """The tensors of ``src`` (a ``.safetensors`` file, an index, or a directory holding one of
    them) as the state dict of app-state key ``key``; ``weights_only`` has nothing to refuse.

    Raises:
        ImportSourceError: a header or the index is malformed, a file is missing or truncated.
    """
    del weights_only  # safetensors holds no pickles
    if src.is_dir():
        indexes = sorted(src.glob("*" + SAFETENSORS_INDEX_SUFFIX))
        singles = sorted(src.glob("*.safetensors"))
        if len(indexes) == 1 or (not indexes and len(singles) == 1):
            src = indexes[0] if indexes else singles[0]
        else:
            found = [p.name for p in indexes] or [p.name for p in singles]
            raise ImportSourceError(
                f"{src} holds {len(found)} candidate safetensors sources ({first_few(found, show=str)}); import one: "
                "pass its path as src"
            )
    if src.name.endswith(SAFETENSORS_INDEX_SUFFIX):
        return _read_index(src, key)
    files = MappedFiles(src.parent, src)
    tensors, metadata = _read_file(files, files.resolve(src.name, "the file"), src)
    provenance: dict[str, Any] = {}
    if metadata and len(json.dumps(metadata)) <= _MAX_RECORDED_METADATA_BYTES:
        provenance["safetensors_metadata"] = metadata
    return Loaded({key: tensors}, provenance=provenance)


def _read_index(index: Path, key: str) -> Loaded:
    try:
        document = json.loads(index.read_bytes())
    except (OSError, ValueError) as exc:
        raise ImportSourceError(f"{index} is not a readable JSON index ({exc})") from exc
    weight_map = document.get("weight_map") if isinstance(document, dict) else None
    if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
        raise ImportSourceError(
            f'{index} has no "weight_map" object of tensor name -> file name; it is not a Hugging Face '
            "safetensors index"
        )
    files = MappedFiles(index.parent, index)
    tensors: dict[str, torch.Tensor] = {}
    for name in dict.fromkeys(weight_map.values()):
        found, _ = _read_file(files, files.resolve(name, "the index"), index)
        for tensor_name, tensor in found.items():
            if tensor_name in tensors:
                raise ImportSourceError(f"{index}: tensor {tensor_name!r} is in more than one file (also {name!r})")
            tensors[tensor_name] = tensor
    missing = [name for name in weight_map if name not in tensors]
    if missing:
        raise ImportSourceError(
            f"{index} maps {len(missing)} tensor(s) to files that do not hold them, e.g. {missing[0]!r} -> "
            f"{weight_map[missing[0]]!r}; the checkpoint is incomplete or mixed from two downloads"
        )
    return Loaded({key: tensors})


def _read_file(files: MappedFiles, path: Path, src: Path) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """A file's tensors (in data order) and its ``__metadata__``."""
    if sys.byteorder != "little":  # pragma: no cover - no big-endian CI
        raise ImportSourceError("safetensors data is little-endian; importing it on a big-endian host is unsupported")
    header, data_start = _header(files, path, src)
    metadata = header.pop("__metadata__", None) or {}
    if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
        raise ImportSourceError(f'{path}: "__metadata__" must map strings to strings')
    described = [_describe(path, name, raw) for name, raw in header.items()]
    described.sort(key=lambda item: (item[3], item[4]))
    tensors: dict[str, torch.Tensor] = {}
    previous_end, previous_name = 0, ""
    for name, dtype, shape, begin, end in described:
        if begin < previous_end:
            raise ImportSourceError(f"{path}: tensors {previous_name!r} and {name!r} overlap; the file is corrupt")
        tensors[name] = files.tensor(path, data_start + begin, dtype, shape, f"tensor {name!r}")
        previous_end, previous_name = end, name
    return tensors, metadata


def _header(files: MappedFiles, path: Path, src: Path) -> tuple[dict[str, Any], int]:
    size = files.size_bytes(path)
    prefix = files.read_bytes(path, 0, min(8, size), "the header size") if size else b""
    (header_bytes,) = struct.unpack("<Q", prefix) if len(prefix) == 8 else (-1,)
    if not 2 <= header_bytes <= min(SAFETENSORS_MAX_HEADER_BYTES, size - 8):
        raise ImportSourceError(
            f"{path} is not a safetensors file: its first 8 bytes give a header size of {header_bytes} for a file "
            f"of {size} bytes" + (f" (read as the safetensors source {src})" if src != path else "")
        )
    raw = files.read_bytes(path, 8, 8 + header_bytes, "the header")
    try:
        header = json.loads(raw.decode("utf-8"), object_pairs_hook=_unique)
    except (UnicodeDecodeError, ValueError) as exc:
        raise ImportSourceError(
            f"{path}: the safetensors header is not valid JSON ({exc}); the file is corrupt"
        ) from exc
    if not isinstance(header, dict):
        raise ImportSourceError(f"{path}: the safetensors header is not a JSON object; the file is corrupt")
    return header, 8 + header_bytes


def _describe(path: Path, name: str, raw: object) -> tuple[str, torch.dtype, tuple[int, ...], int, int]:
    if not isinstance(raw, dict):
        raise ImportSourceError(f"{path}: header entry {name!r} is not an object")
    dtype_text, shape, offsets = raw.get("dtype"), raw.get("shape"), raw.get("data_offsets")
    dtype = _DTYPES.get(dtype_text) if isinstance(dtype_text, str) else None
    if dtype is None:
        raise ImportSourceError(
            f"{path}: tensor {name!r} has dtype {dtype_text!r}, which this import does not read (torch "
            f"{torch.__version__} reads {', '.join(sorted(_DTYPES))})"
        )
    if not (isinstance(shape, list) and all(type(d) is int and d >= 0 for d in shape)):
        raise ImportSourceError(f"{path}: tensor {name!r} has shape {shape!r}, not a list of sizes")
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(type(o) is int and o >= 0 for o in offsets)):
        raise ImportSourceError(f"{path}: tensor {name!r} has data_offsets {offsets!r}, not [begin, end]")
    begin, end = offsets
    needed = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
    if end - begin != needed:
        raise ImportSourceError(
            f"{path}: tensor {name!r} ({dtype_text} {shape}) needs {needed} bytes but its data_offsets span "
            f"{end - begin}; the file is corrupt"
        )
    return name, dtype, tuple(shape), begin, end


def _unique(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    found = dict(pairs)
    if len(found) != len(pairs):
        raise ValueError("a name appears twice")
    return found
