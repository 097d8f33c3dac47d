"""Command-line pieces every benchmark script shares: sizes, the parser preamble, outputs, scratch."""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

KiB = 1024
MiB = 1024 * KiB
GiB = 1024 * MiB

LAUNCHERS = ("subprocess", "forkserver")
RESULTS_DIR = Path(__file__).resolve().parents[1] / "results"


def parse_size(text: str) -> int:
    """``4096``, ``64MiB``, ``2g``: an argparse ``type`` for byte sizes."""
    units = {"": 1, "k": KiB, "kib": KiB, "m": MiB, "mib": MiB, "g": GiB, "gib": GiB}
    t = text.strip().lower().replace("_", "")
    num = t.rstrip("kmgib")
    try:
        return int(float(num) * units[t[len(num) :]])
    except (KeyError, ValueError):
        raise argparse.ArgumentTypeError(f"bad size {text!r} (use e.g. 4096, 64MiB, 2GiB)") from None


def make_parser(doc: str, *, full_doc: bool = False) -> argparse.ArgumentParser:
    """A parser whose description is the script's docstring (its first paragraph unless ``full_doc``)."""
    return argparse.ArgumentParser(
        description=doc if full_doc else doc.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )


def add_launcher_args(
    ap: argparse.ArgumentParser, *, default: str | None, timeout: float, unit: str, default_note: str = "%(default)s"
) -> None:
    """``--launcher`` and ``--op-timeout`` for :class:`_harness.launch.Launcher`, plus the hidden
    ``--child`` / ``--result-file`` its ``subprocess`` kind re-executes the script with."""
    ap.add_argument(
        "--launcher",
        choices=LAUNCHERS,
        default=default,
        help=f"how each {unit}'s fresh process is started (default: {default_note})",
    )
    ap.add_argument("--op-timeout", type=float, default=timeout, help=f"seconds per {unit} before it is killed")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--result-file", default=None, help=argparse.SUPPRESS)


def selection(ap: argparse.ArgumentParser, name: str, text: str, allowed: Sequence[str]) -> list[str]:
    """The comma-separated subset ``text`` of ``allowed``, in ``allowed``'s order; exits on a bad one."""
    chosen = [s.strip() for s in text.split(",") if s.strip()]
    bad = sorted(set(chosen) - set(allowed))
    if bad or not chosen:
        ap.error(f"--{name}: unknown or empty selection {bad}; choose from {','.join(allowed)}")
    return [s for s in allowed if s in chosen]


def default_out(stem: str) -> Path:
    """``benchmarks/results/<stem>-<date>.json``: where a run meant for the docs lands."""
    return RESULTS_DIR / f"{stem}-{time.strftime('%Y-%m-%d')}.json"


@contextmanager
def scratch_dir(parent: str | None, prefix: str) -> Iterator[Path]:
    """A new directory under ``parent`` (created if needed; default /tmp), removed on exit however
    the run ends, so an interrupted benchmark does not leave gigabytes behind."""
    if parent:
        Path(parent).mkdir(parents=True, exist_ok=True)
    path = Path(tempfile.mkdtemp(prefix=prefix, dir=parent or "/tmp"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)
