"""kill -9 during takes, then open and restore: a snapshot is absent or exactly right, never wrong.

Each trial starts a fresh process group that takes a deterministic state (sized tensors, plus a
step counter and a string that encode the trial) with ``Snapshot.take`` or ``async_take`` (thread
or process executor) into a new path, and kills the whole group with SIGKILL after a random delay
(uniform over ``--delay-factor`` (default 2) times what an uninterrupted take of the same mode
needs from the moment its state is built until it returns, measured first, so kills land in
every phase: collect, write, commit, and after). The path is then opened and restored into fresh
objects, and each trial is counted as:

* ``committed``: the restore succeeded and every value is bit for bit what was taken;
* ``not-committed``: the path is not a snapshot (``SnapshotNotFoundError``, which
  ``IncompleteSnapshotError`` is) -- the take did not commit, and nothing claims it did;
* ``wrong``: anything else (different values, another exception). The script exits 1 if any
  trial is wrong.

Run ``python benchmarks/stress_kill.py --trials 100``; results go to JSON and text.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # _harness, also when imported by a test

import contextlib

from _harness import Record, cli
from _harness import report as R
from _harness import workloads as W

MODES = ("take", "async_thread", "async_process")
OUTCOMES = ("committed", "not-committed", "wrong")


def _specs(state_bytes: int) -> list[W.TensorSpec]:
    return W.sized_specs(state_bytes, max(4096, state_bytes // 8), seed=7, dtypes=("float32", "bfloat16"))


def _app_state(specs: list[W.TensorSpec], trial: int) -> dict[str, Any]:
    from snapshotkit import StateDict

    return {"model": StateDict(W.materialize(specs)), "progress": StateDict(step=trial, tag=f"trial-{trial}")}


def child(mode: str, path: str, trial: int, state_bytes: int) -> None:
    """The process that gets killed: build the state, say so, take it."""
    from snapshotkit import Snapshot

    app_state = _app_state(_specs(state_bytes), trial)
    print("ready", flush=True)
    if mode == "take":
        Snapshot.take(path, app_state)
    else:
        executor = mode.removeprefix("async_")
        Snapshot.async_take(path, app_state, executor=executor).wait()
    print("done", flush=True)


def _start(mode: str, path: Path, trial: int, state_bytes: int) -> tuple[subprocess.Popen[str], float]:
    proc = subprocess.Popen(
        [sys.executable, __file__, "--child", mode, str(path), str(trial), str(state_bytes)],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own process group: the kill takes the checkpoint daemon too
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if line.strip() != "ready":
        proc.kill()
        raise RuntimeError(f"the {mode} child did not start: {line!r}")
    return proc, time.monotonic()


def check(path: Path, trial: int, specs: list[W.TensorSpec]) -> tuple[str, str]:
    """Open and restore ``path``: the trial's outcome and a note."""
    from snapshotkit import Snapshot, StateDict
    from snapshotkit.errors import SnapshotNotFoundError

    model, progress = StateDict(), StateDict()
    try:
        Snapshot(str(path)).restore({"model": model, "progress": progress})
    except SnapshotNotFoundError as exc:
        return "not-committed", type(exc).__name__
    except Exception as exc:  # counted, not raised: the point is to see every outcome
        return "wrong", f"{type(exc).__name__}: {exc}"
    problems = W.verify(model, specs)
    if progress.get("step") != trial or progress.get("tag") != f"trial-{trial}":
        problems.append(f"progress is {dict(progress)}")
    return ("wrong", "; ".join(problems)) if problems else ("committed", "")


def run_mode(
    mode: str, scratch: Path, trials: int, state_bytes: int, rng: random.Random, delay_factor: float
) -> Record:
    specs = _specs(state_bytes)
    proc, started = _start(mode, scratch / f"{mode}-calibrate", -1, state_bytes)
    assert proc.stdout is not None
    done = proc.stdout.readline()  # "done" once the take returned (or wait() did), before interpreter exit
    full_s = time.monotonic() - started
    proc.wait(timeout=600)
    if done.strip() != "done":
        raise RuntimeError(f"the uninterrupted {mode} did not finish: {done!r}")
    counts = dict.fromkeys(OUTCOMES, 0)
    notes: dict[str, int] = {}
    wrong: list[str] = []
    for trial in range(trials):
        path = scratch / f"{mode}-{trial}"
        delay_s = rng.uniform(0.0, full_s * delay_factor)
        proc, started = _start(mode, path, trial, state_bytes)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=delay_s)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        outcome, note = check(path, trial, specs)
        counts[outcome] += 1
        notes[f"{outcome}: {note}" if note else outcome] = notes.get(f"{outcome}: {note}" if note else outcome, 0) + 1
        if outcome == "wrong":
            wrong.append(f"trial {trial} (killed after {delay_s:.3f} s): {note}")
        R.progress(f"[{mode} {trial + 1}/{trials}] killed after {delay_s:.3f} s: {outcome} {note}")
    return {"uninterrupted_take_s": full_s, "counts": counts, "notes": notes, "wrong": wrong}


def render(result: Record) -> str:
    lines = [R.machine_line(result["machine"]), ""]
    cfg = result["config"]
    lines.append(
        f"state {R.fmt_bytes(cfg['state_bytes'])}; {cfg['trials']} trials per mode; seed {cfg['seed']}; "
        f"kills uniform over [0, {cfg['delay_factor']} x take s]"
    )
    lines.append(f"{'mode':<15}{'take s':>8}{'committed':>11}{'not-committed':>15}{'wrong':>7}")
    for mode, rec in result["modes"].items():
        c = rec["counts"]
        lines.append(
            f"{mode:<15}{rec['uninterrupted_take_s']:>8.2f}{c['committed']:>11}{c['not-committed']:>15}{c['wrong']:>7}"
        )
        lines.extend(f"  WRONG {line}" for line in rec["wrong"])
    total_wrong = sum(rec["counts"]["wrong"] for rec in result["modes"].values())
    lines.append("")
    lines.append(f"wrong data or unexpected errors: {total_wrong}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args_list = sys.argv[1:] if argv is None else argv
    if args_list[:1] == ["--child"]:
        mode, path, trial, state_bytes = args_list[1:5]
        child(mode, path, int(trial), int(state_bytes))
        return 0
    parser = cli.BenchParser(__doc__ or "")
    parser.add_out(stem="stress_kill")
    parser.add_subset("--modes", MODES)
    parser.add_argument("--trials", type=int, default=30, help="kills per mode (default: %(default)s)")
    parser.add_argument("--state-bytes", type=cli.parse_size, default=64 * cli.MiB, help="state size (64MiB)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the kill delays")
    parser.add_argument(
        "--delay-factor",
        type=float,
        default=2.0,
        help="kill delays are uniform over [0, factor x an uninterrupted take's time] (default: %(default)s)",
    )
    parser.add_argument("--dir", default=None, help="scratch directory (default: a new temp dir under /tmp)")
    parser.add_quick("2 trials per mode of a 1 MiB state (smoke test)", trials=2, state_bytes=cli.MiB)
    args = parser.parse(args_list)
    rng = random.Random(args.seed)
    with cli.scratch_dir(args.dir, "snapshotkit-kill-") as scratch:
        result = R.new_report(
            "stress_kill",
            scratch,
            config={
                "trials": args.trials,
                "state_bytes": args.state_bytes,
                "seed": args.seed,
                "delay_factor": args.delay_factor,
            },
        )
        result["modes"] = {
            mode: run_mode(mode, scratch, args.trials, args.state_bytes, rng, args.delay_factor) for mode in args.modes
        }
    R.write_report(result, args.out, render(result))
    return 1 if any(rec["counts"]["wrong"] for rec in result["modes"].values()) else 0


if __name__ == "__main__":
    sys.exit(main())
