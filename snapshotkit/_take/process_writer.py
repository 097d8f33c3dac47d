"""The writer of ``async_take(executor="process")``: a checkpoint daemon fed through shared memory.

Staged objects are copied into pooled shared-memory segments (reused between snapshots; pinned
once they stage a GPU piece, whose copies then run on a side stream as the thread writer's do; no
name in ``/dev/shm``: each segment's file descriptor crosses the socket once); only small control
messages cross the socket to the daemon (:mod:`snapshotkit._take.daemon`), which checksums and
writes them with the same storage plugins, so checksumming and storage calls never hold the
trainer's GIL. The daemon is started on first use, reused, and replaced when it died (its pending
writes fail with :class:`~snapshotkit.errors.CheckpointDaemonError`).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import ctypes
import multiprocessing.connection
import os
import pickle
import socket
import subprocess
import sys
import threading
from collections.abc import Mapping, Sequence
from multiprocessing import reduction, shared_memory
from typing import Any

from snapshotkit._format.pieces import Piece
from snapshotkit._plan.layout import DataObjectPlan
from snapshotkit._plan.leaves import Payload
from snapshotkit._runtime.staging import BufferPool, staging_budget
from snapshotkit._take.gpu_copy import GpuCopies, cuda_devices
from snapshotkit._take.stage import StagedObject, stage_into
from snapshotkit._take.writers import Target, WriteJob, bucket_bytes
from snapshotkit.errors import CheckpointDaemonError, StorageError

#: Bytes written at a time when faulting in a new segment's pages.
_TOUCH_BYTES = 1 << 20

# Lowers the daemon's priority before anything is imported: threads that imports start (torch's)
# inherit the niceness of the thread that creates them.
_DAEMON_BOOTSTRAP = """\
import os, sys
sys.path[:] = [p for p in sys.path if p]  # not the working directory first (-c puts it there): the trainer's path
if int(sys.argv[2]) > 0:
    try:
        os.setpriority(os.PRIO_PROCESS, 0, max(int(sys.argv[2]), os.getpriority(os.PRIO_PROCESS, 0)))
    except OSError:
        pass
from snapshotkit._take.daemon import main
main()
"""


def _new_segment(size: int) -> shared_memory.SharedMemory:
    """A shared-memory segment of ``size`` bytes whose name is gone already: this process and the daemon
    (sent the file descriptor) map it, and the memory goes with the last of them, even when a kill -9
    takes every process at once (a name in ``/dev/shm`` would outlive them all, and fill it up)."""
    segment = shared_memory.SharedMemory(create=True, size=size)
    segment.unlink()  # also unregisters it from the resource tracker: nothing is left to remove at exit
    return segment


def _address(segment: shared_memory.SharedMemory) -> int:
    """Where ``segment`` is mapped in this process."""
    assert segment.buf is not None
    return ctypes.addressof(ctypes.c_char.from_buffer(segment.buf))


class _DaemonJob:
    """A write the daemon was asked to do; it cannot be called back once sent."""

    def __init__(self) -> None:
        self.future: concurrent.futures.Future[tuple[Piece, ...]] = concurrent.futures.Future()

    def cancel(self) -> None:
        return None


class ProcessWriter:
    """Sends staged objects to the checkpoint daemon through pooled shared-memory segments."""

    name = "process"
    defers_writes = True

    def __init__(self, niceness: int) -> None:
        #: The registrations the daemon was sent (or skipped, when not picklable), by scheme.
        self._sent_registrations: dict[str, Any] = {}
        self._registry_lock = threading.Lock()
        registrations = self._new_registrations()
        # A fresh interpreter (not multiprocessing's spawn, which re-imports the caller's
        # __main__ and fails in scripts without a main guard), connected by a socket pair.
        parent, child = socket.socketpair()
        # the trainer's own import path, its working directory where it has one (as "" in sys.path)
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p or os.getcwd() for p in sys.path)}
        self.process = subprocess.Popen(
            [sys.executable, "-c", _DAEMON_BOOTSTRAP, str(child.fileno()), str(niceness)],
            pass_fds=(child.fileno(),),
            env=env,
            stdin=subprocess.DEVNULL,
        )
        child.close()
        self._connection = multiprocessing.connection.Connection(parent.detach())
        self._connection.send(registrations)
        self._jobs: dict[int, _DaemonJob] = {}
        self._next_job = 0
        self._lock = threading.Lock()
        self._send_lock = threading.Lock()  # writes are sent from staging, evictions from any thread
        self._sent_segments: set[str] = set()  # the segments whose descriptor the daemon has, by name
        self._segments = BufferPool(staging_budget(), self._discard_segment)
        self._gpu = GpuCopies()
        self.dead: str | None = None
        self._reader = threading.Thread(target=self._read_replies, name="snapshotkit-daemon-replies", daemon=True)
        self._reader.start()

    @property
    def pool(self) -> BufferPool:
        return self._segments

    @property
    def pid(self) -> int:
        return int(self.process.pid)

    @property
    def alive(self) -> bool:
        return self.dead is None and self.process.poll() is None

    def _read_replies(self) -> None:
        while True:
            try:
                message = self._connection.recv()
            except (EOFError, OSError):
                self._fail_all(f"the checkpoint daemon (pid {self.process.pid}) exited")
                return
            with self._lock:
                job = self._jobs.pop(message[1], None)
            if job is None:
                continue
            if message[0] == "done":
                job.future.set_result(message[2])
            else:
                job.future.set_exception(message[2] if message[2] is not None else StorageError(message[3]))

    def _fail_all(self, reason: str) -> None:
        try:
            code: int | None = self.process.wait(1)
        except subprocess.TimeoutExpired:
            code = None
        self.dead = f"{reason} (exit code {code})"
        with self._lock:
            jobs, self._jobs = self._jobs, {}
        for job in jobs.values():
            job.future.set_exception(
                CheckpointDaemonError(
                    f"{self.dead} before writing every data object; the snapshot was not committed. "
                    "The next async_take starts a new daemon"
                )
            )

    def staging_cost(self, plan: DataObjectPlan, payloads: Sequence[Payload]) -> int:
        return bucket_bytes(plan.nbytes)

    def stage(self, plan: DataObjectPlan, payloads: Sequence[Payload]) -> StagedObject:
        size = bucket_bytes(plan.nbytes)
        segment = self._segments.get(size)
        if segment is None:
            segment = _new_segment(size)
            self._segments.add(segment)
        assert segment.buf is not None
        try:
            if cuda_devices(plan, payloads):
                self._gpu.pin(_address(segment), size)  # so GPU pieces copy asynchronously
            # Every copy has finished when stage_into returns: the daemon reads finished bytes.
            return stage_into(plan, payloads, segment.buf[: plan.nbytes], segment, self._gpu)
        except BaseException:
            self._segments.put(size, segment)
            raise

    def give_back(self, staged: StagedObject) -> None:
        for view in (*staged.pieces, *staged.buffers):
            view.release()  # no exported views may outlive the segment's close at exit
        self._segments.put(bucket_bytes(staged.plan.nbytes), staged.handle)

    def _discard_segment(self, segment: shared_memory.SharedMemory) -> None:
        """Free a segment the pool does not keep: the daemon unmaps it, this process unmaps it (its
        name went when it was made: the memory goes with the last mapping)."""
        with contextlib.suppress(OSError, ValueError), self._send_lock:
            if segment.name in self._sent_segments:
                self._sent_segments.discard(segment.name)
                self._connection.send(("release", segment.name))
        self._close_segment(segment)

    def preallocate(self, sizes: Mapping[int, int], *, pinned: bool = False) -> int:
        """Pool free segments of ``sizes`` (bucket size -> count), pages faulted in (and pinned,
        with ``pinned``); the bytes made."""

        def make(size: int) -> shared_memory.SharedMemory:
            segment = _new_segment(size)
            assert segment.buf is not None
            zeros = bytes(min(size, _TOUCH_BYTES))
            for start in range(0, size, len(zeros)):  # writing every page faults it in now
                end = min(size, start + len(zeros))
                segment.buf[start:end] = zeros[: end - start]
            if pinned:
                self._gpu.pin(_address(segment), size)
            return segment

        return self._segments.preallocate(sizes, make)

    def io_slots(self, count: int) -> Any:
        return count  # the daemon holds one semaphore per count

    def submit(self, target: Target, staged: StagedObject, io_slots: Any) -> WriteJob:
        job = _DaemonJob()
        with self._lock:
            number = self._next_job
            self._next_job += 1
            self._jobs[number] = job
        slots = [(slot.offset, slot.nbytes) for slot in staged.plan.slots]
        message = (
            "write",
            number,
            target.path,
            dict(target.storage_options),
            staged.plan.location,
            staged.handle.name,
            staged.plan.nbytes,
            slots,
            io_slots,
            target.reuse,
        )
        try:
            if self.dead is not None:
                raise CheckpointDaemonError(self.dead)
            with self._send_lock:
                registrations = self._new_registrations()
                if registrations:  # registered since the daemon started (or last heard): before the write
                    self._connection.send(("register", registrations))
                if staged.handle.name not in self._sent_segments:  # its first write: the descriptor first
                    self._connection.send(("segment", staged.handle.name))
                    # SharedMemory keeps its descriptor open until close()
                    reduction.send_handle(self._connection, staged.handle._fd, self.pid)
                    self._sent_segments.add(staged.handle.name)
                self._connection.send(message)
        except (OSError, ValueError, CheckpointDaemonError) as exc:
            with self._lock:
                self._jobs.pop(number, None)
            job.future.set_exception(
                CheckpointDaemonError(f"could not reach the checkpoint daemon ({exc}); the snapshot was not committed")
            )
        return job

    def _new_registrations(self) -> dict[str, Any]:
        """The storage plugins registered in this process that the daemon has not been sent yet
        (lambdas and closures cannot reach it, and are skipped)."""
        from snapshotkit.storage._registry import _registered

        new = {}
        with self._registry_lock:
            for scheme, factory in list(_registered.items()):
                if self._sent_registrations.get(scheme) is factory:
                    continue
                self._sent_registrations[scheme] = factory
                try:
                    pickle.dumps(factory)
                except Exception:  # noqa: S112 - cannot reach the daemon
                    continue
                new[scheme] = factory
        return new

    def release(self, target: Target) -> None:
        return None  # the daemon keeps its plugins for the next snapshot

    def shutdown(self) -> None:
        with contextlib.suppress(OSError, ValueError), self._send_lock:
            self._connection.send(("stop",))
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(5)
        for segment in self._segments.close():  # uncharged from the staging budget
            self._close_segment(segment)

    def _close_segment(self, segment: shared_memory.SharedMemory) -> None:
        """Unpin (if pinned) and unmap a segment no staged object uses (again: no harm); its name is gone."""
        if segment.buf is not None and self._gpu.pinned_bytes:
            self._gpu.unpin(_address(segment))  # before the mapping goes away
        with contextlib.suppress(BufferError):  # a view still exported: the mapping goes with it
            segment.close()
