"""Run a function on N real ``torch.distributed`` ranks (gloo, CPU) from a test.

Ranks are forked from a forkserver that imported torch and snapshotkit once, so a 4-rank run
starts in a fraction of a second and never inherits the test process's threads (a forked copy
of a live event-loop or fsspec thread can deadlock). Each rank initializes a gloo process group,
runs ``target(rank, world_size, *args)``, and pickles its return value for the test to check.
An exception on a rank fails the test with that rank's traceback; a run that outlives
``timeout`` is killed and fails the test (a hang is a bug, never a wait).
"""

from __future__ import annotations

import datetime
import multiprocessing
import os
import pickle
import socket
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch.multiprocessing as mp

multiprocessing.set_forkserver_preload(["torch", "torch.distributed", "snapshotkit"])


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _entry(
    rank: int,
    world_size: int,
    port: int,
    out_dir: str,
    env: dict[str, str],
    target: Callable[..., Any],
    args: tuple[Any, ...],
    backend: str,
) -> None:
    import torch
    import torch.distributed as dist

    os.environ.update(env)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world_size))
    torch.set_num_threads(1)
    if backend == "nccl":
        torch.cuda.set_device(rank)  # one GPU per rank
    dist.init_process_group(backend, rank=rank, world_size=world_size, timeout=datetime.timedelta(seconds=60))
    try:
        result = target(rank, world_size, *args)
    finally:
        dist.destroy_process_group()
    with open(Path(out_dir, f"{rank}.pkl"), "wb") as f:
        pickle.dump(result, f)


def run_ranks(
    world_size: int,
    target: Callable[..., Any],
    *args: Any,
    timeout: float = 120.0,
    env: dict[str, str] | None = None,
    backend: str = "gloo",
    missing_ok: bool = False,
) -> list[Any]:
    """``[target(rank, world_size, *args) for each rank]``, each run in its own process
    (``backend="nccl"``: rank ``r`` on GPU ``r``; ``missing_ok``: None for a rank that exited
    without a result, as a rank killed on purpose does, while the others run to their end)."""
    with tempfile.TemporaryDirectory(prefix="snapshotkit-ranks-") as out_dir:
        context = mp.start_processes(
            _entry,
            args=(world_size, _free_port(), out_dir, dict(env or {}), target, args, backend),
            nprocs=world_size,
            join=False,
            start_method="forkserver",
        )
        deadline = time.monotonic() + timeout
        try:
            if missing_ok:  # a rank that dies (even by SIGKILL) must not take the others down with it
                for process in context.processes:
                    process.join(timeout=max(0.0, deadline - time.monotonic()))
                if any(process.is_alive() for process in context.processes):
                    raise TimeoutError(f"{world_size} ranks running {target.__name__} did not finish in {timeout} s")
            while not missing_ok and not context.join(timeout=max(0.0, deadline - time.monotonic())):
                if time.monotonic() >= deadline:
                    raise TimeoutError(f"{world_size} ranks running {target.__name__} did not finish in {timeout} s")
        finally:
            for process in context.processes:
                if process.is_alive():
                    process.kill()
                    process.join()
        if missing_ok:  # a rank may die, but one that raised fails the test with its traceback
            for rank, process in enumerate(context.processes):
                if process.exitcode and process.exitcode > 0 and os.path.getsize(context.error_files[rank]):
                    with open(context.error_files[rank], "rb") as f:
                        raise AssertionError(f"rank {rank} raised:\n{pickle.load(f)}")
        results = []
        for rank in range(world_size):
            if missing_ok and not Path(out_dir, f"{rank}.pkl").exists():
                results.append(None)
                continue
            with open(Path(out_dir, f"{rank}.pkl"), "rb") as f:
                results.append(pickle.load(f))
        return results
