"""What every command shares: ``--json``, ``--storage-option``, ``--debug``, exit statuses and output.

Exit statuses: 0 success; 1 a check found a difference or damage (also when a read meets a bad
checksum or a truncated data object, whatever the command); 2 a usage error or an access error
(no snapshot there, unknown scheme, storage failure), and anything unexpected. Errors are one
line on stderr, the library's message (what was wrong and what to do), with the traceback only
under ``--debug``; with ``--json`` stdout holds the JSON document and nothing else.
"""

from __future__ import annotations

import dataclasses
import functools
import io
import json
import logging
import math
import os
import re
import sys
import traceback
from collections.abc import Callable
from typing import Any, TypeVar

import click
from rich.console import Console
from rich.logging import RichHandler

from snapshotkit.cli._advice import reworded

# Re-exported ("x as x"): the commands import these from here, with the rest of what they share.
from snapshotkit.cli._output import cell_text as cell_text
from snapshotkit.cli._output import console as console
from snapshotkit.cli._output import is_plain as is_plain
from snapshotkit.cli._output import print_lines as print_lines
from snapshotkit.cli._output import print_table as print_table
from snapshotkit.errors import IntegrityError, SnapshotkitError

EXIT_OK = 0
#: A check found a difference or damage.
EXIT_FOUND = 1
#: A usage or access error.
EXIT_ERROR = 2
EXIT_INTERRUPTED = 130
#: The reader of stdout went away (128 + SIGPIPE, as a shell reports a tool SIGPIPE killed).
EXIT_BROKEN_PIPE = 141

F = TypeVar("F", bound=Callable[..., Any])

_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12}
_UNITS.update({"k": 1 << 10, "kib": 1 << 10, "m": 1 << 20, "mib": 1 << 20, "g": 1 << 30, "gib": 1 << 30})
_UNITS.update({"t": 1 << 40, "tib": 1 << 40})
_SIZE = re.compile(r"\s*([0-9][0-9_]*)\s*([a-zA-Z]*)\s*")


@dataclasses.dataclass(frozen=True)
class Common:
    """The options every command takes.

    Attributes:
        json: print one JSON document on stdout instead of text.
        storage_options: ``--storage-option`` pairs, for the storage plugin.
        debug: show tracebacks, and snapshotkit's INFO log lines.
    """

    json: bool
    storage_options: dict[str, Any]
    debug: bool


def _storage_options(ctx: click.Context, param: click.Parameter, pairs: tuple[str, ...]) -> dict[str, Any]:
    options: dict[str, Any] = {}
    for pair in pairs:
        key, equals, text = pair.partition("=")
        if not equals or not key.strip():
            raise click.BadParameter(f"{pair!r} is not KEY=VALUE (e.g. endpoint_url=http://127.0.0.1:8333)")
        try:
            value: Any = json.loads(text)
        except ValueError:
            value = text
        options[key.strip()] = value
    return options


def byte_size(ctx: click.Context, param: click.Parameter, value: str | None) -> int | None:
    """A byte count: ``268435456``, ``256MiB``, ``64M`` (binary units), ``1GB`` (decimal)."""
    if value is None:
        return None
    match = _SIZE.fullmatch(value)
    unit = match.group(2).lower() if match else ""
    if match is None or unit not in _UNITS or int(match.group(1).replace("_", "")) <= 0:
        raise click.BadParameter(f"{value!r} is not a positive byte count such as 268435456, 256MiB or 1GiB")
    return int(match.group(1).replace("_", "")) * _UNITS[unit]


def memory_budget_option(func: F) -> F:
    return click.option(
        "--memory-budget",
        "memory_budget_bytes",
        metavar="BYTES",
        default=None,
        callback=byte_size,
        help="Host bytes the reads may hold at once (e.g. 256MiB; default: as for restore).",
    )(func)


def progress_option(func: F) -> F:
    """Add ``--progress/--no-progress``; resolve it with :func:`show_progress`."""
    return click.option(
        "--progress/--no-progress",
        "progress",
        default=None,
        help="Show a progress bar on stderr (bytes, rate) once the operation has run 2 s "
        "(default: when stderr is a terminal, unless --json).",
    )(func)


def show_progress(progress: bool | None, common: Common) -> bool:
    """``--progress``/``--no-progress`` if given; else on when stderr is a terminal and not ``--json``."""
    if progress is not None:
        return progress
    return not common.json and Console(stderr=True).is_terminal


def command_options(func: Callable[..., int]) -> Callable[..., None]:
    """Add ``--json``, ``--storage-option`` and ``--debug``; run the command, turning its
    return value or its error into the exit status."""

    @click.option("--json", "json_output", is_flag=True, help="Print one JSON document on stdout instead of text.")
    @click.option(
        "--storage-option",
        "-o",
        "storage_options",
        multiple=True,
        metavar="KEY=VALUE",
        callback=_storage_options,
        help="An option for the storage plugin (repeatable); VALUE is read as JSON when it parses "
        "(a number, true, a list...), else as a string. E.g. -o endpoint_url=http://127.0.0.1:8333",
    )
    @click.option("--debug", is_flag=True, help="Show tracebacks and snapshotkit's INFO log lines.")
    @functools.wraps(func)
    def run(*args: Any, json_output: bool, storage_options: dict[str, Any], debug: bool, **kwargs: Any) -> None:
        common = Common(json_output, storage_options, debug)
        _configure_logging(debug)
        try:
            status = func(*args, common=common, **kwargs)
        except (click.exceptions.Exit, click.ClickException, click.Abort):
            raise
        except KeyboardInterrupt:
            click.echo(f"snapshotkit {_name()}: interrupted", err=True)
            status = EXIT_INTERRUPTED
        except BrokenPipeError:
            # The reader of a pipe went away (`snapshotkit ls ROOT | head`): stop quietly, as a
            # shell tool killed by SIGPIPE would, with nothing more to write to it.
            _silence_stdout()
            status = EXIT_BROKEN_PIPE
        except Exception as exc:
            status = _report(exc, common)
        raise click.exceptions.Exit(status)

    return run


def _silence_stdout() -> None:
    """Point stdout at the null device, so that the interpreter's last flush has nowhere to fail."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError, io.UnsupportedOperation):  # not a real file (a test runner's buffer)
        pass


def _name() -> str:
    ctx = click.get_current_context(silent=True)
    return ctx.info_name if ctx is not None and ctx.info_name else "snapshotkit"


def exit_status(exc: BaseException) -> int:
    """:data:`EXIT_FOUND` for damage a read found, :data:`EXIT_ERROR` for anything else."""
    return EXIT_FOUND if isinstance(exc, IntegrityError) else EXIT_ERROR


def _report(exc: Exception, common: Common) -> int:
    if common.debug:
        traceback.print_exception(exc, file=sys.stderr)
    words = reworded(exc, _name()) if isinstance(exc, SnapshotkitError) else None
    message = " ".join((words or str(exc)).split()) or type(exc).__name__
    if isinstance(exc, IntegrityError) and _name() != "verify":
        message += ". Run `snapshotkit verify` to list every damaged piece"
    elif isinstance(exc, OSError) and not isinstance(exc, SnapshotkitError):
        message = f"{type(exc).__name__}: {message}. Check the path, the storage options and your permissions"
    elif not isinstance(exc, SnapshotkitError):
        message = f"{type(exc).__name__}: {message} (unexpected: rerun with --debug for the traceback, and report it)"
    click.echo(f"snapshotkit {_name()}: error: {message}", err=True)
    return exit_status(exc)


def _configure_logging(debug: bool) -> None:
    logger = logging.getLogger("snapshotkit")
    if not any(isinstance(h, RichHandler) for h in logger.handlers):
        handler = RichHandler(console=Console(stderr=True), show_time=False, show_path=False)
        logger.addHandler(handler)
    logger.setLevel(logging.INFO if debug else logging.WARNING)


def emit_json(document: dict[str, Any]) -> None:
    """Print ``document`` as the command's only output (floats that are not finite become strings)."""
    click.echo(json.dumps(_finite(document), indent=2, allow_nan=False, ensure_ascii=False))


def _finite(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return "nan" if math.isnan(value) else "inf" if value > 0 else "-inf"
    if isinstance(value, dict):
        return {key: _finite(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(item) for item in value]
    return value


def format_bytes(nbytes: int | None) -> str:
    """``1.50 MiB``; ``unknown`` for None."""
    if nbytes is None:
        return "unknown"
    if nbytes < 1024:
        return f"{nbytes} B"
    value = float(nbytes)
    for unit in ("KiB", "MiB", "GiB", "TiB", "PiB"):
        value /= 1024
        if value < 1024 or unit == "PiB":
            break
    return f"{value:.2f} {unit}"


def format_number(value: float | None) -> str:
    """A float64 statistic, compactly (``-`` for None)."""
    return "-" if value is None else f"{value:.6g}"


def compact_json(value: Any, limit: int | None = 60) -> str:
    """``value`` as JSON on one line, cut to ``limit`` characters (``...`` at the end); whole for None."""
    text = json.dumps(value, separators=(",", ":"), ensure_ascii=False, default=str)
    return text if limit is None or len(text) <= limit else text[: limit - 3] + "..."


def plural(number: int, noun: str) -> str:
    """``1 piece``, ``2 pieces``."""
    return f"{number} {noun}{'' if number == 1 else 's'}"
