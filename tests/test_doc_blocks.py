"""Every code block of docs/quickstart.md and README.md runs as written.

The ```python blocks of one file run in order in one fresh interpreter (one namespace), in an
empty temporary directory; the ```bash and ```console commands that call the ``snapshotkit``
command line run in that directory too, at their place in the sequence, and must exit with
status 0. Other shell blocks (installing, the README's set-up commands) are not run here: the
README's two commands are checked by tests/test_readme.py and run by CI.

A block that cannot run here (an ``s3://`` path that needs credentials, a ``torchrun`` job on
several ranks) opts out with an HTML comment on the line just before its fence, which neither
GitHub nor the site shows::

    <!-- doc-test: skip (why) -->

The reason is required, and the marker is for those cases only: a block that could run, does.
Nothing is left behind: the interpreter's temporary directory is a folder of the test's own that
must be empty at the end, and the test's directory is removed.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
DOCUMENTS = ["docs/quickstart.md", "README.md"]

_FENCE = re.compile(r"^```(\w+)[^\n]*\n(.*?)^```", flags=re.DOTALL | re.MULTILINE)
_SKIP = re.compile(r"<!-- doc-test: skip \((?P<reason>[^)]+)\) -->\s*$")

# Runs the blocks given as JSON on stdin; a shell block runs through bash, its `snapshotkit`
# resolved to this interpreter's `python -m snapshotkit`, so it tests the code in this checkout.
_RUNNER = r"""
import json, os, subprocess, sys, time
blocks = json.load(sys.stdin)
namespace = {"__name__": "__doc_blocks__"}
for block in blocks:
    where = f"{block['document']} line {block['line']}"
    started_s = time.perf_counter()
    if block["kind"] == "python":
        exec(compile(block["source"], where, "exec"), namespace)
        print(f"{where}: {time.perf_counter() - started_s:.1f} s", flush=True)
        continue
    for command in block["commands"]:
        proc = subprocess.run(["bash", "-c", command], capture_output=True, text=True)
        print(f"$ {command}\n{proc.stdout}{proc.stderr}", flush=True)
        if proc.returncode != 0:
            sys.exit(f"{where}: {command!r} exited with status {proc.returncode}")
"""


@dataclass(frozen=True)
class _Block:
    kind: str  # "python" or "shell"
    line: int
    source: str
    commands: tuple[str, ...]


def _shell_commands(language: str, source: str) -> tuple[str, ...]:
    """The lines of a shell block that call the snapshotkit command (console: after the `$`)."""
    commands = []
    for line in source.splitlines():
        if language == "console":
            if not line.startswith("$ "):
                continue  # output shown in the docs
            line = line[2:]
        if shlex.split(line, comments=True)[:1] == ["snapshotkit"]:
            commands.append(line)
    return tuple(commands)


def _blocks(text: str) -> tuple[list[_Block], list[tuple[int, str]]]:
    """The runnable blocks of a Markdown text in order, and the (line, reason) of skipped ones."""
    blocks: list[_Block] = []
    skipped: list[tuple[int, str]] = []
    for match in _FENCE.finditer(text):
        language, source = match.group(1), match.group(2)
        line = text.count("\n", 0, match.start()) + 1
        before = text[: match.start()].rstrip("\n").rsplit("\n", 1)[-1]
        if (marker := _SKIP.match(before)) is not None:
            skipped.append((line, marker.group("reason")))
        elif language == "python":
            blocks.append(_Block("python", line, source, ()))
        elif language in ("bash", "console", "shell") and (commands := _shell_commands(language, source)):
            blocks.append(_Block("shell", line, source, commands))
    return blocks, skipped


def test_blocks_are_found_and_the_marker_is_parsed() -> None:
    text = (
        "```python\nx = 1\n```\n"
        "<!-- doc-test: skip (needs S3 credentials) -->\n```python\nSnapshot('s3://b/x')\n```\n"
        "```bash\npip install -e .\n```\n"
        "```console\n$ snapshotkit ls ckpt  # a comment\nstep  status\n$ echo hi\n```\n"
    )
    blocks, skipped = _blocks(text)
    assert [(b.kind, b.line) for b in blocks] == [("python", 1), ("shell", 11)]
    assert blocks[1].commands == ("snapshotkit ls ckpt  # a comment",)
    assert skipped == [(5, "needs S3 credentials")]


@pytest.mark.slow
@pytest.mark.parametrize("document", DOCUMENTS)
def test_every_block_runs_as_written(document: str, tmp_path: Path) -> None:
    blocks, skipped = _blocks((REPO / document).read_text())
    assert any(b.kind == "python" for b in blocks), f"{document}: no python block found"
    assert len(skipped) <= 2, f"{document}: the skip marker is for exceptions only: {skipped}"

    work, temp, bin_dir = tmp_path / "work", tmp_path / "temp", tmp_path / "bin"
    for folder in (work, temp, bin_dir):
        folder.mkdir()
    shim = bin_dir / "snapshotkit"
    shim.write_text(f'#!/bin/sh\nexec {shlex.quote(sys.executable)} -m snapshotkit "$@"\n')
    shim.chmod(0o755)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    env["PATH"] = os.pathsep.join((str(bin_dir), env["PATH"]))
    env["TMPDIR"] = str(temp)
    env["TORCHINDUCTOR_CACHE_DIR"] = str(tmp_path / "torch-cache")  # torch's own, made by an optimizer step
    env.pop("SNAPSHOTKIT_MEMORY_BUDGET_BYTES", None)

    payload = [
        {"document": document, "line": b.line, "kind": b.kind, "source": b.source, "commands": list(b.commands)}
        for b in blocks
    ]
    proc = subprocess.run(
        [sys.executable, "-c", _RUNNER],
        input=json.dumps(payload),
        capture_output=True,
        text=True,
        timeout=240,
        env=env,
        cwd=work,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert list(temp.iterdir()) == [], "the blocks left files in the temporary directory"
