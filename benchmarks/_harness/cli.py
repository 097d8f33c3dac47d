"""Command-line pieces every benchmark script shares: sizes, the parser preamble, outputs, scratch."""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

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


def default_out(stem: str) -> Path:
    """``benchmarks/results/<stem>-<date>.json``: where a run meant for the docs lands."""
    return RESULTS_DIR / f"{stem}-{time.strftime('%Y-%m-%d')}.json"


class BenchParser(argparse.ArgumentParser):
    """The parser preamble: the script's docstring as description (its first paragraph unless
    ``full_doc``) and the flags whose handling the scripts share. :meth:`parse` resolves them:
    subsets become lists, ``--quick`` applies its presets, ``--repeats`` (if any) is checked and
    ``--out`` gets its dated default."""

    def __init__(self, doc: str, *, full_doc: bool = False) -> None:
        description = doc if full_doc else doc.split("\n\n")[0]
        super().__init__(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
        self._subsets: dict[str, Sequence[str]] = {}
        self._out_stem: str | None = None
        self._quick: dict[str, Any] = {}

    def add_out(self, *, stem: str | None = None, default: str | None = None, help: str | None = None) -> None:
        """``--out``; with ``stem`` it defaults to :func:`default_out` of it."""
        self._out_stem = stem
        if help is None and stem is not None:
            help = f"JSON result file (default: benchmarks/results/{stem}-<date>.json)"
        self.add_argument("--out", default=default, help=help or "JSON result file (default: %(default)s)")

    def add_subset(self, flag: str, allowed: Sequence[str]) -> None:
        """A comma-separated subset of ``allowed`` (all by default); a list after :meth:`parse`."""
        self._subsets[flag.lstrip("-").replace("-", "_")] = allowed
        self.add_argument(flag, default=",".join(allowed), help="comma-separated subset of: " + ",".join(allowed))

    def add_quick(self, help: str, **presets: Any) -> None:
        """``--quick``: smoke-test sizes. A preset is a value, or a function of the parsed value
        for flags the user may still set alongside."""
        self._quick = presets
        self.add_argument("--quick", action="store_true", help=help)

    def add_launcher(
        self, *, default: str | None, timeout: float, unit: str, default_note: str = "%(default)s"
    ) -> None:
        """``--launcher`` and ``--op-timeout`` for :class:`_harness.launch.Launcher`, plus the hidden
        ``--child`` / ``--result-file`` its ``subprocess`` kind re-executes the script with."""
        self.add_argument(
            "--launcher",
            choices=LAUNCHERS,
            default=default,
            help=f"how each {unit}'s fresh process is started (default: {default_note})",
        )
        self.add_argument("--op-timeout", type=float, default=timeout, help=f"seconds per {unit} before it is killed")
        self.add_argument("--child", default=None, help=argparse.SUPPRESS)
        self.add_argument("--result-file", default=None, help=argparse.SUPPRESS)

    def parse(self, argv: Sequence[str] | None = None) -> argparse.Namespace:
        args = self.parse_args(argv)
        if getattr(args, "quick", False):
            for name, preset in self._quick.items():
                setattr(args, name, preset(getattr(args, name)) if callable(preset) else preset)
        for name, allowed in self._subsets.items():
            chosen = [s.strip() for s in getattr(args, name).split(",") if s.strip()]
            bad = sorted(set(chosen) - set(allowed))
            if bad or not chosen:
                self.error(f"--{name}: unknown or empty selection {bad}; choose from {','.join(allowed)}")
            setattr(args, name, [s for s in allowed if s in chosen])
        if getattr(args, "repeats", 1) < 1:
            self.error("--repeats must be >= 1")
        if "out" in vars(args) and args.out is None and self._out_stem is not None:
            args.out = str(default_out(self._out_stem))  # a str, so ``vars(args)`` stays JSON
        return args


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
