"""Shared helpers for the snapshotkit benchmark scripts.

Contents:

* raw sequential I/O (``writev`` + ``fsync`` / ``readv`` into pre-allocated
  tensors), the ceiling the savers are compared against;
* deterministic benchmark states (``large`` / ``small``) described by
  :class:`TensorSpec` lists, materialised either with seeded random data or as
  zero-filled destinations, plus a bit-exact verifier;
* process measurement helpers (current RSS, peak-RSS reset, ``/proc/self/io``
  counters, page-cache dropping);
* machine facts for the JSON report;
* :class:`Launcher`, which runs one measured operation in a fresh process;
* size parsing (``64MiB``) and formatting helpers for the human-readable table.

Only the standard library is imported at module level; ``torch`` / ``numpy``
are imported lazily so the benchmark driver stays light.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover - typing only
    import torch

KiB = 1024
MiB = 1024 * KiB
GiB = 1024 * MiB

#: Name of the single 4 MiB float32 tensor in the large state that the
#: benchmark reads back on its own with ``read_object``.
PROBE_KEY = "probe_4mib"
PROBE_BYTES = 4 * MiB

_DTYPE_SIZES = {"float32": 4, "bfloat16": 2}
_GEN_CHUNK_ELEMS = 4 * 1024 * 1024
DROP_CACHES = "/proc/sys/vm/drop_caches"


# --------------------------------------------------------------------------- #
# Deterministic states
# --------------------------------------------------------------------------- #
@dataclass(frozen=True)
class TensorSpec:
    """Recipe for one tensor: its key, dtype, shape and generator seed."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    seed: int

    @property
    def numel(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n

    @property
    def nbytes(self) -> int:
        return self.numel * _DTYPE_SIZES[self.dtype]


def _shape_for(numel: int, row: int = 1024) -> tuple[int, ...]:
    return (numel // row, row) if numel % row == 0 and numel >= row else (numel,)


def large_state_specs(total_bytes: int, tensor_bytes: int, seed: int) -> list[TensorSpec]:
    """``total_bytes`` of big tensors: one 4 MiB float32 probe tensor plus
    tensors of ``tensor_bytes`` alternating float32 / bfloat16 (the last one
    is shortened so the total is exact)."""
    if total_bytes < PROBE_BYTES + 4 * KiB:
        raise ValueError(f"--large-bytes must be at least {PROBE_BYTES + 4 * KiB}")
    if tensor_bytes % 4:
        raise ValueError("--large-tensor-bytes must be a multiple of 4")
    specs = [TensorSpec(PROBE_KEY, "float32", _shape_for(PROBE_BYTES // 4), seed * 1_000_003)]
    remaining = (total_bytes - PROBE_BYTES) // 4 * 4
    i = 0
    while remaining > 0:
        nbytes = min(tensor_bytes, remaining)
        dtype = "float32" if i % 2 == 0 else "bfloat16"
        numel = nbytes // _DTYPE_SIZES[dtype]
        specs.append(TensorSpec(f"layer{i:04d}.weight", dtype, _shape_for(numel), seed * 1_000_003 + i + 1))
        remaining -= nbytes
        i += 1
    return specs


def small_state_specs(count: int, tensor_bytes: int, seed: int) -> list[TensorSpec]:
    """``count`` 1-D float32 tensors of ``tensor_bytes`` each (bias-like)."""
    if count < 1 or tensor_bytes < 4:
        raise ValueError("--small-count must be >= 1 and --small-bytes >= 4")
    base = seed * 1_000_003 + 500_000
    return [TensorSpec(f"p{i:06d}", "float32", (tensor_bytes // 4,), base + i) for i in range(count)]


def state_bytes(specs: Sequence[TensorSpec]) -> int:
    return sum(s.nbytes for s in specs)


def _torch_dtype(name: str) -> torch.dtype:
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


def materialize(specs: Sequence[TensorSpec]) -> dict[str, torch.Tensor]:
    """Build the source state (seeded random data)."""
    import torch

    out: dict[str, torch.Tensor] = {}
    for s in specs:
        t = torch.empty(s.shape, dtype=_torch_dtype(s.dtype))
        fill_tensor(t, s)
        out[s.name] = t
    return out


def destination(specs: Sequence[TensorSpec]) -> dict[str, torch.Tensor]:
    """Pre-allocated, zero-filled (so already resident) restore targets."""
    import torch

    return {s.name: torch.zeros(s.shape, dtype=_torch_dtype(s.dtype)) for s in specs}


def verify(state: Any, specs: Sequence[TensorSpec], limit: int = 5) -> list[str]:
    """Compare ``state`` (a mapping of tensors) bit-exactly with the specs'
    data; returns up to ``limit`` problem descriptions (empty = OK)."""
    import torch

    problems: list[str] = []
    for s in specs:
        got = state.get(s.name) if hasattr(state, "get") else None
        if not isinstance(got, torch.Tensor):
            problems.append(f"{s.name}: missing or not a tensor ({type(got).__name__})")
        elif got.dtype != _torch_dtype(s.dtype) or tuple(got.shape) != s.shape:
            problems.append(f"{s.name}: got {got.dtype}{tuple(got.shape)}, want {s.dtype}{s.shape}")
        else:
            want = torch.empty(s.shape, dtype=got.dtype)
            fill_tensor(want, s)
            if not torch.equal(got, want):
                problems.append(f"{s.name}: data differs")
        if len(problems) >= limit:
            break
    return problems


# --------------------------------------------------------------------------- #
# Raw sequential I/O (the hardware ceiling the savers are compared with)
# --------------------------------------------------------------------------- #
RAW_CHUNK = 64 * MiB
IOV_MAX = min(os.sysconf("SC_IOV_MAX") if hasattr(os, "sysconf") else 1024, 1024)


def _byte_views(tensors: Any) -> list[memoryview]:
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


def raw_save(path: str, state: dict[str, Any]) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        for batch in _batches(_byte_views(state.values())):
            _transfer_all(os.writev, fd, batch)
        os.fsync(fd)
    finally:
        os.close(fd)


def raw_load(path: str, dst: dict[str, Any]) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        for batch in _batches(_byte_views(dst.values())):
            _transfer_all(os.readv, fd, batch)
    finally:
        os.close(fd)


RAW_PARALLEL_STREAMS = 4


def _split_even(views: list[memoryview], parts: int) -> list[list[memoryview]]:
    """Consecutive groups of views with about the same number of bytes each."""
    total = sum(len(v) for v in views)
    groups: list[list[memoryview]] = [[] for _ in range(parts)]
    done = 0
    for v in views:
        groups[min(parts - 1, done * parts // max(total, 1))].append(v)
        done += len(v)
    return groups


def _parallel(fn: Callable[[int, list[memoryview]], None], paths: list[str], groups: list[list[memoryview]]) -> None:
    import concurrent.futures

    with concurrent.futures.ThreadPoolExecutor(len(paths)) as pool:
        list(pool.map(fn, range(len(paths)), groups))


def raw_save_parallel(path: str, state: dict[str, Any]) -> None:
    """The same bytes as :func:`raw_save`, as RAW_PARALLEL_STREAMS files written (and fsynced)
    by as many threads at once: the best a raw writer does on a device that likes queue depth."""
    os.makedirs(path, exist_ok=True)
    paths = [os.path.join(path, f"part{i}") for i in range(RAW_PARALLEL_STREAMS)]

    def write(i: int, views: list[memoryview]) -> None:
        fd = os.open(paths[i], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            for batch in _batches(views):
                _transfer_all(os.writev, fd, batch)
            os.fsync(fd)
        finally:
            os.close(fd)

    _parallel(write, paths, _split_even(_byte_views(state.values()), RAW_PARALLEL_STREAMS))
    dfd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


def raw_load_parallel(path: str, dst: dict[str, Any]) -> None:
    paths = [os.path.join(path, f"part{i}") for i in range(RAW_PARALLEL_STREAMS)]

    def read(i: int, views: list[memoryview]) -> None:
        fd = os.open(paths[i], os.O_RDONLY)
        try:
            for batch in _batches(views):
                _transfer_all(os.readv, fd, batch)
        finally:
            os.close(fd)

    _parallel(read, paths, _split_even(_byte_views(dst.values()), RAW_PARALLEL_STREAMS))


# --------------------------------------------------------------------------- #
# Process measurement
# --------------------------------------------------------------------------- #
def current_rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def reset_peak_rss() -> bool:
    """Reset the peak-RSS high-water mark (Linux >= 4.0, ``clear_refs`` 5) so
    ``ru_maxrss`` afterwards reflects only what follows.  Returns success."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def peak_rss_bytes() -> tuple[int, int]:
    """(peak RSS of this process's memory map, ``ru_maxrss``), both in bytes.

    The first is ``VmHWM`` from /proc/self/status: the same high-water mark
    that ``ru_maxrss`` reports, but without the value Linux carries over
    from the pre-``exec`` image (for a subprocess that is the *parent's*
    RSS, which would otherwise swamp small measurements).  Falls back to
    ``ru_maxrss`` (KiB on Linux) when /proc is unavailable."""
    ru = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024, ru
    except OSError:
        pass
    return ru, ru


def proc_io() -> dict[str, int]:
    """``/proc/self/io`` counters (rchar, wchar, read_bytes, ...); {} if absent."""
    try:
        with open("/proc/self/io") as f:
            return {k: int(v) for k, v in (line.split(":") for line in f if ":" in line)}
    except OSError:
        return {}


def dirty_bytes() -> int:
    """System-wide dirty page-cache bytes (``Dirty:`` in /proc/meminfo)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("Dirty:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return -1


def prepare_cache(cold: bool) -> str:
    """``os.sync()`` and, if ``cold`` and permitted, drop the page cache.
    Returns ``"cold"`` when the cache was dropped, else ``"warm"``."""
    os.sync()
    if cold and os.access(DROP_CACHES, os.W_OK):
        try:
            with open(DROP_CACHES, "w") as f:
                f.write("3\n")
            return "cold"
        except OSError:
            pass
    return "warm"


def fsync_tree(path: str | os.PathLike[str]) -> None:
    """fsync every regular file under ``path`` (or ``path`` itself) and the
    directories that contain them."""
    p = Path(path)
    files = [p] if p.is_file() else [q for q in p.rglob("*") if q.is_file()]
    dirs = {q.parent for q in files} | ({p} if p.is_dir() else set())
    for q in files:
        fd = os.open(q, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    for d in dirs:
        fd = os.open(d, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def tree_bytes(path: str | os.PathLike[str]) -> int:
    p = Path(path)
    if p.is_file():
        return p.stat().st_size
    return sum(q.stat().st_size for q in p.rglob("*") if q.is_file())


# --------------------------------------------------------------------------- #
# Machine facts
# --------------------------------------------------------------------------- #
def _run(cmd: list[str]) -> str:
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return ""


def machine_facts(scratch_dir: str) -> dict[str, Any]:
    facts: dict[str, Any] = {
        "kernel": platform.release(),
        "platform": platform.platform(),
        "python": sys.version.split()[0],
        "logical_cpus": os.cpu_count(),
        "affinity_cpus": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
    }
    try:
        with open("/proc/cpuinfo") as f:
            models = [ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")]
        facts["cpu_model"] = models[0] if models else platform.processor()
    except OSError:
        facts["cpu_model"] = platform.processor()
    try:
        with open("/proc/meminfo") as f:
            facts["ram_bytes"] = int(f.readline().split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        facts["ram_bytes"] = None
    df = _run(["df", "-T", "-P", scratch_dir]).splitlines()
    if len(df) >= 2:
        cols = df[1].split()
        facts["scratch_fs"] = {
            "device": cols[0],
            "type": cols[1],
            "mount": cols[-1],
            "available_bytes": int(cols[4]) * 1024,
        }
    versions: dict[str, str | None] = {}
    for mod in ("torch", "numpy", "safetensors", "torchsnapshot", "psutil", "snapshotkit"):
        try:
            m = __import__(mod)
            versions[mod] = str(getattr(m, "__version__", "unknown"))
        except Exception as exc:
            versions[mod] = f"unavailable ({type(exc).__name__})"
    facts["versions"] = versions
    try:
        import psutil

        facts["physical_cores"] = psutil.cpu_count(logical=False)
    except Exception:
        facts["physical_cores"] = None
    try:
        import torch

        facts["torch_num_threads"] = torch.get_num_threads()
    except Exception:
        pass
    repo = Path(__file__).resolve().parents[1]
    facts["git_commit"] = _run(["git", "-C", str(repo), "rev-parse", "HEAD"]).strip() or None
    return facts


# --------------------------------------------------------------------------- #
# Formatting / statistics
# --------------------------------------------------------------------------- #
def median(values: Iterable[float]) -> float | None:
    vals = [v for v in values if v is not None]
    return statistics.median(vals) if vals else None


def ratio(num: float | None, den: float | None) -> float | None:
    if num is None or den is None or den == 0:
        return None
    return num / den


def fmt_bytes(n: float | None) -> str:
    if n is None:
        return "-"
    sign = "-" if n < 0 else ""
    n = abs(n)
    for unit, size in (("GiB", GiB), ("MiB", MiB), ("KiB", KiB)):
        if n >= size:
            return f"{sign}{n / size:.2f} {unit}"
    return f"{sign}{n:.0f} B"


def fmt_num(x: float | None, spec: str = ".3f", suffix: str = "") -> str:
    return "-" if x is None else f"{x:{spec}}{suffix}"


def parse_size(text: str) -> int:
    units = {"": 1, "k": KiB, "kib": KiB, "m": MiB, "mib": MiB, "g": GiB, "gib": GiB}
    t = text.strip().lower().replace("_", "")
    num = t.rstrip("kmgib")
    try:
        return int(float(num) * units[t[len(num) :]])
    except (KeyError, ValueError):
        raise argparse.ArgumentTypeError(f"bad size {text!r} (use e.g. 4096, 64MiB, 2GiB)") from None


class Launcher:
    """Runs one operation in a fresh process: ``script`` re-executed with ``--child <spec>
    --result-file <file>`` (``subprocess``, the most isolated), or ``entry(spec_json,
    result_file)`` forked from a server that already imported ``preload`` (``forkserver``,
    much faster to start). The child writes its result record as JSON to the result file."""

    def __init__(
        self,
        kind: str,
        timeout: float,
        *,
        script: str | os.PathLike[str],
        entry: Callable[[str, str], None],
        preload: Sequence[str],
    ) -> None:
        self.kind, self.timeout = kind, timeout
        self.script, self.entry = str(script), entry
        self._ctx: Any = None
        if kind == "forkserver":
            import multiprocessing as mp

            self._ctx = mp.get_context("forkserver")
            self._ctx.set_forkserver_preload(list(preload))

    def run(self, spec: dict[str, Any], result_file: str) -> dict[str, Any]:
        Path(result_file).unlink(missing_ok=True)
        payload = json.dumps(spec)
        log = ""
        if self._ctx is None:
            cmd = [sys.executable, self.script, "--child", payload, "--result-file", result_file]
            try:
                cp = subprocess.run(cmd, capture_output=True, text=True, timeout=self.timeout)
            except subprocess.TimeoutExpired:
                return {"ok": False, "error": f"timed out after {self.timeout} s"}
            code, log = cp.returncode, cp.stderr
        else:
            proc = self._ctx.Process(target=self.entry, args=(payload, result_file))
            proc.start()
            proc.join(self.timeout)
            if proc.is_alive():
                proc.kill()
                proc.join()
                return {"ok": False, "error": f"timed out after {self.timeout} s"}
            code = proc.exitcode
        try:
            record: dict[str, Any] = json.loads(Path(result_file).read_text())
        except (OSError, ValueError):
            return {"ok": False, "error": f"child exited with code {code} without a result", "stderr_tail": log[-3000:]}
        if log.strip():
            record["stderr_tail"] = log[-2000:]
        return record
