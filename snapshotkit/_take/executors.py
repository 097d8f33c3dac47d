"""The background writers of ``async_take``, by ``executor=`` name: made on first use, reused, stopped at exit.

Above both writer modules (:mod:`.writers` for the thread writer, :mod:`.process_writer` for the
checkpoint daemon), so neither imports the other's users: the engine and the warm-up
(:mod:`.warm`) ask here for the writer of an executor name. To add an executor, name it in
:data:`EXECUTORS` and make its writer in :func:`background_writer`.
"""

from __future__ import annotations

import threading

from snapshotkit._take.process_writer import ProcessWriter
from snapshotkit._take.writers import ThreadWriter, Writer
from snapshotkit.errors import ConfigError

#: The ``executor=`` values of ``async_take``.
EXECUTORS = ("thread", "process")

_writers: dict[tuple[str, int], Writer] = {}
_writers_lock = threading.Lock()


def background_writer(executor: str, niceness: int) -> Writer:
    """The writer for ``async_take(executor=...)`` at ``niceness``: made on first use, then reused
    (a dead checkpoint daemon is replaced)."""
    if executor not in EXECUTORS:
        raise ConfigError(f"executor must be one of {EXECUTORS}, got {executor!r}")
    key = (executor, niceness)
    with _writers_lock:
        writer = _writers.get(key)
        if isinstance(writer, ProcessWriter) and not writer.alive:
            writer.shutdown()
            writer = None
        if writer is None:
            writer = _writers[key] = ProcessWriter(niceness) if executor == "process" else ThreadWriter(niceness)
        return writer


def shutdown_writers() -> None:
    """Stop every checkpoint daemon (at interpreter exit, after pending takes finished)."""
    with _writers_lock:
        daemons = [_writers.pop(key) for key in list(_writers) if key[0] == "process"]
    for writer in daemons:
        assert isinstance(writer, ProcessWriter)
        writer.shutdown()


def checkpoint_daemon_pid() -> int | None:
    """The pid of a running checkpoint daemon, if there is one (for tests and monitoring)."""
    for writer in list(_writers.values()):
        if isinstance(writer, ProcessWriter) and writer.alive:
            return writer.pid
    return None
