"""Fresh processes for measured runs: one at a time, or a group (the ranks of one process group)."""

from __future__ import annotations

import argparse
import atexit
import json
import os
import socket
import subprocess
import sys
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from . import Record

RunFn = Callable[[Record], Record]

_POLL_S = 0.01


def describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


def error_record(exc: BaseException, prefix: str = "") -> Record:
    """A failed run's record; call it in the ``except`` block, while the traceback is current."""
    return {"ok": False, "error": prefix + describe(exc), "traceback": traceback.format_exc()[-3000:]}


def child_main(run: RunFn, spec_json: str, result_file: str) -> None:
    """The child's side: ``run(spec)`` and its record (or the failure) as JSON in ``result_file``."""
    try:
        record = run(json.loads(spec_json))
    except BaseException as exc:
        record = error_record(exc)
    Path(result_file).write_text(json.dumps(record))


def serve_child(args: argparse.Namespace, run: RunFn) -> bool:
    """If this process is a ``subprocess`` child (``--child``), do its run and say so."""
    if args.child is None:
        return False
    child_main(run, args.child, args.result_file)
    return True


def _forked_main(run: RunFn, spec_json: str, result_file: str) -> None:
    # A forked child leaves through os._exit and skips the interpreter's exit hooks; snapshotkit's
    # stops the checkpoint daemon and frees its shared memory, so run them as a re-executed child would.
    try:
        child_main(run, spec_json, result_file)
    finally:
        atexit._run_exitfuncs()


def _read_record(result_file: str) -> Record | None:
    try:
        record: Record = json.loads(Path(result_file).read_text())
    except (OSError, ValueError):
        return None
    return record


class _Child:
    """One started child, whichever way it was started."""

    def __init__(self, handle: Any, result_file: str, log_file: str | None) -> None:
        self.handle, self.result_file, self.log_file = handle, result_file, log_file

    def exitcode(self) -> int | None:
        code: int | None = self.handle.poll() if isinstance(self.handle, subprocess.Popen) else self.handle.exitcode
        return code

    def stop(self) -> None:
        self.handle.kill()
        if isinstance(self.handle, subprocess.Popen):
            self.handle.wait()
        else:
            self.handle.join()

    def log(self) -> str:
        if self.log_file is None:
            return ""
        try:
            return Path(self.log_file).read_text(errors="replace")
        finally:
            Path(self.log_file).unlink(missing_ok=True)

    def succeeded(self) -> bool:
        record = _read_record(self.result_file)
        return self.exitcode() == 0 and record is not None and record.get("ok") is not False

    def record(self, stopped: str | None) -> Record:
        log = self.log()
        if stopped is not None:
            return {"ok": False, "error": stopped}
        record = _read_record(self.result_file)
        if record is None:
            return {
                "ok": False,
                "error": f"child exited with code {self.exitcode()} without a result",
                "stderr_tail": log[-3000:],
            }
        if log.strip():
            record["stderr_tail"] = log[-2000:]
        return record


class Launcher:
    """Runs measurements in fresh processes, so no run inherits another's allocations, threads or
    warm caches. ``subprocess`` re-executes ``script`` with ``--child <spec> --result-file <file>``
    (the most isolated; the script hands those to :func:`serve_child`); ``forkserver`` forks from a
    server that already imported ``preload`` (much faster to start). ``run(spec)`` returns the
    child's record; a run that times out or dies without one gets ``{"ok": False, "error": ...}``.
    Result files go to ``workdir``."""

    def __init__(
        self,
        kind: str,
        timeout: float,
        *,
        run: RunFn,
        workdir: str | os.PathLike[str],
        script: str | os.PathLike[str] | None = None,
        preload: Sequence[str] = (),
    ) -> None:
        if kind == "subprocess" and script is None:
            raise ValueError("the subprocess launcher re-executes a script: pass script=")
        self.kind, self.timeout = kind, timeout
        self.script = str(Path(script).resolve()) if script is not None else ""
        self._run, self.workdir = run, Path(workdir)
        self._ctx: Any = None
        if kind == "forkserver":
            import multiprocessing as mp

            self._ctx = mp.get_context("forkserver")
            self._ctx.set_forkserver_preload(list(preload))

    def run(self, spec: Record) -> Record:
        return self.run_group([spec])[0]

    def run_ranks(self, spec: Record, world: int) -> list[Record]:
        """``spec`` on ``world`` ranks at once, each told its ``rank``, the ``world`` size and the
        ``port`` of rank 0's rendezvous (see :func:`process_group`)."""
        port = free_port()
        return self.run_group([{**spec, "rank": r, "world": world, "port": port} for r in range(world)])

    def run_group(self, specs: Sequence[Record]) -> list[Record]:
        """All ``specs`` at once, one record each. Once a member fails the others are killed: as
        ranks of one process group they would wait for it in a collective until their own timeout."""
        result_files = [str(self.workdir / f"result{i}.json") for i in range(len(specs))]
        for f in result_files:
            Path(f).unlink(missing_ok=True)
        children = [self._start(json.dumps(s), f) for s, f in zip(specs, result_files, strict=True)]
        stopped: dict[int, str] = {}
        failed = False
        deadline = time.monotonic() + self.timeout
        running = set(range(len(children)))
        while running:
            for i in sorted(running):
                if children[i].exitcode() is not None:
                    running.discard(i)
                    failed = failed or not children[i].succeeded()
            if running and (failed or time.monotonic() > deadline):
                why = "stopped: another process of the group failed" if failed else f"timed out after {self.timeout} s"
                for i in running:
                    children[i].stop()
                    stopped[i] = why
                break
            time.sleep(_POLL_S)
        return [c.record(stopped.get(i)) for i, c in enumerate(children)]

    def _start(self, payload: str, result_file: str) -> _Child:
        if self._ctx is None:
            log_file = result_file + ".stderr"
            with open(log_file, "w") as log:
                cmd = [sys.executable, self.script, "--child", payload, "--result-file", result_file]
                return _Child(subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=log), result_file, log_file)
        proc = self._ctx.Process(target=_forked_main, args=(self._run, payload, result_file))
        proc.start()
        return _Child(proc, result_file, None)


def free_port() -> int:
    """A TCP port on loopback that is free now (a rank group's rendezvous)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextmanager
def process_group(spec: Record, backend: str = "gloo", timeout_s: float = 600.0) -> Iterator[None]:
    """The default process group of a rank started by :meth:`Launcher.run_ranks`, for the block."""
    import datetime

    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(spec["port"]))
    timeout = datetime.timedelta(seconds=timeout_s)
    dist.init_process_group(backend, rank=spec["rank"], world_size=spec["world"], timeout=timeout)
    try:
        yield
    finally:
        dist.destroy_process_group()
