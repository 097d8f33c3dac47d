"""The report: machine facts, number formatting, tables, the report skeleton and its writer (JSON + text)."""

from __future__ import annotations

import importlib.metadata
import json
import os
import platform
import re
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from . import REPO_ROOT, Record
from .cli import GiB, KiB, MiB

_VERSIONS = ("torch", "numpy", "safetensors", "torchsnapshot", "psutil", "snapshotkit")


# ------------------------------------------------------------- Machine facts
def _run(cmd: list[str]) -> str:
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return ""


def dist_version(name: str) -> str | None:
    """The installed version of distribution ``name`` (None if it is not installed)."""
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def machine_facts(scratch_dir: str | os.PathLike[str], dists: Sequence[str] = ()) -> Record:
    """What a result depends on: CPU, RAM, kernel, the scratch file system, library versions (of
    the modules the scripts compare, plus the distributions ``dists``) and the git commit."""
    facts: Record = {
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
    df = _run(["df", "-T", "-P", str(scratch_dir)]).splitlines()
    if len(df) >= 2:
        cols = df[1].split()
        facts["scratch_fs"] = {
            "device": cols[0],
            "type": cols[1],
            "mount": cols[-1],
            "available_bytes": int(cols[4]) * 1024,
        }
    versions: dict[str, str | None] = {}
    for mod in _VERSIONS:
        try:
            versions[mod] = str(getattr(__import__(mod), "__version__", "unknown"))
        except Exception as exc:
            versions[mod] = f"unavailable ({type(exc).__name__})"
    versions.update({name: dist_version(name) for name in dists})
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
    facts["git_commit"] = _run(["git", "-C", str(REPO_ROOT), "rev-parse", "HEAD"]).strip() or None
    return facts


def other_activity() -> Record:
    """Load average and other processes that look like benchmarks or test runs: what a result
    taken on a shared machine has to be read against."""
    try:
        load = Path("/proc/loadavg").read_text().split()[:3]
    except OSError:
        load = []
    mine = {os.getpid(), os.getppid()}
    found: list[str] = []
    try:
        import psutil

        me = psutil.Process()
        mine |= {p.pid for p in me.parents()} | {p.pid for p in me.children(recursive=True)}
        for p in psutil.process_iter(["pid", "cmdline"]):
            cmd = " ".join(p.info.get("cmdline") or [])
            if p.info["pid"] not in mine and ("bench_" in cmd or "pytest" in cmd):
                found.append(f"{p.info['pid']}: {cmd[:160]}")
    except Exception as exc:  # psutil missing or /proc unreadable: say so
        found.append(f"(could not list processes: {type(exc).__name__})")
    return {"loadavg": load, "other_benchmarks_or_tests": found}


def snapshotkit_env() -> dict[str, str]:
    """The ``SNAPSHOTKIT_*`` settings this run was made with."""
    return {k: v for k, v in os.environ.items() if k.startswith("SNAPSHOTKIT_")}


# ---------------- Formatting ("-" stands for a figure that was not measured)
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


def fmt_x(v: float | str | None) -> str:
    """A ratio as ``1.23x``; a string (such as ``"n/a"``) as it is."""
    return v if isinstance(v, str) else fmt_num(v, ".2f", "x")


def fmt_pct(v: float | None) -> str:
    """A relative change as ``+1.2%``."""
    return "-" if v is None else f"{v * 100:+.1f}%"


def fmt_ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1e3:.2f}"


def fmt_gib_s(bytes_per_s: float | None, spec: str = ".2f") -> str:
    return fmt_num(bytes_per_s / GiB if bytes_per_s else None, spec)


def verdict(met: bool | None, missed: str = "MISSED") -> str:
    return "n/a" if met is None else "MET" if met else missed


def table(spec: str, rows: Iterable[Sequence[object] | str]) -> list[str]:
    """A fixed-width table: the header line, then a line per row. ``spec`` lists the columns, ``|``
    between them, each as its header, ``<`` (left-aligned) or ``>`` and its width, as in a format
    spec: ``"system<14|median s>10"``; width 0 takes a cell as it is (a trailing notes column). A
    row is its cells (``str`` of each) or, for a line of its own (a system that was skipped), a string."""
    columns = re.findall(r"(.*?)([<>]\d+)(?:\||$)", spec)  # a header may hold a "|" of its own
    if not columns or "|".join(h + f for h, f in columns) != spec:
        raise ValueError(f"bad column spec {spec!r}: want e.g. 'system<14|median s>10'")
    headers, formats = zip(*columns, strict=True)

    def line(cells: Sequence[object]) -> str:
        return "".join(f"{c!s:{f}}" for f, c in zip(formats, cells, strict=True))

    return [line(headers), *(r if isinstance(r, str) else line(r) for r in rows)]


def machine_line(machine: Record, *, fs: bool = True, versions: Sequence[str] = ("torch",)) -> str:
    """The report's first line: CPU, RAM, kernel, (scratch file system,) library versions."""
    m, parts = machine, [f"machine: {machine.get('cpu_model')}", f"{machine.get('logical_cpus')} cpus"]
    parts += [f"RAM {fmt_bytes(m.get('ram_bytes'))}", f"kernel {m.get('kernel')}"]
    if fs:
        parts.append(f"fs {m.get('scratch_fs', {}).get('type')}")
    parts += [f"{name} {m['versions'].get(name)}" for name in versions]
    return " | ".join(parts)


def status(rec: Record, ok: Callable[[Record], str] | None = None) -> str:
    """One run for the progress lines: ``ok(rec)`` (default: its time), ``n/a`` or why it failed."""
    if rec.get("ok"):
        return ok(rec) if ok is not None else f"{rec['time_s']:.3f} s"
    return "n/a" if rec.get("na") else f"FAILED: {str(rec.get('error'))[:300]}"


def progress(line: str) -> None:
    """Progress goes to stderr, so stdout holds only the report."""
    print(line, file=sys.stderr, flush=True)


# ---------------------------------------------------------------- The report
def now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S%z")


def new_report(
    benchmark: str, scratch: str | os.PathLike[str], *, dists: Sequence[str] = (), **sections: Any
) -> Record:
    """The skeleton: which benchmark, when, ``sections`` (config, notes, ...) and the machine
    facts (file system: the one ``scratch`` is on)."""
    return {"benchmark": benchmark, "started": now(), **sections, "machine": machine_facts(scratch, dists)}


def write_report(report: Record, out: str | os.PathLike[str] | None, text: str) -> None:
    """Stamp the report finished, write it as JSON to ``out`` (if any) and print ``text``."""
    report["finished"] = now()
    if out is not None:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        Path(out).write_text(json.dumps(report, indent=2))
    print(text)
    if out is not None:
        print(f"\nJSON written to {out}")
