"""Measuring one operation (wall time, opt-in peak RSS, /proc I/O and CPU counters), the page
cache, and the statistics that summarise repeated runs."""

from __future__ import annotations

import gc
import os
import resource
import statistics
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence

from . import Record

DROP_CACHES = "/proc/sys/vm/drop_caches"
IO_KEYS = ("rchar", "read_bytes", "wchar", "write_bytes")


# -------------------------------------------- Memory and I/O of this process
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
    return (_status_kib("/proc/self/status", "VmHWM:") or ru // 1024) * 1024, ru


def _status_kib(path: str, field: str) -> int | None:
    """The ``field`` line of a /proc status-like file, in KiB (None if absent)."""
    try:
        with open(path) as f:
            for line in f:
                if line.startswith(field):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def proc_io() -> dict[str, int]:
    """``/proc/self/io`` counters (rchar, wchar, read_bytes, ...); {} if absent."""
    try:
        with open("/proc/self/io") as f:
            return {k: int(v) for k, v in (line.split(":") for line in f if ":" in line)}
    except OSError:
        return {}


def dirty_bytes() -> int:
    """System-wide dirty page-cache bytes (``Dirty:`` in /proc/meminfo); -1 if unknown."""
    kib = _status_kib("/proc/meminfo", "Dirty:")
    return -1 if kib is None else kib * 1024


def can_drop_caches() -> bool:
    return os.access(DROP_CACHES, os.W_OK)


def prepare_cache(cold: bool, warm: Iterable[str | os.PathLike[str]] = ()) -> str:
    """``os.sync()`` and, if ``cold`` and permitted, drop the page cache; otherwise read every
    file at or below the paths in ``warm`` once, so that a "warm" operation that follows a cold
    one (which dropped the cache) really finds its input in the page cache.
    Returns ``"cold"`` when the cache was dropped, else ``"warm"``."""
    os.sync()
    if cold and can_drop_caches():
        try:
            with open(DROP_CACHES, "w") as f:
                f.write("3\n")
            return "cold"
        except OSError:
            pass
    for root in warm:
        files = [root] if os.path.isfile(root) else [os.path.join(d, n) for d, _, names in os.walk(root) for n in names]
        for name in files:
            with open(name, "rb", buffering=0) as f:
                while f.read(8 << 20):
                    pass
    return "warm"


# -------------------------------------------------------------- CPU counters
def process_cpu_s(pid: int | None) -> float | None:
    """utime + stime of process ``pid`` in seconds (None if unknown)."""
    if pid is None:
        return None
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return None


def children_cpu_s() -> float:
    """User + system CPU seconds of this process's live descendants (e.g. servers it started)."""
    import psutil

    total = 0.0
    for child in psutil.Process().children(recursive=True):
        try:
            times = child.cpu_times()
            total += times.user + times.system
        except psutil.Error:
            continue
    return total


SystemCpu = tuple[int, int, int]


def system_cpu() -> SystemCpu | None:
    """(busy, total, steal) jiffies of the whole machine from /proc/stat (guest time is part of
    user time there, so it is not added again)."""
    try:
        with open("/proc/stat") as f:
            vals = [int(v) for v in f.readline().split()[1:9]]
    except (OSError, ValueError):
        return None
    vals += [0] * (8 - len(vals))
    idle = vals[3] + vals[4]
    return sum(vals) - idle, sum(vals), vals[7]


def cpu_fraction(before: SystemCpu | None, after: SystemCpu | None, field: int) -> float | None:
    """Share of the machine's CPU time between two :func:`system_cpu` readings: busy (0) or steal (2)."""
    if before is None or after is None or after[1] == before[1]:
        return None
    return (after[field] - before[field]) / (after[1] - before[1])


def thread_sched() -> tuple[float, float]:
    """(seconds on CPU, seconds runnable but waiting for a CPU) of the calling thread, from
    /proc/thread-self/schedstat; (thread_time, 0) where that is unavailable."""
    try:
        with open("/proc/thread-self/schedstat") as f:
            on_cpu, waiting = f.read().split()[:2]
        return int(on_cpu) / 1e9, int(waiting) / 1e9
    except (OSError, ValueError):
        return time.thread_time(), 0.0


# ---------------------------------------------------- One measured operation
class Measure:
    """``with Measure() as m: op()`` times ``op``: wall seconds (``m.time_s``, also when it raises)
    and this process's CPU seconds (``m.cpu_s``). Opt in to ``rss`` (peak RSS over the RSS just
    before, the mark reset first), ``io`` (/proc/self/io deltas) and ``children`` (CPU seconds of
    this process's descendants). Counters are read outside the timed span, in reverse order on the
    way out, so none pays for another."""

    def __init__(self, *, rss: bool = False, io: bool = False, children: bool = False) -> None:
        self.rss, self.io, self.children = rss, io, children
        self.time_s = self.cpu_s = self.children_cpu_s = 0.0
        self.io_delta: dict[str, int] = {}
        self._rss: Record = {}

    def __enter__(self) -> Measure:
        if self.rss:
            self._rss["hiwater_reset"] = reset_peak_rss()
            self._rss["baseline_rss_bytes"] = current_rss_bytes()
        self._children0 = children_cpu_s() if self.children else 0.0
        self._io0 = proc_io() if self.io else {}
        self._cpu0 = time.process_time()
        self._t0 = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        self.time_s = time.perf_counter() - self._t0
        self.cpu_s = time.process_time() - self._cpu0
        if self.io:
            io1 = proc_io()
            self.io_delta = {k: io1[k] - self._io0.get(k, 0) for k in io1}
        if self.children:
            self.children_cpu_s = children_cpu_s() - self._children0
        if self.rss:
            peak, ru_maxrss = peak_rss_bytes()
            baseline = self._rss["baseline_rss_bytes"]
            self._rss.update(
                peak_rss_bytes=peak, ru_maxrss_bytes=ru_maxrss, peak_rss_over_baseline_bytes=peak - baseline
            )
            # Whatever the operation ran as subprocesses is outside this process's high-water mark.
            descendants = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024
            if descendants:
                self._rss["children_peak_rss_bytes"] = descendants

    def record(self) -> Record:
        """``time_s`` and, as opted in, the RSS fields and ``io_delta``."""
        return {"time_s": self.time_s, **self._rss, **({"io_delta": self.io_delta} if self.io else {})}


def settle() -> None:
    """Before a timed write-heavy op: collect garbage, and flush earlier writes now so the op
    does not pay for them."""
    gc.collect()
    os.sync()


NOT_ATTEMPTED: Record = {"ok": False, "error": "save failed in this repeat; not attempted"}


def save_first(ops: Sequence[str], run: Callable[[str], Record]) -> Iterator[tuple[str, Record]]:
    """``(op, run(op))`` for ``ops`` in order, the first being the save the others read back: once
    it failed, they are recorded as not attempted (there is nothing to read)."""
    saved = False
    for i, op in enumerate(ops):
        rec = run(op) if i == 0 or saved else dict(NOT_ATTEMPTED)
        saved = saved or (i == 0 and bool(rec.get("ok")))
        yield op, rec


def record_verification(rec: Record, problems: Sequence[str]) -> None:
    """Note a run's bit-exact check in its record: ``verified``, and a failed run if it found problems."""
    rec["verified"] = not problems
    if problems:
        rec.update(ok=False, error="verification failed: " + "; ".join(problems))


# --------------------------------------------------- Statistics over repeats
def median(values: Iterable[float | None]) -> float | None:
    vals = [v for v in values if v is not None]
    return statistics.median(vals) if vals else None


def ratio(num: float | None, den: float | None) -> float | None:
    if num is None or den is None or den == 0:
        return None
    return num / den


def percentile(values: Sequence[float], q: float) -> float | None:
    if not values:
        return None
    s = sorted(values)
    return s[min(len(s) - 1, int(q * (len(s) - 1) + 0.5))]


def within(value: float | None, limit: float, *, at_least: bool = False) -> bool | None:
    """Whether ``value`` meets a target of at most (or ``at_least``) ``limit``; None if unmeasured."""
    if value is None:
        return None
    return value >= limit if at_least else value <= limit


def run_summary(
    runs: list[Record],
    nbytes: int | None = None,
    *,
    median_of: Iterable[str] | Mapping[str, str] = (),
    first: Sequence[str] = (),
) -> tuple[Record, list[Record]]:
    """The summary every operation starts from -- all ``runs``, ``n_ok``, the first ``error`` and,
    given the ``nbytes`` an operation moves, its median, min and max ``time_s`` and the bandwidth
    at the median; over the runs that succeeded, the :func:`medians` of ``median_of`` and the
    first one's ``first`` figures (sizes, the same in every run) -- and the runs that succeeded,
    for the figures the caller adds."""
    good = [r for r in runs if r.get("ok")]
    out: Record = {"runs": runs, "n_ok": len(good)}
    errors = [r["error"] for r in runs if r.get("error")]
    if errors:
        out["error"] = errors[0]
    if good and nbytes is not None:
        times = [r["time_s"] for r in good]
        med = median(times)
        out.update(times_s=times, median_s=med, min_s=min(times), max_s=max(times), bytes=nbytes)
        out["bandwidth_bytes_per_s"] = ratio(nbytes, med)
    if good:
        out.update(medians(good, median_of))
        out.update({k: good[0][k] for k in first if good[0].get(k) is not None})
    return out, good


def medians(good: list[Record], keys: Iterable[str] | Mapping[str, str], *, group: str | None = None) -> Record:
    """The median over ``good`` runs of each of ``keys`` (of each run's ``group`` sub-record, if
    given); a mapping of keys names them ``{summary key: run key}``."""
    named = keys if isinstance(keys, Mapping) else {k: k for k in keys}
    return {out: median(((r.get(group) or {}) if group else r).get(k) for r in good) for out, k in named.items()}
