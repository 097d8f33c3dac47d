"""Async snapshot benchmark: what a CPU-bound training loop pays for background snapshots.

It trains the same small MLP on one torch thread for a fixed number of steps, each way in a
fresh process: with no snapshots (``none``), with ``Snapshot.async_take`` every K steps
(``thread`` and ``process`` executors), and with DCP's ``async_save`` (``dcp``, and ``dcp_reuse``
with one ``DefaultStager`` for the run). The state is the model and its Adam optimizer plus a big
state (default 1 GiB of 64 MiB float32 tensors) that every step keeps writing to. It measures the
time blocked in the snapshot call (first call, and the median of later ones) against a
``Tensor.copy_`` of the same bytes, the loop's slowdown (also an in-run estimate immune to drift
between runs), CPU and scheduling figures, and restores the last snapshot bit for bit
(``--no-verify`` skips). ``--writer-nice N`` is a diagnostic that renices the writers. The
method, in full, and the results: docs/benchmarks.md, "async_take".

Usage::

    python benchmarks/bench_async.py                      # 1 GiB, ~40 s per run, 5 repeats (~25 min)
    python benchmarks/bench_async.py --quick --out /tmp/async.json
    python benchmarks/bench_async.py --modes none,process --repeats 1 --state-bytes 256MiB
    python benchmarks/bench_async.py --help

Results go to benchmarks/results/bench_async-<date>.json unless ``--out`` says otherwise.
"""

from __future__ import annotations

import contextlib
import copy
import gc
import os
import shutil
import statistics
import sys
import time
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # _harness, also when imported by a test

from _harness import Record, cli, launch
from _harness import measure as M
from _harness import report as R
from _harness import workloads as W

_ASYNC_TAKE = [("snapshotkit", ("Snapshot.async_take",))]
_ASYNC_SAVE = [("torch.distributed.checkpoint", ("async_save",))]
# mode -> (its name in the tables, the (module, names) that must import for it to be measured)
_MODES: dict[str, tuple[str, list[tuple[str, tuple[str, ...]]]]] = {
    "none": ("no snapshots", []),
    "thread": ("snapshotkit thread", _ASYNC_TAKE),
    "process": ("snapshotkit process", _ASYNC_TAKE),
    "thread_warm": ("snapshotkit thread, prepared", _ASYNC_TAKE),
    "process_warm": ("snapshotkit process, prepared", _ASYNC_TAKE),
    "dcp": ("dcp async_save", _ASYNC_SAVE),
    "dcp_reuse": (
        "dcp async_save, reused stager",
        [*_ASYNC_SAVE, ("torch.distributed.checkpoint.staging", ("DefaultStager",))],
    ),
}
MODES = tuple(_MODES)
LABELS = {mode: label for mode, (label, _) in _MODES.items()}
MUTATE_ELEMS = 256 * 1024  # float32 elements of one big tensor overwritten per step (1 MiB)
TARGET_BLOCKED_OVER_MEMCPY = 1.5
TARGET_PROCESS_SLOWDOWN = 0.05
TARGET_FIRST_AFTER_PREPARE_OVER_MEMCPY = 2.0  # issue 17 item 4: the first call after prepare_async


# --------------------------------------------------------------------------- #
# The state and the trainer (children)
# --------------------------------------------------------------------------- #
def big_specs(cfg: Record) -> list[W.TensorSpec]:
    """The big state: ``state_bytes / tensor_bytes`` float32 tensors of seeded random data."""
    return W.sized_specs(cfg["state_bytes"], cfg["tensor_bytes"], cfg["seed"], name="big{:03d}", first_seed=0)


def mutated_slice(t: Any) -> Any:
    return t.view(-1)[: min(MUTATE_ELEMS, t.numel())]


def last_mutation(index: int, count: int, step: int) -> int | None:
    """The last step <= ``step`` that wrote into big tensor ``index`` (step s writes s % count)."""
    s = step - ((step - index) % count)
    return s if s >= 1 else None


def expected_big(spec: W.TensorSpec, index: int, count: int, step: int) -> Any:
    """Big tensor ``index`` as it was right after training step ``step``."""
    want = W.spec_tensor(spec)
    s = last_mutation(index, count, step)
    if s is not None:
        mutated_slice(want).fill_(float(s))
    return want


def build_trainer(cfg: Record) -> tuple[Any, Any, list[tuple[Any, Any]]]:
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


def check_big(dest: Record, specs: Sequence[W.TensorSpec], step: int, problems: list[str]) -> None:
    import torch

    for i, spec in enumerate(specs):
        if not torch.equal(dest[spec.name], expected_big(spec, i, len(specs), step)):
            problems.append(f"big/{spec.name}: differs from the state at step {step}")


def staged_tensors(model: Any, optim: Any, big: Record) -> list[Any]:
    """Every tensor a snapshot copies: the big state, the model's and the optimizer's."""
    import torch

    out = list(big.values()) + list(model.state_dict().values())
    for per_param in optim.state_dict()["state"].values():
        out += [v for v in per_param.values() if isinstance(v, torch.Tensor)]
    return out


# --------------------------------------------------------------------------- #
# Snapshot drivers (children)
# --------------------------------------------------------------------------- #
class Driver:
    """What the loop needs of a snapshotting library: start a snapshot, poll and wait for it."""

    @staticmethod
    def done(handle: Any) -> bool:
        return bool(handle.done())

    def writer_pid(self) -> int | None:
        return None  # the writer is a thread of this process

    def close(self) -> None:
        pass

    @staticmethod
    def problems(restored: tuple[Any, Any, Any], cfg: Record, expected: Record, step: int) -> list[str]:
        """How the restored (model state dict, optimizer state dict, big state) differ from the state
        at the snapshot call."""
        problems: list[str] = []
        compare_tree(restored[0], expected["model"], "model", problems)
        compare_tree(restored[1], expected["optim"], "optim", problems)
        check_big(restored[2], big_specs(cfg), step, problems)
        return problems


class SnapshotkitDriver(Driver):
    def __init__(self, executor: str, model: Any, optim: Any, big: Record, budget: int | None, warm: bool) -> None:
        from snapshotkit import Snapshot, StateDict

        self._snapshot = Snapshot
        self.executor, self.budget = executor, budget
        self.app_state = {"model": model, "optim": optim, "big": StateDict(big)}
        self.prepare_s: float | None = None
        self.prepared_bytes: int | None = None
        if warm:  # before the loop, untimed by it: the warm-up's own cost is reported apart
            t0 = time.perf_counter()
            self.prepared_bytes = Snapshot.prepare_async(self.app_state, memory_budget_bytes=budget, executor=executor)
            self.prepare_s = time.perf_counter() - t0

    def start(self, path: str) -> Any:
        return self._snapshot.async_take(path, self.app_state, memory_budget_bytes=self.budget, executor=self.executor)

    @staticmethod
    def wait(handle: Any) -> None:
        handle.wait()

    def writer_pid(self) -> int | None:
        if self.executor != "process":
            return None
        from snapshotkit._take.executors import checkpoint_daemon_pid

        return checkpoint_daemon_pid()

    def verify(self, path: str, cfg: Record, expected: Record, step: int) -> list[str]:
        from snapshotkit import StateDict

        model, optim, batches = build_trainer(cfg)
        train_step(model, optim, batches[0])  # so the optimizer has state to restore into
        big = W.destination(big_specs(cfg))
        self._snapshot(path).restore({"model": model, "optim": optim, "big": StateDict(big)})
        return self.problems((model.state_dict(), optim.state_dict(), big), cfg, expected, step)


class DcpDriver(Driver):
    def __init__(self, reuse: bool, model: Any, optim: Any, big: Record) -> None:
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
    def wait(handle: Any) -> None:
        handle.result()

    def close(self) -> None:
        if self.stager is not None:
            self.stager.close()

    def verify(self, path: str, cfg: Record, expected: Record, step: int) -> list[str]:
        dest = {
            "model": clone_tree(expected["model"], zero=True),
            "optim": clone_tree(expected["optim"], zero=True),
            "big": W.destination(big_specs(cfg)),
        }
        self._dcp.load(dest, checkpoint_id=path, no_dist=True)
        return self.problems((dest["model"], dest["optim"], dest["big"]), cfg, expected, step)


def make_driver(mode: str, cfg: Record, model: Any, optim: Any, big: Record) -> Driver:
    if mode in ("thread", "process", "thread_warm", "process_warm"):
        executor, warm = mode.removesuffix("_warm"), mode.endswith("_warm")
        return SnapshotkitDriver(executor, model, optim, big, cfg["memory_budget_bytes"], warm)
    return DcpDriver(mode == "dcp_reuse", model, optim, big)


# --------------------------------------------------------------------------- #
# Writer priority and step statistics
# --------------------------------------------------------------------------- #
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


def _step_stats(values: Sequence[float]) -> Record:
    return {
        "n": len(values),
        "mean_s": statistics.fmean(values) if values else None,
        "median_s": statistics.median(values) if values else None,
        "p90_s": M.percentile(values, 0.9),
        "p99_s": M.percentile(values, 0.99),
        "max_s": max(values) if values else None,
    }


# --------------------------------------------------------------------------- #
# Child operations
# --------------------------------------------------------------------------- #
def _setup(cfg: Record) -> tuple[list[W.TensorSpec], Record, Any, Any, list[tuple[Any, Any]]]:
    import torch

    torch.set_num_threads(1)
    specs = big_specs(cfg)
    big = W.materialize(specs)
    model, optim, batches = build_trainer(cfg)
    for i in range(cfg["warmup_steps"]):  # untimed; also gives the optimizer its state
        train_step(model, optim, batches[i % len(batches)])
    return specs, big, model, optim, batches


def run_memcpy(spec: Record) -> Record:
    """Copy the bytes a snapshot stages with ``Tensor.copy_`` on one thread."""
    import torch

    cfg = spec["cfg"]
    _, big, model, optim, _ = _setup(cfg)
    sources = staged_tensors(model, optim, big)
    nbytes = sum(t.numel() * t.element_size() for t in sources)
    dests = [torch.zeros_like(t) for t in sources]  # every page touched: the copies go to resident memory
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


def run_train(spec: Record) -> Record:
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
    calls: list[Record] = []  # one per snapshot call; the last one's write may be in flight
    expected: Record | None = None
    excluded = 0.0  # capturing the expected state for the verification (not the benchmark's cost)
    writer_pid: int | None = None

    def wait(call: Record) -> float:
        """Wait for the snapshot of ``call``: the seconds waited (and its write_s, unless seen done before)."""
        t0 = time.perf_counter()
        driver.wait(call["_handle"])  # type: ignore[union-attr]
        t1 = time.perf_counter()
        if call["write_s"] is None:
            call["write_s"] = t1 - call["_returned"]
        return t1 - t0

    nice = cfg.get("writer_nice") or 0
    os.sync()
    gc.collect()
    cpu0, sched0, sys0 = time.process_time(), M.thread_sched(), M.system_cpu()
    loop0 = time.perf_counter()
    for step in range(1, steps + 1):
        t0 = time.perf_counter()
        slices[step % nbig].fill_(float(step))
        train_step(model, optim, batches[step % len(batches)])
        blocked = 0.0
        if driver is not None and step % every == 0 and step // every <= snapshots:
            index = step // every
            if calls:
                calls[-1]["done_before_next"] = driver.done(calls[-1]["_handle"])
                calls[-1]["wait_s"] = waited = wait(calls[-1])
                blocked += waited
            call_sched0, tb = M.thread_sched(), time.perf_counter()
            handle = driver.start(str(workdir / f"snap{index}"))
            returned, call_sched1 = time.perf_counter(), M.thread_sched()
            calls.append(
                {
                    "step": step,
                    "call_s": returned - tb,
                    "call_cpu_s": call_sched1[0] - call_sched0[0],
                    "call_runq_wait_s": call_sched1[1] - call_sched0[1],
                    "_handle": handle,
                    "_returned": returned,
                    "write_s": None,
                }
            )
            blocked += returned - tb
            writer_pid = writer_pid or driver.writer_pid()
            with M.Measure() as aside:
                if nice:
                    renice_writer(driver, nice)
                if index == snapshots:
                    expected = {"model": clone_tree(model.state_dict()), "optim": clone_tree(optim.state_dict())}
            excluded += aside.time_s
            blocked += aside.time_s
        t1 = time.perf_counter()
        step_times.append(t1 - t0 - blocked)
        flying = bool(calls) and not driver.done(calls[-1]["_handle"])  # type: ignore[union-attr]
        in_flight.append(flying)
        if calls and not flying and calls[-1]["write_s"] is None:
            calls[-1]["write_s"] = t1 - calls[-1]["_returned"]
    loop_s = time.perf_counter() - loop0
    cpu_s, sched1, sys1 = time.process_time() - cpu0, M.thread_sched(), M.system_cpu()
    writer_cpu_s = M.process_cpu_s(writer_pid)

    final_wait_s = wait(calls[-1]) if calls else 0.0
    for c in calls:
        del c["_handle"], c["_returned"]

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
        "prepare_async_s": getattr(driver, "prepare_s", None),
        "prepared_bytes": getattr(driver, "prepared_bytes", None),
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
        "system_busy_fraction": M.cpu_fraction(sys0, sys1, 0),
        "system_steal_fraction": M.cpu_fraction(sys0, sys1, 2),
        "verified": verified,
        "torch_threads": torch.get_num_threads(),
    }


def run_child(spec: Record) -> Record:
    return run_memcpy(spec) if spec["op"] == "memcpy" else run_train(spec)


# --------------------------------------------------------------------------- #
# Parent side: orchestration
# --------------------------------------------------------------------------- #
PRELOAD = ["torch", "torch.distributed.checkpoint", "snapshotkit", "numpy"]


def calibrate(cfg: Record, seconds: float = 3.0) -> float:
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


def summarize_memcpy(runs: list[Record]) -> Record:
    out, good = M.run_summary(runs)
    if not good:
        out.setdefault("error", "no run")
        return out
    out.update(
        bytes=good[0]["bytes"],
        prealloc_median_s=M.median(x for r in good for x in r["prealloc_s"]),
        fresh_median_s=M.median(x for r in good for x in r["fresh_s"]),
    )
    return out


# A mode's summary holds the median over its repeats of these figures of a run, by the same name ...
RUN_MEDIANS = (
    "loop_s",
    "loop_excl_blocked_s",
    "loop_incl_blocked_s",
    "blocked_call_s",
    "blocked_wait_s",
    "final_wait_s",
    "process_cpu_s",
    "main_thread_cpu_s",
    "main_thread_runq_wait_s",
    "system_steal_fraction",
    "in_flight_cost_s",
    "in_flight_slowdown_estimate",
    "writer_process_cpu_s",
    "system_busy_fraction",
)
# ... and of these step statistics of a run: group -> {summary key: statistic}.
STEP_MEDIANS = {
    "steps_all": {"step_all_mean_s": "mean_s", "step_all_median_s": "median_s"},
    "steps_in_flight": {
        "step_in_flight_mean_s": "mean_s",
        "step_in_flight_median_s": "median_s",
        "step_in_flight_p99_s": "p99_s",
        "steps_in_flight": "n",
    },
    "steps_idle": {"step_idle_mean_s": "mean_s", "step_idle_median_s": "median_s"},
}


def summarize_mode(runs: list[Record]) -> Record:
    out, good = M.run_summary(runs, median_of=RUN_MEDIANS, first=("staged_bytes",))
    if not good:
        return out
    for group, stats in STEP_MEDIANS.items():
        out.update(M.medians(good, stats, group=group))
    firsts = [r["first_call_s"] for r in good if r.get("first_call_s") is not None]
    laters = [x for r in good for x in r.get("later_calls_s", [])]
    writes = [c["write_s"] for r in good for c in r.get("calls", []) if c.get("write_s") is not None]
    if firsts:
        out.update(
            first_call_median_s=M.median(firsts),
            first_call_max_s=max(firsts),
            later_call_median_s=M.median(laters),
            later_call_max_s=max(laters) if laters else None,
            later_call_cpu_median_s=M.median(c["call_cpu_s"] for r in good for c in r.get("calls", [])[1:]),
            later_call_runq_wait_median_s=M.median(c["call_runq_wait_s"] for r in good for c in r.get("calls", [])[1:]),
            n_later_calls=len(laters),
            write_median_s=M.median(writes),
            write_max_s=max(writes) if writes else None,
            prepare_async_median_s=M.median(r["prepare_async_s"] for r in good if r.get("prepare_async_s") is not None),
            writes_done_in_time=all(r.get("writes_done_in_time", True) for r in good),
            verified=all(r.get("verified") is not False for r in good) and any(r.get("verified") for r in good),
        )
    return out


def compute_ratios(results: Record, memcpy: Record) -> Record:
    none = results.get("none", {})
    base_loop = none.get("loop_s")
    none_runs = {r.get("repeat"): r for r in none.get("runs", []) if r.get("ok")}
    out: Record = {}
    for mode, s in results.items():
        if mode == "none" or "loop_s" not in s:
            continue
        paired = [
            r["loop_excl_blocked_s"] / none_runs[r["repeat"]]["loop_s"] - 1
            for r in s["runs"]
            if r.get("ok") and r.get("repeat") in none_runs
        ]
        excl, incl = M.ratio(s.get("loop_excl_blocked_s"), base_loop), M.ratio(s.get("loop_incl_blocked_s"), base_loop)
        out[mode] = {
            "later_call_over_memcpy": M.ratio(s.get("later_call_median_s"), memcpy.get("prealloc_median_s")),
            "first_call_over_memcpy": M.ratio(s.get("first_call_median_s"), memcpy.get("prealloc_median_s")),
            "first_call_over_memcpy_fresh": M.ratio(s.get("first_call_median_s"), memcpy.get("fresh_median_s")),
            "slowdown_excl_blocked": None if excl is None else excl - 1,
            "slowdown_incl_blocked": None if incl is None else incl - 1,
            "slowdown_excl_blocked_paired_median": M.median(paired),
            "step_in_flight_mean_over_none": M.ratio(s.get("step_in_flight_mean_s"), none.get("step_all_mean_s")),
            "step_in_flight_median_over_none": M.ratio(s.get("step_in_flight_median_s"), none.get("step_all_median_s")),
            "in_flight_slowdown_estimate": s.get("in_flight_slowdown_estimate"),
            "step_in_flight_mean_over_idle_same_run": M.ratio(
                s.get("step_in_flight_mean_s"), s.get("step_idle_mean_s")
            ),
        }
    proc, thr = out.get("process", {}), out.get("thread", {})
    out["targets"] = {
        "blocked_over_memcpy_max": TARGET_BLOCKED_OVER_MEMCPY,
        "process_slowdown_max": TARGET_PROCESS_SLOWDOWN,
        "process_blocked_met": M.within(proc.get("later_call_over_memcpy"), TARGET_BLOCKED_OVER_MEMCPY),
        "thread_blocked_met": M.within(thr.get("later_call_over_memcpy"), TARGET_BLOCKED_OVER_MEMCPY),
        "process_slowdown_met": M.within(proc.get("slowdown_excl_blocked"), TARGET_PROCESS_SLOWDOWN),
        "first_after_prepare_over_memcpy_max": TARGET_FIRST_AFTER_PREPARE_OVER_MEMCPY,
        **{
            f"{mode}_first_call_met": M.within(
                out.get(mode, {}).get("first_call_over_memcpy"), TARGET_FIRST_AFTER_PREPARE_OVER_MEMCPY
            )
            for mode in ("thread_warm", "process_warm")
        },
        "process_better_than_thread": (
            None
            if proc.get("slowdown_excl_blocked") is None or thr.get("slowdown_excl_blocked") is None
            else proc["slowdown_excl_blocked"] < thr["slowdown_excl_blocked"]
        ),
    }
    return out


# --------------------------------------------------------------------------- #
# Rendering
# --------------------------------------------------------------------------- #
CALL_COLUMNS = (
    "mode<31|first s>9|later s>9|max>7|cpu>7|runq>7|later/memcpy>14|first/memcpy>14|first/fresh>13|write s>9"
    "|in time>9|verified>10"
)
LOOP_COLUMNS = (
    "mode<31|loop s>8|blocked>9|slowdown>10|incl.>9|paired>9|in-run>9|step ms>9|in flight>11|vs none>9|vs idle>9|n>6"
)
CPU_COLUMNS = "mode<31|trainer cpu>12|runq wait>11|process cpu>13|daemon cpu>12|machine busy>14|steal>7"


def _failed_row(mode: str, s: Record) -> str:
    return f"{LABELS[mode]:<31}  {s.get('skipped') or 'FAILED: ' + str(s.get('error'))[:150]}"


def render(report: Record) -> str:
    m, cfg = report["machine"], report["config"]
    lines = [
        R.machine_line(m),
        f"state: big {R.fmt_bytes(cfg['state_bytes'])} ({cfg['state_bytes'] // cfg['tensor_bytes']} x "
        f"{R.fmt_bytes(cfg['tensor_bytes'])} float32) + model/optimizer = {R.fmt_bytes(report.get('staged_bytes'))} "
        f"per snapshot | MLP {cfg['in_features']}-{cfg['hidden']}x{cfg['layers']}-10, batch {cfg['batch']}, Adam, "
        "1 torch thread",
        f"loop: {cfg['steps']} steps (calibrated {R.fmt_ms(cfg.get('calibrated_step_s'))} ms/step), snapshot every "
        f"{cfg['every']} steps ({cfg['snapshots']} snapshots), median of {cfg['repeats']} repeat(s); "
        f"memory budget {R.fmt_bytes(cfg['memory_budget_bytes']) if cfg['memory_budget_bytes'] else 'default'}",
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
            f"memcpy (Tensor.copy_, 1 thread) of the same {R.fmt_bytes(mc['bytes'])}: into pre-allocated tensors "
            f"{mc['prealloc_median_s']:.3f} s ({mc['bytes'] / mc['prealloc_median_s'] / cli.GiB:.2f} GiB/s) "
            f"[the ratio's baseline]; into fresh tensors {mc['fresh_median_s']:.3f} s "
            f"({mc['bytes'] / mc['fresh_median_s'] / cli.GiB:.2f} GiB/s)"
        )
    else:
        lines.append(f"memcpy: FAILED: {mc.get('error')}")
    res, ratios = report["results"], report["ratios"]

    modes = [(mode, res.get(mode, {}), ratios.get(mode, {})) for mode in cfg["modes"]]
    lines += ["", "== time blocked in the snapshot call =="]
    rows: list[list[str] | str] = []
    for mode, s, r in modes:
        if mode == "none":
            continue
        if "first_call_median_s" not in s:
            rows.append(_failed_row(mode, s))
            continue
        calls = ["first_call_median_s", "later_call_median_s", "later_call_max_s", "later_call_cpu_median_s"]
        calls.append("later_call_runq_wait_median_s")
        over = ("later_call_over_memcpy", "first_call_over_memcpy", "first_call_over_memcpy_fresh")
        writes = [R.fmt_num(s["write_median_s"], ".2f"), s["writes_done_in_time"], s["verified"]]
        rows.append([LABELS[mode], *(R.fmt_num(s[k]) for k in calls), *(R.fmt_x(r[k]) for k in over), *writes])
    lines += R.table(CALL_COLUMNS, rows)
    lines.append(
        "  first = first call of a run (median over runs); later = median of the other calls; cpu / runq = the "
        "trainer thread's CPU time / time runnable but waiting for a CPU during a later call (medians); "
        "write = from a call's return until its write was done"
    )

    lines += ["", "== training loop =="]
    rows = []
    for mode, s, r in modes:
        if "loop_s" not in s:
            rows.append(_failed_row(mode, s))
            continue
        blocked = (s.get("blocked_call_s") or 0) + (s.get("blocked_wait_s") or 0)
        rows.append(
            [LABELS[mode], f"{s['loop_s']:.2f}", f"{blocked:.2f}"]
            + [R.fmt_pct(r.get(k)) for k in ("slowdown_excl_blocked", "slowdown_incl_blocked")]
            + [R.fmt_pct(r.get(k)) for k in ("slowdown_excl_blocked_paired_median", "in_flight_slowdown_estimate")]
            + [R.fmt_ms(s["step_all_mean_s"]), R.fmt_ms(s["step_in_flight_mean_s"])]
            + [R.fmt_x(r.get(k)) for k in ("step_in_flight_mean_over_none", "step_in_flight_mean_over_idle_same_run")]
            + [R.fmt_num(s["steps_in_flight"], ".0f")]
        )
    lines += R.table(LOOP_COLUMNS, rows)
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
            f"flight {R.fmt_ms(min(idle))}..{R.fmt_ms(max(idle))} ms over all {len(idle)} runs (the same work)"
        )
    lines.append(
        "  step ms = mean step time without blocked time; in flight = mean of the n steps after which a "
        "background write was still running; vs none / vs idle = that over the no-snapshot run's mean step / "
        "over the same run's other steps"
    )
    lines += ["", "== CPU over the loop (s; medians) =="]
    cpu_keys = ("main_thread_cpu_s", "main_thread_runq_wait_s", "process_cpu_s", "writer_process_cpu_s")
    rows = []
    for mode, s, _ in modes:
        if "loop_s" in s:
            machine = [R.fmt_num(s["system_busy_fraction"], ".0%"), R.fmt_num(s["system_steal_fraction"], ".1%")]
            rows.append([LABELS[mode], *(R.fmt_num(s[k], ".1f") for k in cpu_keys), *machine])
    lines += R.table(CPU_COLUMNS, rows)
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
        f"{R.fmt_x(proc.get('later_call_over_memcpy'))} {R.verdict(t.get('process_blocked_met'))}, thread "
        f"{R.fmt_x(thr.get('later_call_over_memcpy'))} {R.verdict(t.get('thread_blocked_met'))}"
    )
    lines.append(
        f"process executor slowdown (excl. blocked) <= {TARGET_PROCESS_SLOWDOWN:.0%}: "
        f"{R.fmt_pct(proc.get('slowdown_excl_blocked'))} {R.verdict(t.get('process_slowdown_met'))}; thread executor "
        f"{R.fmt_pct(thr.get('slowdown_excl_blocked'))}; process better than thread: "
        f"{t.get('process_better_than_thread')}"
    )
    for mode in ("thread", "process"):
        cold, warm = ratios.get(mode, {}), ratios.get(f"{mode}_warm")
        if warm:
            prepare_s = report["results"][f"{mode}_warm"].get("prepare_async_median_s")
            lines.append(
                f"first call / memcpy after prepare_async <= {TARGET_FIRST_AFTER_PREPARE_OVER_MEMCPY}x ({mode}): "
                f"{R.fmt_x(warm.get('first_call_over_memcpy'))} {R.verdict(t.get(f'{mode}_warm_first_call_met'))} "
                f"(without: {R.fmt_x(cold.get('first_call_over_memcpy'))}; prepare_async itself "
                f"{R.fmt_num(prepare_s, '.2f')} s, before the loop)"
            )
    for mode in ("dcp", "dcp_reuse"):
        d = ratios.get(mode)
        if d:
            lines.append(
                f"{LABELS[mode]}: later calls / memcpy {R.fmt_x(d['later_call_over_memcpy'])}, slowdown excl. blocked "
                f"{R.fmt_pct(d['slowdown_excl_blocked'])} (incl. {R.fmt_pct(d['slowdown_incl_blocked'])})"
            )
    return "\n".join(lines)


# --------------------------------------------------------------------------- #
# Main
# --------------------------------------------------------------------------- #
NOTES = {
    "memcpy": "Tensor.copy_ of every staged tensor (big state + model + Adam state) on one torch thread, "
    "into pre-allocated tensors touched beforehand (prealloc: the ratio's baseline) or into fresh "
    "empty_like tensors (fresh: page faults included); median over all copies of all repeats",
    "first_call": "the first snapshot call of each run; every run is a fresh process, so it pays for "
    "starting the writer (I/O thread or checkpoint daemon) and allocating staging buffers",
    "prepare_async": "the *_warm modes call Snapshot.prepare_async(app_state, executor=...) once before the loop "
    "(its time is prepare_async_median_s, not counted in the loop); their first call then reuses its buffers",
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
}


def parse_args(argv: list[str] | None = None) -> Any:
    ap = cli.BenchParser(__doc__)
    ap.add_out(stem="bench_async")
    ap.add_argument("--dir", default=None, help="scratch directory (default: a new temp dir under /tmp)")
    ap.add_subset("--modes", MODES)
    ap.add_argument(
        "--repeats", type=int, default=5, help="runs per mode; the median is reported (default 5: VMs drift)"
    )
    ap.add_argument("--state-bytes", type=cli.parse_size, default=cli.GiB, help="big state total (default 1GiB)")
    ap.add_argument("--tensor-bytes", type=cli.parse_size, default=64 * cli.MiB, help="big tensor size (default 64MiB)")
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
        "--memory-budget-bytes", type=cli.parse_size, default=None, help="snapshotkit budget (default: its own)"
    )
    ap.add_argument(
        "--writer-nice",
        type=int,
        default=0,
        help="diagnostic: renice the writer's threads (daemon / non-trainer threads) to this value after each "
        "snapshot call (default 0: untouched)",
    )
    ap.add_argument("--seed", type=int, default=0)
    ap.add_quick(
        "smoke-test sizes: 32 MiB state, tiny MLP, 60 steps, 1 repeat",
        state_bytes=32 * cli.MiB,
        tensor_bytes=4 * cli.MiB,
        in_features=64,
        hidden=128,
        layers=2,
        batch=32,
        steps=lambda steps: steps or 60,
        snapshots=2,
        every=0,
        repeats=1,
        warmup_steps=5,
        memcpy_iters=2,
    )
    ap.add_argument("--no-verify", action="store_true", help="skip restoring and checking the last snapshot")
    ap.add_launcher(default=None, timeout=1800.0, unit="run", default_note="subprocess; forkserver with --quick")
    args = ap.parse(argv)
    args.launcher = args.launcher or ("forkserver" if args.quick else "subprocess")
    if args.snapshots < 1:
        ap.error("--snapshots must be >= 1")
    if args.tensor_bytes < 4096 or args.tensor_bytes % 4096 or args.state_bytes % args.tensor_bytes:
        ap.error("--tensor-bytes must be a multiple of 4096 and divide --state-bytes")
    if args.steps < 0 or args.every < 0:
        ap.error("--steps and --every must be >= 0")
    if args.steps and args.every and args.every * args.snapshots > args.steps:
        ap.error("--every * --snapshots must not exceed --steps")
    return args


def run_repeats(
    launcher: launch.Launcher, args: Any, cfg: Record, scratch: Path, available: dict[str, str | None]
) -> tuple[list[Record], dict[str, list[Record]]]:
    """Every repeat: a memcpy run, then a run of every available mode (fresh processes all)."""
    memcpy_runs: list[Record] = []
    runs: dict[str, list[Record]] = {m: [] for m in args.modes}
    for rep in range(args.repeats):
        base = {"cfg": cfg, "verify": not args.no_verify}
        rec = {**launcher.run({**base, "op": "memcpy"}), "repeat": rep}
        memcpy_runs.append(rec)
        R.progress(f"[{rep + 1}/{args.repeats}] memcpy: {R.status(rec, _memcpy_status)}")
        order = args.modes[rep % len(args.modes) :] + args.modes[: rep % len(args.modes)]  # rotate against drift
        for mode in order:
            if available[mode]:
                continue
            workdir = scratch / f"{mode}-{rep}"
            try:
                rec = {**launcher.run({**base, "op": "train", "mode": mode, "workdir": str(workdir)}), "repeat": rep}
            finally:
                shutil.rmtree(workdir, ignore_errors=True)
            runs[mode].append(rec)
            R.progress(f"[{rep + 1}/{args.repeats}] {mode}: {R.status(rec, _train_status)}")
    return memcpy_runs, runs


def _memcpy_status(rec: Record) -> str:
    return f"{rec['prealloc_median_s']:.3f} s"


def _train_status(rec: Record) -> str:
    calls = [round(c["call_s"], 3) for c in rec["calls"]]
    return (
        f"loop {rec['loop_s']:.2f} s, blocked {rec['blocked_call_s']:.2f}+{rec['blocked_wait_s']:.2f} s, calls {calls}"
    )


# The flags a run's fresh process is handed (in the report's config too).
CFG_FLAGS = (
    "state_bytes",
    "tensor_bytes",
    "in_features",
    "hidden",
    "layers",
    "batch",
    "seed",
    "warmup_steps",
    "memcpy_iters",
    "memory_budget_bytes",
    "snapshots",
    "writer_nice",
)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if launch.serve_child(args, run_child):
        return 0
    cfg: Record = {**{k: getattr(args, k) for k in CFG_FLAGS}, "calibrated_step_s": None}
    steps = args.steps
    if not steps:
        cfg["calibrated_step_s"] = calibrate(cfg)
        steps = max(args.snapshots + 1, round(args.run_seconds / cfg["calibrated_step_s"]))
    every = args.every or steps // (args.snapshots + 1)
    if every < 1 or every * args.snapshots > steps:
        print("bench_async.py: error: too few steps for the snapshots asked for", file=sys.stderr)
        return 2
    cfg.update(steps=steps, every=every)
    available = {m: W.unavailable(_MODES[m][1]) for m in args.modes}
    with cli.scratch_dir(args.dir, "snapshotkit-bench-async-") as scratch:
        config = {**cfg, "repeats": args.repeats, "modes": args.modes, "scratch_dir": str(scratch)}
        config.update(snapshotkit_env=R.snapshotkit_env(), quick=args.quick)
        report = R.new_report(
            "bench_async", scratch, config=config, activity={"start": R.other_activity()}, notes=NOTES
        )
        R.progress(
            f"steps {steps}, snapshot every {every} (calibrated step {R.fmt_ms(cfg['calibrated_step_s'])} ms); "
            f"modes {','.join(args.modes)}; {args.repeats} repeat(s); scratch {scratch}"
        )
        launcher = launch.Launcher(
            args.launcher, args.op_timeout, run=run_child, workdir=scratch, script=__file__, preload=PRELOAD
        )
        memcpy_runs, runs = run_repeats(launcher, args, cfg, scratch, available)
    report["memcpy"] = summarize_memcpy(memcpy_runs)
    report["results"] = {
        m: ({"skipped": available[m]} if available[m] else summarize_mode(runs[m])) for m in args.modes
    }
    report["staged_bytes"] = next(
        (s["staged_bytes"] for s in report["results"].values() if s.get("staged_bytes")), report["memcpy"].get("bytes")
    )
    report["ratios"] = compute_ratios(report["results"], report["memcpy"])
    report["activity"]["end"] = R.other_activity()
    R.write_report(report, args.out, render(report))
    failed = [m for m in args.modes if not available[m] and report["results"][m].get("n_ok", 0) < args.repeats]
    return 1 if failed or not report["memcpy"].get("n_ok") else 0


if __name__ == "__main__":
    sys.exit(main())
