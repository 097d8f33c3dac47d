"""What the benchmarks save and load: deterministic states and the raw-disk baselines.

* states described by :class:`TensorSpec` lists, materialised either with seeded random data or
  as zero-filled destinations, plus a bit-exact verifier;
* raw sequential I/O (``writev`` + ``fsync`` / ``readv`` into pre-allocated tensors), the
  ceiling the savers are compared against;
* whether a compared system is installed.

``torch`` / ``numpy`` are imported where they are used, so a launcher importing this stays light.
"""

from __future__ import annotations

import concurrent.futures
import importlib
import math
import os
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .cli import KiB, MiB

if TYPE_CHECKING:  # pragma: no cover - typing only
    import torch

#: Name of the single 4 MiB float32 tensor in the large state that bench_local
#: reads back on its own with ``read_object``.
PROBE_KEY = "probe_4mib"
PROBE_BYTES = 4 * MiB

DTYPE_SIZES = {"float32": 4, "bfloat16": 2}
_GEN_CHUNK_ELEMS = 4 * 1024 * 1024
_SEED_STRIDE = 1_000_003  # per --seed, so states of different seeds share no tensor


# ------------------------------------------------------ Deterministic states
@dataclass(frozen=True)
class TensorSpec:
    """Recipe for one tensor: its key, dtype, shape and generator seed."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    seed: int

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.numel * DTYPE_SIZES[self.dtype]


def _shape_for(numel: int, row: int = 1024) -> tuple[int, ...]:
    return (numel // row, row) if numel % row == 0 and numel >= row else (numel,)


def sized_specs(
    total_bytes: int,
    tensor_bytes: int,
    seed: int,
    *,
    name: str = "layer{:04d}.weight",
    dtypes: Sequence[str] = ("float32",),
    first_seed: int = 1,
) -> list[TensorSpec]:
    """Tensors of ``tensor_bytes`` (the last one shorter) adding up to ``total_bytes``, named
    ``name.format(i)``, their dtypes cycling through ``dtypes``."""
    specs: list[TensorSpec] = []
    remaining, i = total_bytes, 0
    while remaining > 0:
        nbytes = min(tensor_bytes, remaining)
        dtype = dtypes[i % len(dtypes)]
        shape = _shape_for(nbytes // DTYPE_SIZES[dtype])
        specs.append(TensorSpec(name.format(i), dtype, shape, seed * _SEED_STRIDE + first_seed + i))
        remaining -= nbytes
        i += 1
    return specs


def large_state_specs(total_bytes: int, tensor_bytes: int, seed: int) -> list[TensorSpec]:
    """``total_bytes`` of big tensors: one 4 MiB float32 probe tensor plus
    tensors of ``tensor_bytes`` alternating float32 / bfloat16 (the last one
    is shortened so the total is exact)."""
    if total_bytes < PROBE_BYTES + 4 * KiB:
        raise ValueError(f"--large-bytes must be at least {PROBE_BYTES + 4 * KiB}")
    if tensor_bytes % 4:
        raise ValueError("--large-tensor-bytes must be a multiple of 4")
    probe = TensorSpec(PROBE_KEY, "float32", _shape_for(PROBE_BYTES // 4), seed * _SEED_STRIDE)
    rest = (total_bytes - PROBE_BYTES) // 4 * 4
    return [probe, *sized_specs(rest, tensor_bytes, seed, dtypes=("float32", "bfloat16"))]


def small_state_specs(count: int, tensor_bytes: int, seed: int) -> list[TensorSpec]:
    """``count`` 1-D float32 tensors of ``tensor_bytes`` each (bias-like)."""
    if count < 1 or tensor_bytes < 4:
        raise ValueError("--small-count must be >= 1 and --small-bytes >= 4")
    base = seed * _SEED_STRIDE + 500_000
    return [TensorSpec(f"p{i:06d}", "float32", (tensor_bytes // 4,), base + i) for i in range(count)]


def state_bytes(specs: Sequence[TensorSpec]) -> int:
    return sum(s.nbytes for s in specs)


def torch_dtype(name: str) -> torch.dtype:
    import torch

    return {"float32": torch.float32, "bfloat16": torch.bfloat16}[name]


def fill_tensor(t: torch.Tensor, spec: TensorSpec) -> None:
    """Fill ``t`` in place with the spec's deterministic data (values in [0, 1))."""
    import numpy as np
    import torch

    rng = np.random.default_rng(spec.seed)
    flat = t.view(-1)
    for start in range(0, flat.numel(), _GEN_CHUNK_ELEMS):
        part = flat[start : start + _GEN_CHUNK_ELEMS]
        if spec.dtype == "float32":
            rng.random(out=part.numpy(), dtype=np.float32)
        else:  # numpy has no bfloat16: generate float32 and let torch round.
            part.copy_(torch.from_numpy(rng.random(part.numel(), dtype=np.float32)))


def spec_tensor(spec: TensorSpec) -> torch.Tensor:
    """A new tensor holding the spec's data."""
    import torch

    t = torch.empty(spec.shape, dtype=torch_dtype(spec.dtype))
    fill_tensor(t, spec)
    return t


def materialize(specs: Sequence[TensorSpec]) -> dict[str, torch.Tensor]:
    """Build the source state (seeded random data)."""
    return {s.name: spec_tensor(s) for s in specs}


def destination(specs: Sequence[TensorSpec]) -> dict[str, torch.Tensor]:
    """Pre-allocated, zero-filled (so already resident) restore targets."""
    import torch

    return {s.name: torch.zeros(s.shape, dtype=torch_dtype(s.dtype)) for s in specs}


def verify(
    state: Any, specs: Sequence[TensorSpec], *, reference: Mapping[str, Any] | None = None, limit: int = 5
) -> list[str]:
    """Compare ``state`` (a mapping of tensors) bit-exactly with the specs' data -- regenerated,
    or taken from ``reference`` when the caller still holds it; returns up to ``limit`` problem
    descriptions (empty = OK)."""
    import torch

    problems: list[str] = []
    for s in specs:
        got = state.get(s.name) if hasattr(state, "get") else None
        if not isinstance(got, torch.Tensor):
            problems.append(f"{s.name}: missing or not a tensor ({type(got).__name__})")
        elif got.dtype != torch_dtype(s.dtype) or tuple(got.shape) != s.shape:
            problems.append(f"{s.name}: got {got.dtype}{tuple(got.shape)}, want {s.dtype}{s.shape}")
        elif not torch.equal(got, reference[s.name] if reference is not None else spec_tensor(s)):
            problems.append(f"{s.name}: data differs")
        if len(problems) >= limit:
            break
    return problems


def unavailable(needs: Iterable[tuple[str, Sequence[str]]]) -> str | None:
    """None if every ``(module, names)`` imports and has the (dotted) names, else the reason."""
    for module, names in needs:
        try:
            mod = importlib.import_module(module)
        except Exception as exc:
            return f"import {module} failed: {type(exc).__name__}: {exc}"
        missing = [n for n in names if not _has_path(mod, n)]
        if missing:
            return f"{module} lacks {', '.join(missing)}"
    return None


def _has_path(obj: Any, dotted: str) -> bool:
    for part in dotted.split("."):
        if not hasattr(obj, part):
            return False
        obj = getattr(obj, part)
    return True


# ---- Raw sequential I/O (the hardware ceiling the savers are compared with)
RAW_CHUNK = 64 * MiB
IOV_MAX = min(os.sysconf("SC_IOV_MAX") if hasattr(os, "sysconf") else 1024, 1024)
RAW_PARALLEL_STREAMS = 4


def byte_views(tensors: Iterable[Any]) -> list[memoryview]:
    """Zero-copy byte views of the tensors, split into <= RAW_CHUNK pieces."""
    import torch

    views: list[memoryview] = []
    for t in tensors:
        mv = memoryview(t.reshape(-1).view(torch.uint8).numpy())
        views.extend(mv[off : off + RAW_CHUNK] for off in range(0, len(mv), RAW_CHUNK))
    return views


def _batches(views: list[memoryview]) -> Iterator[list[memoryview]]:
    batch: list[memoryview] = []
    size = 0
    for v in views:
        if batch and (size + len(v) > RAW_CHUNK or len(batch) >= IOV_MAX):
            yield batch
            batch, size = [], 0
        batch.append(v)
        size += len(v)
    if batch:
        yield batch


def _transfer_all(fn: Callable[[int, list[memoryview]], int], fd: int, batch: list[memoryview]) -> None:
    """Call os.writev/os.readv until every buffer is fully transferred."""
    i = 0
    batch = list(batch)
    while i < len(batch):
        n = fn(fd, batch[i:])
        if n <= 0:
            raise OSError(f"{fn.__name__} transferred {n} bytes (unexpected EOF?)")
        while i < len(batch) and n >= len(batch[i]):
            n -= len(batch[i])
            i += 1
        if n:
            batch[i] = batch[i][n:]


def _fsync(path: str | os.PathLike[str]) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_file(path: str, views: list[memoryview]) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        for batch in _batches(views):
            _transfer_all(os.writev, fd, batch)
        os.fsync(fd)
    finally:
        os.close(fd)


def _read_file(path: str, views: list[memoryview]) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        for batch in _batches(views):
            _transfer_all(os.readv, fd, batch)
    finally:
        os.close(fd)


def raw_save(path: str, state: dict[str, Any]) -> None:
    _write_file(path, byte_views(state.values()))


def raw_load(path: str, dst: dict[str, Any]) -> None:
    _read_file(path, byte_views(dst.values()))


def _split_even(views: list[memoryview], parts: int) -> list[list[memoryview]]:
    """Consecutive groups of views with about the same number of bytes each."""
    total = sum(len(v) for v in views)
    groups: list[list[memoryview]] = [[] for _ in range(parts)]
    done = 0
    for v in views:
        groups[min(parts - 1, done * parts // max(total, 1))].append(v)
        done += len(v)
    return groups


def _parallel(fn: Callable[[str, list[memoryview]], None], path: str, state: dict[str, Any]) -> None:
    """``fn(part file, its views)`` for the RAW_PARALLEL_STREAMS part files, one thread each."""
    paths = [os.path.join(path, f"part{i}") for i in range(RAW_PARALLEL_STREAMS)]
    groups = _split_even(byte_views(state.values()), RAW_PARALLEL_STREAMS)
    with concurrent.futures.ThreadPoolExecutor(len(paths)) as pool:
        list(pool.map(fn, paths, groups))


def raw_save_parallel(path: str, state: dict[str, Any]) -> None:
    """The same bytes as :func:`raw_save`, as RAW_PARALLEL_STREAMS files written (and fsynced)
    by as many threads at once: the best a raw writer does on a device that likes queue depth."""
    os.makedirs(path, exist_ok=True)
    _parallel(_write_file, path, state)
    _fsync(path)


def raw_load_parallel(path: str, dst: dict[str, Any]) -> None:
    _parallel(_read_file, path, dst)


def fsync_tree(path: str | os.PathLike[str]) -> None:
    """fsync every regular file under ``path`` (or ``path`` itself) and the
    directories that contain them."""
    p = Path(path)
    files = [p] if p.is_file() else [q for q in p.rglob("*") if q.is_file()]
    dirs = {q.parent for q in files} | ({p} if p.is_dir() else set())
    for q in [*files, *dirs]:
        _fsync(q)


def tree_bytes(path: str | os.PathLike[str]) -> int:
    p = Path(path)
    if p.is_file():
        return p.stat().st_size
    return sum(q.stat().st_size for q in p.rglob("*") if q.is_file())
