"""Opt-in progress bars: bytes done of the total and the rate, for operations that take a while.

``Snapshot.take(progress=True)`` (and ``async_take``, ``restore``, the converters, and the
command line on a terminal) counts its bytes into a :class:`ByteProgress`. The bar is drawn
with rich on stderr, and only once the operation has run :data:`DELAY_S`: a take of a few
megabytes prints nothing at all. When the operation ends, the bar is drawn once more in its
final state (bytes done, rate, time) and left on the screen as a record.

Counting is thread-safe and cheap: the engines call :meth:`ByteProgress.advance` from the I/O
loop, writer threads and the caller's thread. A disabled one (``enabled=False``) does nothing.
"""

from __future__ import annotations

import threading
import time
from typing import Final

from rich.console import Console
from rich.progress import BarColumn, DownloadColumn, Progress, ProgressColumn, Task, TaskID, TextColumn
from rich.table import Column
from rich.text import Text

from snapshotkit._events import format_bytes
from snapshotkit.errors import InvalidArgumentError

__all__ = ["DELAY_S", "ByteProgress", "check_progress"]

#: Seconds an operation runs before its bar appears.
DELAY_S: Final = 2.0
# The bar (16), the bytes ("1023.9/1024.0 MiB") and the rate and time ("1023.99 MiB/s 999.9 s"), spaced.
_FIGURES_CHARS = 60
_MIN_DESCRIPTION_CHARS = 20


def check_progress(progress: object, caller: str) -> bool:
    """``progress`` if it is a bool; raise before anything is written otherwise.

    Raises:
        InvalidArgumentError: (a ``TypeError``) ``progress`` is not ``True`` or ``False``.
    """
    if not isinstance(progress, bool):
        raise InvalidArgumentError(
            f"{caller}: progress must be True (show a progress bar on stderr for operations longer than "
            f"{DELAY_S:g} s) or False, got {type(progress).__name__} {progress!r}"
        )
    return progress


def _console() -> Console:
    """Where bars are drawn: stderr, so stdout stays the program's own."""
    return Console(stderr=True)


def _shortened(description: str, width: int) -> str:
    """``description`` ("taking /a/long/path") with its path cut in the middle (its end names the
    snapshot), to leave the bar and the figures room on a terminal ``width`` columns wide."""
    limit = max(_MIN_DESCRIPTION_CHARS, width - _FIGURES_CHARS)
    if len(description) <= limit:
        return description
    verb, _, path = description.rpartition(" ")
    room = max(limit - len(verb) - 1, _MIN_DESCRIPTION_CHARS // 2)
    head = room // 3
    return f"{verb} {path[:head]}…{path[-(room - head - 1) :]}"


class _AverageRate(ProgressColumn):
    """Bytes done over the time since the operation started (not since the bar appeared), and
    that time: the figures the INFO log line gives at the end."""

    def render(self, task: Task) -> Text:
        ended_s = task.fields.get("ended_s") or time.perf_counter()
        seconds = ended_s - task.fields["started_s"]
        rate = f"{format_bytes(int(task.completed / seconds))}/s" if seconds > 0 and task.completed else "?/s"
        return Text(f"{rate} {seconds:.1f} s", style="progress.data.speed")


class ByteProgress:
    """The bytes an operation moved so far, drawn as a bar once it has run ``delay_s``.

    Args:
        description: what is happening, shown left of the bar (``"taking /ckpt/step_100"``).
        enabled: False makes every method a no-op.
        total_bytes: the bytes the operation will move, if known (see :meth:`set_total`).
        delay_s: seconds before the bar appears (default :data:`DELAY_S`).
        console: where to draw (default: a rich console on stderr).
    """

    def __init__(
        self,
        description: str,
        *,
        enabled: bool,
        total_bytes: int | None = None,
        delay_s: float | None = None,
        console: Console | None = None,
    ) -> None:
        self.enabled = enabled
        self.done_bytes = 0
        self.total_bytes = total_bytes
        self._description = description
        self._lock = threading.Lock()
        self._bar: Progress | None = None
        self._task: TaskID | None = None
        self._closed = False
        self._timer: threading.Timer | None = None
        self._started_s = time.perf_counter()
        if not enabled:
            return
        self._console = console if console is not None else _console()
        delay = DELAY_S if delay_s is None else delay_s
        if delay <= 0:
            self._show()
        else:
            self._timer = threading.Timer(delay, self._show)
            self._timer.daemon = True  # never keeps the interpreter alive
            self._timer.start()

    def set_total(self, total_bytes: int | None) -> None:
        """The bytes the operation will move (None: unknown; the bar then shows bytes done only)."""
        if not self.enabled:
            return
        with self._lock:
            self.total_bytes = total_bytes
            if self._bar is not None and self._task is not None:
                self._bar.update(self._task, total=total_bytes)

    def advance(self, nbytes: int) -> None:
        """Count ``nbytes`` more bytes done."""
        if not self.enabled:
            return
        with self._lock:
            self.done_bytes += nbytes
            if self._bar is not None and self._task is not None:
                self._bar.update(self._task, completed=self.done_bytes)

    def __call__(self, done_bytes: int, total_bytes: int) -> None:
        """The callback shape of ``verify_snapshot(progress=...)``: bytes done so far, and the total."""
        if not self.enabled:
            return
        with self._lock:
            self.done_bytes, self.total_bytes = done_bytes, total_bytes
            if self._bar is not None and self._task is not None:
                self._bar.update(self._task, completed=done_bytes, total=total_bytes)

    def close(self) -> None:
        """End the bar: draw its final state if it is shown, or make sure it never appears."""
        if not self.enabled:
            return
        if self._timer is not None:
            self._timer.cancel()
        with self._lock:
            self._closed = True
            bar, task = self._bar, self._task
            if bar is None or task is None:
                return
            # A finished operation whose total was unknown, or smaller than counted, shows what it did.
            total = self.done_bytes if self.total_bytes is None else max(self.total_bytes, self.done_bytes)
            bar.update(task, completed=self.done_bytes, total=total, ended_s=time.perf_counter())
            bar.stop()

    def __enter__(self) -> ByteProgress:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _show(self) -> None:
        with self._lock:
            if self._closed or self._bar is not None:
                return
            bar = Progress(
                TextColumn("{task.description}", table_column=Column(no_wrap=True)),
                BarColumn(bar_width=16),
                DownloadColumn(binary_units=True, table_column=Column(no_wrap=True)),
                _AverageRate(table_column=Column(no_wrap=True)),
                console=self._console,
                transient=False,
                # A bar may run on a background thread (async_take): it must not swap the
                # process's sys.stdout and sys.stderr under the training loop.
                redirect_stdout=False,
                redirect_stderr=False,
            )
            description = _shortened(self._description, self._console.width)
            self._task = bar.add_task(
                description, total=self.total_bytes, completed=self.done_bytes, started_s=self._started_s
            )
            bar.start()
            self._bar = bar
