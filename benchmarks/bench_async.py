"""Async snapshot benchmark: what a CPU-bound training loop pays for background snapshots.

In one run, this script trains the same small MLP (``torch.set_num_threads(1)``, so one of the
two cores is free for the writer) for the same fixed number of steps in several ways, each in a
fresh process (this script re-executed with ``--child``):

* ``none``: no snapshots (the baseline);
* ``thread``: ``Snapshot.async_take(..., executor="thread")`` every K steps;
* ``process``: the same with ``executor="process"`` (the checkpoint daemon);
* ``dcp``: ``torch.distributed.checkpoint.async_save(state, checkpoint_id=dir, no_dist=True)``
  every K steps -- one process, no process group, DCP's default stager (new staging buffers
  for every call) and thread executor;
* ``dcp_reuse``: the same with one ``DefaultStager`` kept for the whole run (passed as
  ``async_stager``), so DCP copies into cached buffers like snapshotkit's pooled ones.

``--writer-nice N`` (a diagnostic, off by default) renices the writer's threads after each call: the
checkpoint daemon's, or every thread of the trainer's process but the trainer's own. snapshotkit's
writers now run at niceness 19 by themselves (``SNAPSHOTKIT_BACKGROUND_NICENESS``); set that to 0
to measure writers at normal priority.

The snapshotted state is the model and its Adam optimizer plus a separate big state (default
1 GiB: 16 float32 tensors of 64 MiB of seeded random data, in a ``snapshotkit.StateDict``);
every step also writes the step number into a 1 MiB slice of one big tensor, so the big state
keeps changing while snapshots are written.  Before each snapshot the previous one is waited
for (``pending.wait()`` / ``future.result()``); K is chosen so writes normally finish in time,
and whether each did is recorded.  Snapshots go to a scratch directory (default: a new temp dir
under /tmp) and are deleted after each run.

Measured:

1. time blocked in ``async_take`` / ``async_save``: the first call of each process (cold:
   daemon or I/O thread start, first staging allocation) and the median of the later calls
   (warm), against a plain ``Tensor.copy_`` of the same tensors on one thread (like the
   trainer's): into pre-allocated, already touched tensors (``memcpy``, which the ratio uses)
   and into fresh ``empty_like`` tensors (``memcpy_fresh``, page faults included);
2. the training loop's slowdown: loop time with snapshots minus the time blocked in snapshot
   calls and in waits for the previous snapshot, over the loop time without snapshots, minus 1;
   also with the blocked time included; the mean / median step time while a background write
   is in flight against the no-snapshot run's; and, immune to the drift between runs that a
   shared VM shows, an in-run estimate: the in-flight steps' extra time over the same run's
   other steps, relative to the rest of the loop.  Per run the trainer thread's CPU time and
   time spent runnable but waiting for a CPU (/proc schedstat), the process's CPU time, the
   checkpoint daemon's, and the machine's busy and steal fractions are recorded too.

After the loop (untimed) the last snapshot is restored -- snapshotkit: ``Snapshot.restore`` into
a fresh model and optimizer and zeroed tensors; DCP: ``dcp.load`` into zeroed tensors -- and
compared bit-exactly with the state at the moment of the call (``--no-verify`` skips).

Usage::

    python benchmarks/bench_async.py                      # 1 GiB, ~40 s per run, 5 repeats (~25 min)
    python benchmarks/bench_async.py --quick --out /tmp/async.json
    python benchmarks/bench_async.py --modes none,process --repeats 1 --state-bytes 256MiB
    python benchmarks/bench_async.py --help

Results go to benchmarks/results/bench_async-<date>.json unless ``--out`` says otherwise.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import copy
import gc
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
import traceback
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
_REPO_ROOT = Path(__file__).resolve().parents[1]
if (_REPO_ROOT / "snapshotkit").is_dir() and str(_REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(_REPO_ROOT))

import _common as C  # noqa: E402

MODES = ("none", "thread", "process", "dcp", "dcp_reuse")
SNAPSHOT_MODES = MODES[1:]
LABELS = {
    "none": "no snapshots",
    "thread": "snapshotkit thread",
    "process": "snapshotkit process",
    "dcp": "dcp async_save",
    "dcp_reuse": "dcp async_save, reused stager",
}
MUTATE_ELEMS = 256 * 1024  # float32 elements of one big tensor overwritten per step (1 MiB)
TARGET_BLOCKED_OVER_MEMCPY = 1.5
TARGET_PROCESS_SLOWDOWN = 0.05


# --------------------------------------------------------------------------- #
# The state and the trainer (children)
# --------------------------------------------------------------------------- #
def big_specs(cfg: dict[str, Any]) -> list[C.TensorSpec]:
    """The big state: ``state_bytes / tensor_bytes`` float32 tensors of seeded random data."""
    count = cfg["state_bytes"] // cfg["tensor_bytes"]
    numel = cfg["tensor_bytes"] // 4
    shape = (numel // 1024, 1024) if numel % 1024 == 0 else (numel,)
    return [C.TensorSpec(f"big{i:03d}", "float32", shape, cfg["seed"] * 1_000_003 + i) for i in range(count)]


def mutated_slice(t: Any) -> Any:
    return t.view(-1)[: min(MUTATE_ELEMS, t.numel())]


def last_mutation(index: int, count: int, step: int) -> int | None:
    """The last step <= ``step`` that wrote into big tensor ``index`` (step s writes s % count)."""
    s = step - ((step - index) % count)
    return s if s >= 1 else None


def expected_big(spec: C.TensorSpec, index: int, count: int, step: int) -> Any:
    """Big tensor ``index`` as it was right after training step ``step``."""
    import torch

    want = torch.empty(spec.shape, dtype=torch.float32)
    C.fill_tensor(want, spec)
    s = last_mutation(index, count, step)
    if s is not None:
        mutated_slice(want).fill_(float(s))
    return want


def build_trainer(cfg: dict[str, Any]) -> tuple[Any, Any, list[tuple[Any, Any]]]:
    """A small MLP, its Adam optimizer and a few fixed random batches."""
    import torch

    torch.manual_seed(cfg["seed"])
    layers: list[torch.nn.Module] = []
    width = cfg["in_features"]
    for _ in range(cfg["layers"]):
        layers += [torch.nn.Linear(width, cfg["hidden"]), torch.nn.ReLU()]
        width = cfg["hidden"]
    layers.append(torch.nn.Linear(width, 10))
    model = torch.nn.Sequential(*layers)
    optim = torch.optim.Adam(model.parameters(), lr=1e-3)
    gen = torch.Generator().manual_seed(cfg["seed"] + 1)
    batches = [
        (
            torch.randn(cfg["batch"], cfg["in_features"], generator=gen),
            torch.randint(0, 10, (cfg["batch"],), generator=gen),
        )
        for _ in range(8)
    ]
    return model, optim, batches


def train_step(model: Any, optim: Any, batch: tuple[Any, Any]) -> None:
    import torch

    optim.zero_grad(set_to_none=True)
    torch.nn.functional.cross_entropy(model(batch[0]), batch[1]).backward()
    optim.step()


def clone_tree(obj: Any, zero: bool = False) -> Any:
    """A deep copy of a state-dict tree; tensors cloned (or zero-filled of the same shape)."""
    import torch

    if isinstance(obj, torch.Tensor):
        return torch.zeros_like(obj) if zero else obj.detach().clone()
    if isinstance(obj, dict):
        return {k: clone_tree(v, zero) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(clone_tree(v, zero) for v in obj)
    return copy.deepcopy(obj)


def compare_tree(got: Any, want: Any, where: str, problems: list[str]) -> None:
    import torch

    if isinstance(want, torch.Tensor):
        if not isinstance(got, torch.Tensor):
            problems.append(f"{where}: not a tensor ({type(got).__name__})")
        elif got.dtype != want.dtype or got.shape != want.shape or not torch.equal(got, want):
            problems.append(f"{where}: tensor differs")
    elif isinstance(want, dict):
        if not isinstance(got, dict) or set(got) != set(want):
            problems.append(f"{where}: keys differ")
            return
        for k in want:
            compare_tree(got[k], want[k], f"{where}/{k}", problems)
    elif isinstance(want, (list, tuple)):
        if not isinstance(got, (list, tuple)) or len(got) != len(want):
            problems.append(f"{where}: sequence differs")
            return
        for i, (g, w) in enumerate(zip(got, want, strict=True)):
            compare_tree(g, w, f"{where}[{i}]", problems)
    elif got != want:
        problems.append(f"{where}: {got!r} != {want!r}")


def check_big(dest: dict[str, Any], specs: Sequence[C.TensorSpec], step: int, problems: list[str]) -> None:
    import torch

    for i, spec in enumerate(specs):
        if not torch.equal(dest[spec.name], expected_big(spec, i, len(specs), step)):
            problems.append(f"big/{spec.name}: differs from the state at step {step}")


def staged_tensors(model: Any, optim: Any, big: dict[str, Any]) -> list[Any]:
    """Every tensor a snapshot copies: the big state, the model's and the optimizer's."""
    import torch

    out = list(big.values()) + list(model.state_dict().values())
    for per_param in optim.state_dict()["state"].values():
        out += [v for v in per_param.values() if isinstance(v, torch.Tensor)]
    return out


# --------------------------------------------------------------------------- #
# Snapshot drivers (children)
# --------------------------------------------------------------------------- #
class SnapshotkitDriver:
    def __init__(self, executor: str, model: Any, optim: Any, big: dict[str, Any], budget: int | None) -> None:
        from snapshotkit import Snapshot, StateDict

        self._snapshot = Snapshot
        self.executor, self.budget = executor, budget
        self.app_state = {"model": model, "optim": optim, "big": StateDict(big)}

    def start(self, path: str) -> Any:
        return self._snapshot.async_take(path, self.app_state, memory_budget_bytes=self.budget, executor=self.executor)

    @staticmethod
    def done(handle: Any) -> bool:
        return bool(handle.done())

    @staticmethod
    def wait(handle: Any) -> None:
        handle.wait()

    def writer_pid(self) -> int | None:
        if self.executor != "process":
            return None
        from snapshotkit._take.writers import checkpoint_daemon_pid

        return checkpoint_daemon_pid()

    def close(self) -> None:
        pass

    def verify(self, path: str, cfg: dict[str, Any], expected: dict[str, Any], step: int) -> list[str]:
        import torch

        from snapshotkit import StateDict

        model, optim, batches = build_trainer(cfg)
        train_step(model, optim, batches[0])  # so the optimizer has state to restore into
        specs = big_specs(cfg)
        dest = {s.name: torch.zeros(s.shape, dtype=torch.float32) for s in specs}
        self._snapshot(path).restore({"model": model, "optim": optim, "big": StateDict(dest)})
        problems: list[str] = []
        compare_tree(model.state_dict(), expected["model"], "model", problems)
        compare_tree(optim.state_dict(), expected["optim"], "optim", problems)
        check_big(dest, specs, step, problems)
        return problems


class DcpDriver:
    def __init__(self, reuse: bool, model: Any, optim: Any, big: dict[str, Any]) -> None:
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions

        self._dcp = dcp
        self.model, self.optim, self.big = model, optim, big
        options = StagingOptions(
            use_pinned_memory=False, use_shared_memory=False, use_async_staging=False, use_non_blocking_copy=False
        )
        self.stager = DefaultStager(options) if reuse else None

    def start(self, path: str) -> Any:
        state = {"model": self.model.state_dict(), "optim": self.optim.state_dict(), "big": self.big}
        extra = {"async_stager": self.stager} if self.stager is not None else {}
        handle = self._dcp.async_save(state, checkpoint_id=path, no_dist=True, **extra)
        return getattr(handle, "upload_completion", handle)  # AsyncSaveResponse on async staging

    @staticmethod
    def done(handle: Any) -> bool:
        return bool(handle.done())

    @staticmethod
    def wait(handle: Any) -> None:
        handle.result()

    def writer_pid(self) -> int | None:
        return None

    def close(self) -> None:
        if self.stager is not None:
            self.stager.close()

    def verify(self, path: str, cfg: dict[str, Any], expected: dict[str, Any], step: int) -> list[str]:
        import torch

        specs = big_specs(cfg)
        dest = {
            "model": clone_tree(expected["model"], zero=True),
            "optim": clone_tree(expected["optim"], zero=True),
            "big": {s.name: torch.zeros(s.shape, dtype=torch.float32) for s in specs},
        }
        self._dcp.load(dest, checkpoint_id=path, no_dist=True)
        problems: list[str] = []
        compare_tree(dest["model"], expected["model"], "model", problems)
        compare_tree(dest["optim"], expected["optim"], "optim", problems)
        check_big(dest["big"], specs, step, problems)
        return problems


def make_driver(mode: str, cfg: dict[str, Any], model: Any, optim: Any, big: dict[str, Any]) -> Any:
    if mode in ("thread", "process"):
        return SnapshotkitDriver(mode, model, optim, big, cfg["memory_budget_bytes"])
    return DcpDriver(mode == "dcp_reuse", model, optim, big)


# --------------------------------------------------------------------------- #
# CPU accounting helpers
# --------------------------------------------------------------------------- #
def _proc_cpu_s(pid: int | None) -> float | None:
    """utime + stime of process ``pid`` in seconds (None if unknown)."""
    if pid is None:
        return None
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return None


def _system_cpu() -> tuple[int, int, int] | None:
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


def _fraction(before: tuple[int, int, int] | None, after: tuple[int, int, int] | None, field: int) -> float | None:
    """Share of the machine's CPU time between two :func:`_system_cpu` readings: busy (0) or steal (2)."""
    if before is None or after is None or after[1] == before[1]:
        return None
    return (after[field] - before[field]) / (after[1] - before[1])


def _thread_sched() -> tuple[float, float]:
    """(seconds on CPU, seconds runnable but waiting for a CPU) of the calling thread, from
    /proc/thread-self/schedstat; (thread_time, 0) where that is unavailable."""
    try:
        with open("/proc/thread-self/schedstat") as f:
            on_cpu, waiting = f.read().split()[:2]
        return int(on_cpu) / 1e9, int(waiting) / 1e9
    except (OSError, ValueError):
        return time.thread_time(), 0.0


def renice_writer(driver: Any, nice: int) -> None:
    """Benchmark-side diagnostic (``--writer-nice``): give the writer's threads a lower CPU
    priority -- every thread of the checkpoint daemon, or every thread of this process but the
    trainer's for in-process writers. Linux nice values are per thread; new threads inherit the
    value of the thread that creates them."""
    import threading

    pid = driver.writer_pid()
    tasks = f"/proc/{pid}/task" if pid is not None else "/proc/self/task"
    main = threading.main_thread().native_id if pid is None else None
    try:
        tids = [int(t) for t in os.listdir(tasks)]
    except OSError:
        return
    for tid in tids:
        if tid != main:
            with contextlib.suppress(OSError):
                os.setpriority(os.PRIO_PROCESS, tid, nice)


def _percentile(values: Sequence[float], q: float) -> float | None:
    if not values:
        return None
    s = sorted(values)
    return s[min(len(s) - 1, int(q * (len(s) - 1) + 0.5))]


def _step_stats(values: Sequence[float]) -> dict[str, Any]:
    return {
        "n": len(values),
        "mean_s": statistics.fmean(values) if values else None,
        "median_s": statistics.median(values) if values else None,
        "p90_s": _percentile(values, 0.9),
        "p99_s": _percentile(values, 0.99),
        "max_s": max(values) if values else None,
    }


# --------------------------------------------------------------------------- #
# Child operations
# --------------------------------------------------------------------------- #
def _setup(cfg: dict[str, Any]) -> tuple[list[C.TensorSpec], dict[str, Any], Any, Any, list[tuple[Any, Any]]]:
    import torch

    torch.set_num_threads(1)
    specs = big_specs(cfg)
    big = C.materialize(specs)
    model, optim, batches = build_trainer(cfg)
    for i in range(cfg["warmup_steps"]):  # untimed; also gives the optimizer its state
        train_step(model, optim, batches[i % len(batches)])
    return specs, big, model, optim, batches


def run_memcpy(spec: dict[str, Any]) -> dict[str, Any]:
    """Copy the bytes a snapshot stages with ``Tensor.copy_`` on one thread."""
    import torch

    cfg = spec["cfg"]
    _, big, model, optim, _ = _setup(cfg)
    sources = staged_tensors(model, optim, big)
    nbytes = sum(t.numel() * t.element_size() for t in sources)
    dests = [torch.empty_like(t) for t in sources]
    for d in dests:
        d.zero_()  # touch every page: the copies below go to resident memory
    gc.collect()
    prealloc: list[float] = []
    fresh: list[float] = []
    for _ in range(cfg["memcpy_iters"]):
        t0 = time.perf_counter()
        for d, s in zip(dests, sources, strict=True):
            d.copy_(s)
        prealloc.append(time.perf_counter() - t0)
    del dests
    gc.collect()
    for _ in range(cfg["memcpy_iters"]):
        t0 = time.perf_counter()
        copies = [torch.empty_like(s).copy_(s) for s in sources]
        fresh.append(time.perf_counter() - t0)
        del copies
        gc.collect()
    return {
        "ok": True,
        "bytes": nbytes,
        "tensors": len(sources),
        "prealloc_s": prealloc,
        "fresh_s": fresh,
        "prealloc_median_s": statistics.median(prealloc),
        "fresh_median_s": statistics.median(fresh),
        "torch_threads": torch.get_num_threads(),
    }


def run_train(spec: dict[str, Any]) -> dict[str, Any]:
    """The training loop, with snapshots every ``every`` steps unless the mode is ``none``."""
    import torch

    cfg, mode = spec["cfg"], spec["mode"]
    warnings.filterwarnings("ignore", message="torch.distributed is disabled")  # DCP without a process group
    specs, big, model, optim, batches = _setup(cfg)
    big_list = [big[s.name] for s in specs]
    slices = [mutated_slice(t) for t in big_list]
    nbig = len(big_list)
    steps, every, snapshots = cfg["steps"], cfg["every"], cfg["snapshots"]
    workdir = Path(spec["workdir"])
    workdir.mkdir(parents=True, exist_ok=True)
    driver = None if mode == "none" else make_driver(mode, cfg, model, optim, big)
    staged_bytes = sum(t.numel() * t.element_size() for t in staged_tensors(model, optim, big))

    step_times: list[float] = []
    in_flight: list[bool] = []
    calls: list[dict[str, Any]] = []
    pending: Any = None
    pending_record: dict[str, Any] | None = None
    expected: dict[str, Any] | None = None
    excluded = 0.0  # capturing the expected state for the verification (not the benchmark's cost)
    writer_pid: int | None = None

    nice = cfg.get("writer_nice") or 0
    os.sync()
    gc.collect()
    cpu0, sched0, sys0 = time.process_time(), _thread_sched(), _system_cpu()
    loop0 = time.perf_counter()
    for step in range(1, steps + 1):
        t0 = time.perf_counter()
        slices[step % nbig].fill_(float(step))
        train_step(model, optim, batches[step % len(batches)])
        blocked = 0.0
        if driver is not None and step % every == 0 and step // every <= snapshots:
            index = step // every
            if pending is not None:
                assert pending_record is not None
                pending_record["done_before_next"] = driver.done(pending)
                tw = time.perf_counter()
                driver.wait(pending)
                waited = time.perf_counter() - tw
                pending_record["wait_s"] = waited
                if pending_record.get("write_s") is None:
                    pending_record["write_s"] = time.perf_counter() - pending_record["_returned"]
                blocked += waited
            call_sched0 = _thread_sched()
            tb = time.perf_counter()
            pending = driver.start(str(workdir / f"snap{index}"))
            returned = time.perf_counter()
            call_sched1 = _thread_sched()
            pending_record = {
                "step": step,
                "call_s": returned - tb,
                "call_cpu_s": call_sched1[0] - call_sched0[0],
                "call_runq_wait_s": call_sched1[1] - call_sched0[1],
                "_returned": returned,
                "write_s": None,
            }
            calls.append(pending_record)
            blocked += returned - tb
            if writer_pid is None:
                writer_pid = driver.writer_pid()
            if nice:
                tn = time.perf_counter()
                renice_writer(driver, nice)
                excluded += time.perf_counter() - tn
                blocked += time.perf_counter() - tn
            if index == snapshots:
                tc = time.perf_counter()
                expected = {"model": clone_tree(model.state_dict()), "optim": clone_tree(optim.state_dict())}
                excluded += time.perf_counter() - tc
                blocked += time.perf_counter() - tc
        t1 = time.perf_counter()
        step_times.append(t1 - t0 - blocked)
        flying = pending is not None and not driver.done(pending)  # type: ignore[union-attr]
        in_flight.append(flying)
        if pending is not None and not flying and pending_record is not None and pending_record["write_s"] is None:
            pending_record["write_s"] = t1 - pending_record["_returned"]
    loop_s = time.perf_counter() - loop0
    cpu_s, sched1, sys1 = time.process_time() - cpu0, _thread_sched(), _system_cpu()
    writer_cpu_s = _proc_cpu_s(writer_pid)

    final_wait_s = 0.0
    if pending is not None:
        assert pending_record is not None
        assert driver is not None
        tw = time.perf_counter()
        driver.wait(pending)
        final_wait_s = time.perf_counter() - tw
        if pending_record["write_s"] is None:
            pending_record["write_s"] = time.perf_counter() - pending_record["_returned"]
    for c in calls:
        c.pop("_returned", None)

    verified: bool | None = None
    problems: list[str] = []
    if driver is not None:
        driver.close()
        if spec["verify"] and expected is not None:
            del big, big_list, slices
            gc.collect()
            problems = driver.verify(str(workdir / f"snap{snapshots}"), cfg, expected, snapshots * every)
            verified = not problems
    shutil.rmtree(workdir, ignore_errors=True)

    call_times = [c["call_s"] for c in calls]
    wait_s = sum(c.get("wait_s", 0.0) for c in calls)
    take_s = sum(call_times)
    flying_steps = [t for t, f in zip(step_times, in_flight, strict=True) if f]
    idle_steps = [t for t, f in zip(step_times, in_flight, strict=True) if not f]
    # Drift-free estimate of what the background writes cost the loop: in-flight steps against
    # the mean of the same run's other steps.
    write_cost = sum(flying_steps) - len(flying_steps) * statistics.fmean(idle_steps) if idle_steps else None
    loop_excl = loop_s - take_s - wait_s - excluded
    return {
        "ok": not problems,
        "error": ("verification failed: " + "; ".join(problems[:5])) if problems else None,
        "mode": mode,
        "steps": steps,
        "staged_bytes": staged_bytes,
        "loop_s": loop_s,
        "blocked_call_s": take_s,
        "blocked_wait_s": wait_s,
        "verification_capture_s": excluded,
        "loop_excl_blocked_s": loop_excl,
        "loop_incl_blocked_s": loop_s - excluded,
        "final_wait_s": final_wait_s,
        "calls": calls,
        "first_call_s": call_times[0] if call_times else None,
        "later_calls_s": call_times[1:],
        "writes_done_in_time": all(c.get("done_before_next", True) for c in calls),
        "steps_all": _step_stats(step_times),
        "steps_in_flight": _step_stats(flying_steps),
        "steps_idle": _step_stats(idle_steps),
        "in_flight_cost_s": write_cost,
        "in_flight_slowdown_estimate": None if write_cost is None else write_cost / (loop_excl - write_cost),
        "process_cpu_s": cpu_s,
        "main_thread_cpu_s": sched1[0] - sched0[0],
        "main_thread_runq_wait_s": sched1[1] - sched0[1],
        "writer_process_cpu_s": writer_cpu_s,
        "system_busy_fraction": _fraction(sys0, sys1, 0),
        "system_steal_fraction": _fraction(sys0, sys1, 2),
        "verified": verified,
        "torch_threads": torch.get_num_threads(),
    }


def child_entry(spec_json: str, result_file: str) -> None:
    spec = json.loads(spec_json)
    try:
        res = run_memcpy(spec) if spec["op"] == "memcpy" else run_train(spec)
    except BaseException as exc:
        res = {"ok": False, "error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()[-3000:]}
    Path(result_file).write_text(json.dumps(res))


def forked_child_entry(spec_json: str, result_file: str) -> None:
    """``child_entry`` in a forked process, which skips the interpreter's exit: run the exit
    hooks (snapshotkit's stops the checkpoint daemon and frees its shared memory) explicitly."""
    try:
        child_entry(spec_json, result_file)
    finally:
        atexit._run_exitfuncs()


# --------------------------------------------------------------------------- #
# Parent side: orchestration
# --------------------------------------------------------------------------- #
PRELOAD = ["torch", "torch.distributed.checkpoint", "snapshotkit", "numpy"]


def check_available(mode: str) -> str | None:
    """None if the mode can run here, else the reason."""
    try:
        if mode in ("thread", "process"):
            from snapshotkit import Snapshot

            if not hasattr(Snapshot, "async_take"):
                return "snapshotkit.Snapshot has no async_take"
        elif mode in ("dcp", "dcp_reuse"):
            import torch.distributed.checkpoint as dcp

            if not hasattr(dcp, "async_save"):
                return "torch.distributed.checkpoint has no async_save"
            if mode == "dcp_reuse":
                from torch.distributed.checkpoint.staging import DefaultStager  # noqa: F401
    except Exception as exc:
        return f"import failed: {type(exc).__name__}: {exc}"
    return None


def calibrate(cfg: dict[str, Any], seconds: float = 3.0) -> float:
    """Seconds per training step of this trainer on one thread, measured here."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        model, optim, batches = build_trainer(cfg)
        for i in range(10):
            train_step(model, optim, batches[i % len(batches)])
        n, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            train_step(model, optim, batches[n % len(batches)])
            n += 1
        return (time.perf_counter() - t0) / n
    finally:
        torch.set_num_threads(threads)


def other_activity() -> dict[str, Any]:
    """Load average and other processes that look like benchmarks or test runs."""
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


def summarize_memcpy(runs: list[dict[str, Any]]) -> dict[str, Any]:
    good = [r for r in runs if r.get("ok")]
    out: dict[str, Any] = {"runs": runs, "n_ok": len(good)}
    if not good:
        out["error"] = next((r.get("error") for r in runs), "no run")
        return out
    out.update(
        bytes=good[0]["bytes"],
        prealloc_median_s=C.median(x for r in good for x in r["prealloc_s"]),
        fresh_median_s=C.median(x for r in good for x in r["fresh_s"]),
    )
    return out


def summarize_mode(runs: list[dict[str, Any]]) -> dict[str, Any]:
    good = [r for r in runs if r.get("ok")]
    out: dict[str, Any] = {"runs": runs, "n_ok": len(good)}
    errors = [r["error"] for r in runs if r.get("error")]
    if errors:
        out["error"] = errors[0]
    if not good:
        return out

    def med(key: str) -> Any:
        return C.median(r.get(key) for r in good)

    def med_sub(group: str, key: str) -> Any:
        return C.median(r[group].get(key) for r in good)

    out.update(
        loop_s=med("loop_s"),
        loop_excl_blocked_s=med("loop_excl_blocked_s"),
        loop_incl_blocked_s=med("loop_incl_blocked_s"),
        blocked_call_s=med("blocked_call_s"),
        blocked_wait_s=med("blocked_wait_s"),
        final_wait_s=med("final_wait_s"),
        step_all_mean_s=med_sub("steps_all", "mean_s"),
        step_all_median_s=med_sub("steps_all", "median_s"),
        step_in_flight_mean_s=med_sub("steps_in_flight", "mean_s"),
        step_in_flight_median_s=med_sub("steps_in_flight", "median_s"),
        step_in_flight_p99_s=med_sub("steps_in_flight", "p99_s"),
        steps_in_flight=med_sub("steps_in_flight", "n"),
        step_idle_mean_s=med_sub("steps_idle", "mean_s"),
        step_idle_median_s=med_sub("steps_idle", "median_s"),
        process_cpu_s=med("process_cpu_s"),
        main_thread_cpu_s=med("main_thread_cpu_s"),
        main_thread_runq_wait_s=med("main_thread_runq_wait_s"),
        system_steal_fraction=med("system_steal_fraction"),
        in_flight_cost_s=med("in_flight_cost_s"),
        in_flight_slowdown_estimate=med("in_flight_slowdown_estimate"),
        writer_process_cpu_s=med("writer_process_cpu_s"),
        system_busy_fraction=med("system_busy_fraction"),
        staged_bytes=good[0]["staged_bytes"],
    )
    firsts = [r["first_call_s"] for r in good if r.get("first_call_s") is not None]
    laters = [x for r in good for x in r.get("later_calls_s", [])]
    writes = [c["write_s"] for r in good for c in r.get("calls", []) if c.get("write_s") is not None]
    if firsts:
        out.update(
            first_call_median_s=C.median(firsts),
            first_call_max_s=max(firsts),
            later_call_median_s=C.median(laters),
            later_call_max_s=max(laters) if laters else None,
            later_call_cpu_median_s=C.median(c["call_cpu_s"] for r in good for c in r.get("calls", [])[1:]),
            later_call_runq_wait_median_s=C.median(c["call_runq_wait_s"] for r in good for c in r.get("calls", [])[1:]),
            n_later_calls=len(laters),
            write_median_s=C.median(writes),
            write_max_s=max(writes) if writes else None,
            writes_done_in_time=all(r.get("writes_done_in_time", True) for r in good),
            verified=all(r.get("verified") is not False for r in good) and any(r.get("verified") for r in good),
        )
    return out


def compute_ratios(results: dict[str, Any], memcpy: dict[str, Any]) -> dict[str, Any]:
    none = results.get("none", {})
    base_loop = none.get("loop_s")
    base_step = none.get("step_all_mean_s")
    base_step_med = none.get("step_all_median_s")
    none_runs = {r.get("repeat"): r for r in none.get("runs", []) if r.get("ok")}
    out: dict[str, Any] = {}
    for mode, s in results.items():
        if mode == "none" or "loop_s" not in s:
            continue
        paired = [
            r["loop_excl_blocked_s"] / none_runs[r["repeat"]]["loop_s"] - 1
            for r in s["runs"]
            if r.get("ok") and r.get("repeat") in none_runs
        ]
        excl, incl = C.ratio(s.get("loop_excl_blocked_s"), base_loop), C.ratio(s.get("loop_incl_blocked_s"), base_loop)
        fly, fly_med = (
            C.ratio(s.get("step_in_flight_mean_s"), base_step),
            C.ratio(s.get("step_in_flight_median_s"), base_step_med),
        )
        out[mode] = {
            "later_call_over_memcpy": C.ratio(s.get("later_call_median_s"), memcpy.get("prealloc_median_s")),
            "first_call_over_memcpy": C.ratio(s.get("first_call_median_s"), memcpy.get("prealloc_median_s")),
            "first_call_over_memcpy_fresh": C.ratio(s.get("first_call_median_s"), memcpy.get("fresh_median_s")),
            "slowdown_excl_blocked": None if excl is None else excl - 1,
            "slowdown_incl_blocked": None if incl is None else incl - 1,
            "slowdown_excl_blocked_paired_median": C.median(paired),
            "step_in_flight_mean_over_none": fly,
            "step_in_flight_median_over_none": fly_med,
            "in_flight_slowdown_estimate": s.get("in_flight_slowdown_estimate"),
            "step_in_flight_mean_over_idle_same_run": C.ratio(
                s.get("step_in_flight_mean_s"), s.get("step_idle_mean_s")
            ),
        }
    proc, thr = out.get("process", {}), out.get("thread", {})
    out["targets"] = {
        "blocked_over_memcpy_max": TARGET_BLOCKED_OVER_MEMCPY,
        "process_slowdown_max": TARGET_PROCESS_SLOWDOWN,
        "process_blocked_met": _le(proc.get("later_call_over_memcpy"), TARGET_BLOCKED_OVER_MEMCPY),
        "thread_blocked_met": _le(thr.get("later_call_over_memcpy"), TARGET_BLOCKED_OVER_MEMCPY),
        "process_slowdown_met": _le(proc.get("slowdown_excl_blocked"), TARGET_PROCESS_SLOWDOWN),
        "process_better_than_thread": (
            None
            if proc.get("slowdown_excl_blocked") is None or thr.get("slowdown_excl_blocked") is None
            else proc["slowdown_excl_blocked"] < thr["slowdown_excl_blocked"]
        ),
    }
    return out


def _le(value: float | None, limit: float) -> bool | None:
    return None if value is None else value <= limit


# --------------------------------------------------------------------------- #
# Rendering
# --------------------------------------------------------------------------- #
def _x(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}x"


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{v * 100:+.1f}%"


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v * 1e3:.2f}"


def _verdict(v: bool | None) -> str:
    return {True: "MET", False: "MISSED", None: "n/a"}[v]


def render(report: dict[str, Any]) -> str:
    m, cfg = report["machine"], report["config"]
    lines = [
        f"machine: {m.get('cpu_model')} | {m.get('logical_cpus')} cpus | RAM {C.fmt_bytes(m.get('ram_bytes'))}"
        f" | kernel {m.get('kernel')} | fs {m.get('scratch_fs', {}).get('type')} | torch {m['versions'].get('torch')}",
        f"state: big {C.fmt_bytes(cfg['state_bytes'])} ({cfg['state_bytes'] // cfg['tensor_bytes']} x "
        f"{C.fmt_bytes(cfg['tensor_bytes'])} float32) + model/optimizer = {C.fmt_bytes(report.get('staged_bytes'))} "
        f"per snapshot | MLP {cfg['in_features']}-{cfg['hidden']}x{cfg['layers']}-10, batch {cfg['batch']}, Adam, "
        "1 torch thread",
        f"loop: {cfg['steps']} steps (calibrated {_ms(cfg.get('calibrated_step_s'))} ms/step), snapshot every "
        f"{cfg['every']} steps ({cfg['snapshots']} snapshots), median of {cfg['repeats']} repeat(s); "
        f"memory budget {C.fmt_bytes(cfg['memory_budget_bytes']) if cfg['memory_budget_bytes'] else 'default'}",
    ]
    act = report["activity"]
    others = act["start"]["other_benchmarks_or_tests"] + act["end"]["other_benchmarks_or_tests"]
    lines.append(
        f"load average at start {' '.join(act['start']['loadavg'])}, at end {' '.join(act['end']['loadavg'])}; "
        + (f"OTHER BENCHMARKS/TESTS SEEN: {others}" if others else "no other benchmark or test process seen")
    )
    mc = report["memcpy"]
    lines.append("")
    if mc.get("n_ok"):
        lines.append(
            f"memcpy (Tensor.copy_, 1 thread) of the same {C.fmt_bytes(mc['bytes'])}: into pre-allocated tensors "
            f"{mc['prealloc_median_s']:.3f} s ({mc['bytes'] / mc['prealloc_median_s'] / C.GiB:.2f} GiB/s) "
            f"[the ratio's baseline]; into fresh tensors {mc['fresh_median_s']:.3f} s "
            f"({mc['bytes'] / mc['fresh_median_s'] / C.GiB:.2f} GiB/s)"
        )
    else:
        lines.append(f"memcpy: FAILED: {mc.get('error')}")
    res, ratios = report["results"], report["ratios"]

    lines.append("")
    lines.append("== time blocked in the snapshot call ==")
    lines.append(
        f"{'mode':<31}{'first s':>9}{'later s':>9}{'max':>7}{'cpu':>7}{'runq':>7}{'later/memcpy':>14}"
        f"{'first/memcpy':>14}{'first/fresh':>13}{'write s':>9}{'in time':>9}{'verified':>10}"
    )
    for mode in report["config"]["modes"]:
        if mode == "none":
            continue
        s, r = res.get(mode, {}), ratios.get(mode, {})
        if "skipped" in s or "first_call_median_s" not in s:
            lines.append(f"{LABELS[mode]:<31}  {s.get('skipped') or 'FAILED: ' + str(s.get('error'))[:150]}")
            continue
        lines.append(
            f"{LABELS[mode]:<31}{s['first_call_median_s']:>9.3f}{C.fmt_num(s['later_call_median_s']):>9}"
            f"{C.fmt_num(s['later_call_max_s']):>7}{C.fmt_num(s['later_call_cpu_median_s']):>7}"
            f"{C.fmt_num(s['later_call_runq_wait_median_s']):>7}{_x(r['later_call_over_memcpy']):>14}"
            f"{_x(r['first_call_over_memcpy']):>14}{_x(r['first_call_over_memcpy_fresh']):>13}"
            f"{C.fmt_num(s['write_median_s'], '.2f'):>9}{s['writes_done_in_time']!s:>9}{s['verified']!s:>10}"
        )
    lines.append(
        "  first = first call of a run (median over runs); later = median of the other calls; cpu / runq = the "
        "trainer thread's CPU time / time runnable but waiting for a CPU during a later call (medians); "
        "write = from a call's return until its write was done"
    )

    lines.append("")
    lines.append("== training loop ==")
    lines.append(
        f"{'mode':<31}{'loop s':>8}{'blocked':>9}{'slowdown':>10}{'incl.':>9}{'paired':>9}{'in-run':>9}"
        f"{'step ms':>9}{'in flight':>11}{'vs none':>9}{'vs idle':>9}{'n':>6}"
    )
    for mode in report["config"]["modes"]:
        s, r = res.get(mode, {}), ratios.get(mode, {})
        if "loop_s" not in s:
            lines.append(f"{LABELS[mode]:<31}  {s.get('skipped') or 'FAILED: ' + str(s.get('error'))[:150]}")
            continue
        blocked = (s.get("blocked_call_s") or 0) + (s.get("blocked_wait_s") or 0)
        lines.append(
            f"{LABELS[mode]:<31}{s['loop_s']:>8.2f}{blocked:>9.2f}{_pct(r.get('slowdown_excl_blocked')):>10}"
            f"{_pct(r.get('slowdown_incl_blocked')):>9}{_pct(r.get('slowdown_excl_blocked_paired_median')):>9}"
            f"{_pct(r.get('in_flight_slowdown_estimate')):>9}"
            f"{_ms(s['step_all_mean_s']):>9}{_ms(s['step_in_flight_mean_s']):>11}"
            f"{_x(r.get('step_in_flight_mean_over_none')):>9}{_x(r.get('step_in_flight_mean_over_idle_same_run')):>9}"
            f"{C.fmt_num(s['steps_in_flight'], '.0f'):>6}"
        )
    lines.append(
        "  slowdown = (loop - time blocked in snapshot calls and waits) / no-snapshot loop - 1 (medians over "
        "repeats); incl. = with the blocked time; paired = median over repeats of the same against the same "
        "repeat's no-snapshot run; in-run = (in-flight steps - as many of the same run's other steps) / the rest "
        "of the loop, immune to run-to-run drift"
    )
    none_loops = [r["loop_s"] for r in res.get("none", {}).get("runs", []) if r.get("ok")]
    idle = [
        r["steps_idle"]["mean_s"]
        for m in res.values()
        for r in m.get("runs", [])
        if r.get("ok") and r.get("steps_idle", {}).get("mean_s")
    ]
    if none_loops and idle:
        lines.append(
            f"  noise: no-snapshot loop {min(none_loops):.2f}..{max(none_loops):.2f} s over {len(none_loops)} "
            f"run(s) ({(max(none_loops) / min(none_loops) - 1) * 100:.1f}% spread); mean step with no write in "
            f"flight {_ms(min(idle))}..{_ms(max(idle))} ms over all {len(idle)} runs (the same work)"
        )
    lines.append(
        "  step ms = mean step time without blocked time; in flight = mean of the n steps after which a "
        "background write was still running; vs none / vs idle = that over the no-snapshot run's mean step / "
        "over the same run's other steps"
    )
    lines.append("")
    lines.append("== CPU over the loop (s; medians) ==")
    lines.append(
        f"{'mode':<31}{'trainer cpu':>12}{'runq wait':>11}{'process cpu':>13}{'daemon cpu':>12}{'machine busy':>14}"
        f"{'steal':>7}"
    )
    for mode in report["config"]["modes"]:
        s = res.get(mode, {})
        if "loop_s" not in s:
            continue
        lines.append(
            f"{LABELS[mode]:<31}{C.fmt_num(s['main_thread_cpu_s'], '.1f'):>12}"
            f"{C.fmt_num(s['main_thread_runq_wait_s'], '.1f'):>11}{C.fmt_num(s['process_cpu_s'], '.1f'):>13}"
            f"{C.fmt_num(s['writer_process_cpu_s'], '.1f'):>12}{C.fmt_num(s['system_busy_fraction'], '.0%'):>14}"
            f"{C.fmt_num(s['system_steal_fraction'], '.1%'):>7}"
        )
    lines.append(
        "  trainer = the training thread (on CPU / runnable but waiting); process = the trainer's process, "
        "writer threads included; daemon = the checkpoint daemon (process executor), from its start; "
        "machine busy / steal = share of both cores' time"
    )

    t = ratios.get("targets", {})
    proc, thr = ratios.get("process", {}), ratios.get("thread", {})
    lines.append("")
    lines.append("-- targets --")
    lines.append(
        f"blocked in async_take (later calls) / memcpy <= {TARGET_BLOCKED_OVER_MEMCPY}x: process "
        f"{_x(proc.get('later_call_over_memcpy'))} {_verdict(t.get('process_blocked_met'))}, thread "
        f"{_x(thr.get('later_call_over_memcpy'))} {_verdict(t.get('thread_blocked_met'))}"
    )
    lines.append(
        f"process executor slowdown (excl. blocked) <= {TARGET_PROCESS_SLOWDOWN:.0%}: "
        f"{_pct(proc.get('slowdown_excl_blocked'))} {_verdict(t.get('process_slowdown_met'))}; thread executor "
        f"{_pct(thr.get('slowdown_excl_blocked'))}; process better than thread: {t.get('process_better_than_thread')}"
    )
    for mode in ("dcp", "dcp_reuse"):
        d = ratios.get(mode)
        if d:
            lines.append(
                f"{LABELS[mode]}: later calls / memcpy {_x(d['later_call_over_memcpy'])}, slowdown excl. blocked "
                f"{_pct(d['slowdown_excl_blocked'])} (incl. {_pct(d['slowdown_incl_blocked'])})"
            )
    return "\n".join(lines)


# --------------------------------------------------------------------------- #
# Main
# --------------------------------------------------------------------------- #
def default_out() -> Path:
    return Path(__file__).resolve().parent / "results" / f"bench_async-{time.strftime('%Y-%m-%d')}.json"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--out", default=None, help="JSON result file (default: benchmarks/results/bench_async-<date>.json)"
    )
    ap.add_argument("--dir", default=None, help="scratch directory (default: a new temp dir under /tmp)")
    ap.add_argument("--modes", default=",".join(MODES), help="comma-separated subset of: " + ",".join(MODES))
    ap.add_argument(
        "--repeats", type=int, default=5, help="runs per mode; the median is reported (default 5: VMs drift)"
    )
    ap.add_argument("--state-bytes", type=C.parse_size, default=C.GiB, help="big state total (default 1GiB)")
    ap.add_argument("--tensor-bytes", type=C.parse_size, default=64 * C.MiB, help="big tensor size (default 64MiB)")
    ap.add_argument("--in-features", type=int, default=256, help="MLP input width (default 256)")
    ap.add_argument("--hidden", type=int, default=1024, help="MLP hidden width (default 1024)")
    ap.add_argument("--layers", type=int, default=2, help="MLP hidden layers (default 2)")
    ap.add_argument("--batch", type=int, default=64, help="batch size (default 64)")
    ap.add_argument(
        "--steps", type=int, default=0, help="training steps per run (default: calibrated to --run-seconds)"
    )
    ap.add_argument("--run-seconds", type=float, default=40.0, help="target loop length when calibrating (40)")
    ap.add_argument("--snapshots", type=int, default=4, help="snapshots per run (default 4)")
    ap.add_argument("--every", type=int, default=0, help="steps between snapshots (default: steps // (snapshots + 1))")
    ap.add_argument("--warmup-steps", type=int, default=20, help="untimed steps before the loop (20)")
    ap.add_argument("--memcpy-iters", type=int, default=5, help="copies per memcpy run (5)")
    ap.add_argument(
        "--memory-budget-bytes", type=C.parse_size, default=None, help="snapshotkit budget (default: its own)"
    )
    ap.add_argument(
        "--writer-nice",
        type=int,
        default=0,
        help="diagnostic: renice the writer's threads (daemon / non-trainer threads) to this value after each "
        "snapshot call (default 0: untouched)",
    )
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--quick", action="store_true", help="smoke-test sizes: 32 MiB state, tiny MLP, 60 steps, 1 repeat")
    ap.add_argument("--no-verify", action="store_true", help="skip restoring and checking the last snapshot")
    ap.add_argument(
        "--launcher",
        choices=("subprocess", "forkserver"),
        default=None,
        help="how each run's fresh process starts (default: subprocess; forkserver with --quick)",
    )
    ap.add_argument("--op-timeout", type=float, default=1800.0, help="seconds per run before it is killed")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--result-file", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child is not None:
        return args
    args.launcher = args.launcher or ("forkserver" if args.quick else "subprocess")
    if args.quick:
        args.state_bytes, args.tensor_bytes = 32 * C.MiB, 4 * C.MiB
        args.in_features, args.hidden, args.layers, args.batch = 64, 128, 2, 32
        args.steps, args.snapshots, args.every, args.repeats = args.steps or 60, 2, 0, 1
        args.warmup_steps, args.memcpy_iters = 5, 2
    chosen = [s.strip() for s in args.modes.split(",") if s.strip()]
    bad = sorted(set(chosen) - set(MODES))
    if bad or not chosen:
        ap.error(f"--modes: unknown or empty selection {bad}; choose from {','.join(MODES)}")
    args.modes = [m for m in MODES if m in chosen]
    if args.repeats < 1:
        ap.error("--repeats must be >= 1")
    if args.snapshots < 1:
        ap.error("--snapshots must be >= 1")
    if args.tensor_bytes < 4096 or args.tensor_bytes % 4096 or args.state_bytes % args.tensor_bytes:
        ap.error("--tensor-bytes must be a multiple of 4096 and divide --state-bytes")
    if args.steps < 0 or args.every < 0:
        ap.error("--steps and --every must be >= 0")
    if args.steps and args.every and args.every * args.snapshots > args.steps:
        ap.error("--every * --snapshots must not exceed --steps")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.child is not None:
        child_entry(args.child, args.result_file)
        return 0
    cfg: dict[str, Any] = {
        "state_bytes": args.state_bytes,
        "tensor_bytes": args.tensor_bytes,
        "in_features": args.in_features,
        "hidden": args.hidden,
        "layers": args.layers,
        "batch": args.batch,
        "seed": args.seed,
        "warmup_steps": args.warmup_steps,
        "memcpy_iters": args.memcpy_iters,
        "memory_budget_bytes": args.memory_budget_bytes,
        "snapshots": args.snapshots,
        "writer_nice": args.writer_nice,
        "calibrated_step_s": None,
    }
    steps = args.steps
    if not steps:
        cfg["calibrated_step_s"] = calibrate(cfg)
        steps = max(args.snapshots + 1, round(args.run_seconds / cfg["calibrated_step_s"]))
    every = args.every or steps // (args.snapshots + 1)
    if every < 1 or every * args.snapshots > steps:
        print("bench_async.py: error: too few steps for the snapshots asked for", file=sys.stderr)
        return 2
    cfg.update(steps=steps, every=every)
    if args.dir:
        Path(args.dir).mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix="snapshotkit-bench-async-", dir=args.dir or "/tmp"))
    out = Path(args.out) if args.out else default_out()
    available = {m: check_available(m) for m in args.modes}
    report: dict[str, Any] = {
        "benchmark": "bench_async",
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "config": {
            **cfg,
            "repeats": args.repeats,
            "modes": args.modes,
            "scratch_dir": str(scratch),
            "snapshotkit_env": {k: v for k, v in os.environ.items() if k.startswith("SNAPSHOTKIT_")},
            "quick": args.quick,
        },
        "machine": C.machine_facts(str(scratch)),
        "activity": {"start": other_activity()},
        "notes": {
            "memcpy": "Tensor.copy_ of every staged tensor (big state + model + Adam state) on one torch thread, "
            "into pre-allocated tensors touched beforehand (prealloc: the ratio's baseline) or into fresh "
            "empty_like tensors (fresh: page faults included); median over all copies of all repeats",
            "first_call": "the first snapshot call of each run; every run is a fresh process, so it pays for "
            "starting the writer (I/O thread or checkpoint daemon) and allocating staging buffers",
            "later_call": "median over the 2nd..Nth calls of all runs (warm, pooled buffers for snapshotkit)",
            "slowdown_excl_blocked": "(loop - time in snapshot calls - time waiting for the previous snapshot) / "
            "median no-snapshot loop - 1, from medians over repeats",
            "write_s": "from a call's return until its write was seen complete (checked after every step, so "
            "resolution is one step) or until wait() returned",
            "in_flight": "steps after which the last snapshot was not done yet",
            "cpu": "main_thread_cpu_s = trainer thread CPU time over the loop; process_cpu_s includes "
            "snapshotkit/DCP writer threads; writer_process_cpu_s = the checkpoint daemon (process executor)",
            "dcp": "torch.distributed.checkpoint.async_save works without a process group in this torch "
            "(no_dist=True; without it it warns and proceeds single-process). Its PROCESS executor needs an "
            "initialized process group and is not measured",
        },
        "results": {},
    }
    print(
        f"steps {steps}, snapshot every {every} (calibrated step {_ms(cfg['calibrated_step_s'])} ms); "
        f"modes {','.join(args.modes)}; {args.repeats} repeat(s); scratch {scratch}",
        file=sys.stderr,
        flush=True,
    )
    result_file = str(scratch / "op_result.json")
    launcher = C.Launcher(
        args.launcher, args.op_timeout, script=Path(__file__).resolve(), entry=forked_child_entry, preload=PRELOAD
    )
    memcpy_runs: list[dict[str, Any]] = []
    runs: dict[str, list[dict[str, Any]]] = {m: [] for m in args.modes}
    try:
        for rep in range(args.repeats):
            base = {"cfg": cfg, "verify": not args.no_verify}
            rec = launcher.run({**base, "op": "memcpy"}, result_file)
            rec["repeat"] = rep
            memcpy_runs.append(rec)
            status = f"{rec['prealloc_median_s']:.3f} s" if rec.get("ok") else f"FAILED: {rec.get('error')}"
            print(f"[{rep + 1}/{args.repeats}] memcpy: {status}", file=sys.stderr, flush=True)
            order = args.modes[rep % len(args.modes) :] + args.modes[: rep % len(args.modes)]  # rotate against drift
            for mode in order:
                if available[mode]:
                    continue
                workdir = scratch / f"{mode}-{rep}"
                spec = {**base, "op": "train", "mode": mode, "workdir": str(workdir)}
                try:
                    rec = launcher.run(spec, result_file)
                finally:
                    shutil.rmtree(workdir, ignore_errors=True)
                rec["repeat"] = rep
                runs[mode].append(rec)
                if rec.get("ok"):
                    status = (
                        f"loop {rec['loop_s']:.2f} s, blocked {rec['blocked_call_s']:.2f}+{rec['blocked_wait_s']:.2f}"
                        f" s, calls {[round(c['call_s'], 3) for c in rec['calls']]}"
                    )
                else:
                    status = f"FAILED: {str(rec.get('error'))[:300]}"
                print(f"[{rep + 1}/{args.repeats}] {mode}: {status}", file=sys.stderr, flush=True)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    report["memcpy"] = summarize_memcpy(memcpy_runs)
    report["results"] = {
        m: ({"skipped": available[m]} if available[m] else summarize_mode(runs[m])) for m in args.modes
    }
    report["staged_bytes"] = next(
        (s["staged_bytes"] for s in report["results"].values() if s.get("staged_bytes")), report["memcpy"].get("bytes")
    )
    report["ratios"] = compute_ratios(report["results"], report["memcpy"])
    report["activity"]["end"] = other_activity()
    report["finished"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2))
    print(render(report))
    print(f"\nJSON written to {out}")
    failed = [m for m in args.modes if not available[m] and report["results"][m].get("n_ok", 0) < args.repeats]
    return 1 if failed or not report["memcpy"].get("n_ok") else 0


if __name__ == "__main__":
    sys.exit(main())
