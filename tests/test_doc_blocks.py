"""Every shell block of the docs runs as written, in an empty directory, as a user would type it.

Which pages, which blocks: README.md and ``docs/*.md``. On every page that has a shell block to run
(a ```` ```bash ````, ```` ```sh ````, ```` ```shell ```` or ```` ```console ```` block without the
marker below), its ```python blocks and its shell blocks run in document order, so a page's blocks
build on each other: the Python blocks in one fresh interpreter (one namespace), the shell blocks
through bash, all in one empty temporary directory, with the venv's ``python`` and ``snapshotkit``
commands first on ``PATH`` (the code of this checkout: it is first on ``PYTHONPATH``). The Python
blocks of a page without shell blocks are not run here, except the README's and the quickstart's,
which always have shell blocks.

How a block runs:

- ```` ```bash ````, ```` ```sh ````, ```` ```shell ````: the whole block is one bash script
  (``set -e -o pipefail``) that must exit with status 0.
- ```` ```console ````: each line after a ``$ `` prompt is a command (a line ending in ``\\``
  continues on the next); the lines below it, up to the next prompt, are its shown output. The
  commands of a block run in one bash session. Every command must exit with status 0, unless the
  next command is ``echo $?``: the status is then the one the block shows, and that line is
  compared. Shown output is compared, line by line, only in a block marked
  ``<!-- doc-test: check output -->``, which states that its output is exact: trailing whitespace
  and trailing blank lines are ignored, and ``[...]`` in a shown line stands for any text within
  that line (for times, sizes on disk, dates, temporary paths, random names). Other blocks show
  output recorded once, for people (a table's width follows the terminal, sizes and times vary),
  so it is not compared: those commands must still run, with the status stated.
- A block with ``$ `` prompts must be a ```` ```console ```` block (a ```` ```text ```` one would
  escape the test).

A block that cannot run here (installing packages, a full test run or benchmark, a GPU, an object
store that needs a server or credentials, a transcript recorded elsewhere) opts out with an HTML
comment on the line just before its fence, which neither GitHub nor the site shows::

    <!-- doc-test: skip (why) -->

The reason is required (a marker without one, or any other ``doc-test`` comment, fails
:func:`test_markers_are_well_formed`), and the marker is for those cases only: a block that could
run, does. Nothing is left behind: the temporary directory the blocks see (``TMPDIR``) must be
empty at the end, and the working directory is removed.

To see what a page's commands print now (to record a new output, or when a shown output no longer
matches): ``python tests/test_doc_blocks.py docs/cli.md`` runs the page the same way and prints
every command with its output.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import _doc_cli
import pytest

REPO = Path(__file__).resolve().parent.parent
DOCUMENTS = ["README.md", *sorted(str(p.relative_to(REPO)) for p in (REPO / "docs").glob("*.md"))]
SHELL_LANGUAGES = ("bash", "sh", "shell", "console")

# Pages whose shell blocks are not yet marked, each with why; not run until the entry is removed
# (test_pending_pages_are_still_pending fails once a page's shell blocks are all marked).
_MARKERS_PENDING: dict[str, str] = {}

_FENCE = re.compile(r"^```(?P<language>[\w-]*)[^\n]*\n(?P<source>.*?)^```[ \t]*$", flags=re.DOTALL | re.MULTILINE)
_MARKER = re.compile(r"<!--\s*doc-test\b.*?-->", flags=re.DOTALL)
_SKIP = re.compile(r"<!-- doc-test: skip \((?P<reason>.*\S.*)\) -->")
_CHECK_OUTPUT = "<!-- doc-test: check output -->"
_STATUS_SEPARATOR = "@@doc-test status"
_ELIDED = "[...]"


@dataclass(frozen=True)
class _Command:
    text: str
    shown: tuple[str, ...]  # the output lines the block shows below the command


@dataclass(frozen=True)
class _Block:
    kind: str  # "python", "script" (bash/sh/shell) or "console"
    line: int
    source: str
    commands: tuple[_Command, ...] = ()
    check_output: bool = False

    def script(self) -> str:
        """The bash script that runs the block; a console block prints each command's status after it."""
        if self.kind == "script":
            return "set -e -o pipefail\n" + self.source
        lines = []
        for command in self.commands:
            lines.append(command.text)
            lines.append(
                f"__doc_test_status=$?; printf '\\n{_STATUS_SEPARATOR} %d@@\\n' \"$__doc_test_status\"; "
                '(exit "$__doc_test_status")'
            )
        return "\n".join(lines) + "\n"


def _console_commands(source: str) -> tuple[_Command, ...]:
    commands: list[_Command] = []
    text: str | None = None
    shown: list[str] = []
    continued = False
    for line in source.splitlines():
        if continued:
            text = f"{text}\n{line}"
            continued = line.endswith("\\")
            continue
        if line.startswith("$ "):
            if text is not None:
                commands.append(_Command(text, _trimmed(shown)))
            text, shown = line[2:], []
            continued = line.endswith("\\")
        elif text is not None:
            shown.append(line)
    if text is not None:
        commands.append(_Command(text, _trimmed(shown)))
    return tuple(commands)


def _trimmed(lines: list[str]) -> tuple[str, ...]:
    """Lines without trailing whitespace, and without the blank lines at the end."""
    stripped = [line.rstrip() for line in lines]
    while stripped and not stripped[-1]:
        stripped.pop()
    return tuple(stripped)


def _line_before(text: str, offset: int) -> str:
    return text[:offset].rstrip("\n").rsplit("\n", 1)[-1].strip()


def _blocks(text: str) -> tuple[list[_Block], list[tuple[int, str]]]:
    """The blocks of a Markdown text to run, in order, and the (line, reason) of the skipped ones."""
    blocks: list[_Block] = []
    skipped: list[tuple[int, str]] = []
    for match in _FENCE.finditer(text):
        language, source = match.group("language"), match.group("source")
        line = text.count("\n", 0, match.start()) + 1
        before = _line_before(text, match.start())
        if (marker := _SKIP.fullmatch(before)) is not None:
            skipped.append((line, marker.group("reason")))
        elif language == "python":
            blocks.append(_Block("python", line, source))
        elif language == "console":
            blocks.append(_Block("console", line, source, _console_commands(source), before == _CHECK_OUTPUT))
        elif language in SHELL_LANGUAGES:
            blocks.append(_Block("script", line, source))
    return blocks, skipped


def _shell_blocks(blocks: list[_Block]) -> list[_Block]:
    return [b for b in blocks if b.kind != "python"]


def _marker_problems(text: str) -> list[str]:
    """Every ``doc-test`` comment that is not a well-formed marker on the line just before a fence."""
    fence_starts = {m.start() for m in _FENCE.finditer(text)}
    problems = []
    for marker in _MARKER.finditer(text):
        line_start = text.rfind("\n", 0, marker.start()) + 1
        if text[line_start : marker.start()].strip():
            continue  # the marker quoted in a sentence (`...`), not a marker
        line = text.count("\n", 0, marker.start()) + 1
        comment = marker.group(0)
        if _SKIP.fullmatch(comment) is None and comment != _CHECK_OUTPUT:
            problems.append(
                f"line {line}: {comment!r} is not `<!-- doc-test: skip (the reason) -->` "
                f"or `{_CHECK_OUTPUT}` (a skip needs its reason)"
            )
            continue
        line_end = text.find("\n", marker.end())
        if line_end < 0 or text[marker.end() : line_end].strip() or line_end + 1 not in fence_starts:
            problems.append(f"line {line}: {comment!r} is not alone on the line just before a code fence")
        elif comment == _CHECK_OUTPUT and not text[line_end + 1 :].startswith("```console"):
            problems.append(f"line {line}: {comment!r} is for ```console blocks only")
    return problems


def _prompt_block_problems(text: str) -> list[str]:
    """Blocks that show ``$ `` commands but are not ```console (they would not run)."""
    problems = []
    for match in _FENCE.finditer(text):
        language = match.group("language")
        if language in ("console", "python"):
            continue
        if any(line.startswith("$ ") for line in match.group("source").splitlines()):
            line = text.count("\n", 0, match.start()) + 1
            problems.append(f"line {line}: a ```{language} block with `$ ` prompts: make it ```console")
    return problems


def _output_problems(block: _Block, output: str, returncode: int) -> list[str]:
    """What differs between a shell block's run (its combined stdout and stderr) and what it states."""
    if block.kind == "script":
        return [] if returncode == 0 else [f"the block exited with status {returncode}:\n{output}"]
    parts = re.split(rf"\n{re.escape(_STATUS_SEPARATOR)} (\d+)@@\n", output)
    outputs, statuses = parts[0::2], [int(s) for s in parts[1::2]]
    problems = []
    for index, command in enumerate(block.commands):
        if index >= len(statuses):
            problems.append(f"$ {command.text}: did not run (the shell ended before it):\n{outputs[-1]}")
            break
        actual = _trimmed(outputs[index].splitlines())
        following = block.commands[index + 1].text.strip() if index + 1 < len(block.commands) else ""
        if statuses[index] != 0 and following != "echo $?":
            problems.append(f"$ {command.text}: exited with status {statuses[index]}:\n" + "\n".join(actual))
        compared = command.text.strip() == "echo $?" or block.check_output
        if compared and not _matches(command.shown, actual):
            problems.append(
                f"$ {command.text}: the output differs from the block's\n--- shown\n"
                + "\n".join(command.shown)
                + "\n--- actual\n"
                + "\n".join(actual)
            )
    return problems


def _matches(shown: tuple[str, ...], actual: tuple[str, ...]) -> bool:
    if len(shown) != len(actual):
        return False
    for expected, line in zip(shown, actual, strict=True):
        pattern = ".*".join(re.escape(part) for part in expected.split(_ELIDED))
        if re.fullmatch(pattern, line) is None:
            return False
    return True


def _run_blocks(document: str, blocks: list[dict[str, Any]], transcript: bool) -> int:
    """Runs a page's blocks in the current directory (in the child process); 1 at the first failure."""
    server = None
    if any(raw["kind"] != "python" for raw in blocks):
        with contextlib.suppress(OSError):  # no fork server (not Linux): every command starts an interpreter
            server, os.environ[_doc_cli.SERVER_VARIABLE] = _doc_cli.start(dict(os.environ))
    try:
        return _run_each_block(document, blocks, transcript)
    finally:
        if server is not None:
            server.terminate()
            server.wait()


def _run_each_block(document: str, blocks: list[dict[str, Any]], transcript: bool) -> int:
    namespace = {"__name__": "__doc_blocks__"}
    for raw in blocks:
        block = _Block(
            raw["kind"],
            raw["line"],
            raw["source"],
            tuple(_Command(c["text"], tuple(c["shown"])) for c in raw["commands"]),
            raw["check_output"],
        )
        where = f"{document} line {block.line}"
        if block.kind == "python":
            exec(compile(block.source, where, "exec"), namespace)
            continue
        # stderr into stdout, as a terminal shows them; nothing to read on stdin
        proc = subprocess.run(
            ["bash", "-c", block.script()],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            check=False,
        )
        if transcript:
            shown = re.sub(rf"\n{re.escape(_STATUS_SEPARATOR)} \d+@@\n", "\n", proc.stdout)
            print(f"--- {where} ({block.kind})\n{shown}", flush=True)
        if problems := _output_problems(block, proc.stdout, proc.returncode):
            print(f"{where}:\n" + "\n\n".join(problems), file=sys.stderr, flush=True)
            return 1
    return 0


def _run_document(document: str, tmp_path: Path, *, transcript: bool = False) -> subprocess.CompletedProcess[str]:
    """Runs a page's blocks in a fresh interpreter, in ``tmp_path/work``, with ``TMPDIR`` at ``tmp_path/temp``."""
    blocks, _ = _blocks((REPO / document).read_text())
    work, temp, bin_dir = tmp_path / "work", tmp_path / "temp", tmp_path / "bin"
    for folder in (work, temp, bin_dir):
        folder.mkdir()
    venv_bin = Path(sys.executable).parent
    installed = venv_bin / "snapshotkit"
    # not installed (a bare checkout): this checkout's module
    real = [str(installed)] if installed.exists() else [sys.executable, "-m", "snapshotkit"]
    _doc_cli.write_shim(bin_dir / "snapshotkit", real)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    env["PATH"] = os.pathsep.join((str(bin_dir), str(venv_bin), env["PATH"]))
    env["TMPDIR"] = str(temp)
    env["TORCHINDUCTOR_CACHE_DIR"] = str(tmp_path / "torch-cache")  # torch's own, made by an optimizer step
    env.pop("SNAPSHOTKIT_MEMORY_BUDGET_BYTES", None)
    env["HF_HUB_OFFLINE"] = "1"  # docs/huggingface.md builds its model from a config: never reach the Hub
    payload = [
        {
            "kind": b.kind,
            "line": b.line,
            "source": b.source,
            "commands": [{"text": c.text, "shown": list(c.shown)} for c in b.commands],
            "check_output": b.check_output,
        }
        for b in blocks
    ]
    return subprocess.run(
        [sys.executable, __file__, "--child", document, *(["--transcript"] if transcript else [])],
        input=json.dumps(payload),
        capture_output=not transcript,
        text=True,
        timeout=400,
        env=env,
        cwd=work,
        check=False,
    )


def _documents_to_run() -> list[str]:
    return [
        document
        for document in DOCUMENTS
        if document not in _MARKERS_PENDING and _shell_blocks(_blocks((REPO / document).read_text())[0])
    ]


# ---------------------------------------------------------------- the tests


def test_blocks_are_found_and_the_markers_are_parsed() -> None:
    text = (
        "```python\nx = 1\n```\n"
        "<!-- doc-test: skip (needs S3 credentials) -->\n```python\nSnapshot('s3://b/x')\n```\n"
        "```bash\nmkdir -p out\n```\n"
        "<!-- doc-test: check output -->\n"
        "```console\n$ snapshotkit ls ckpt  # a comment\nstep  status  \n\n$ echo a \\\nb\na b\n```\n"
        "```text\nnot run\n```\n"
    )
    blocks, skipped = _blocks(text)
    assert [(b.kind, b.line) for b in blocks] == [("python", 1), ("script", 8), ("console", 12)]
    assert blocks[2].check_output
    assert blocks[2].commands == (
        _Command("snapshotkit ls ckpt  # a comment", ("step  status",)),
        _Command("echo a \\\nb", ("a b",)),
    )
    assert skipped == [(5, "needs S3 credentials")]
    assert _marker_problems(text) == []


def test_bad_markers_and_disguised_sessions_are_found() -> None:
    text = (
        "<!-- doc-test: skip -->\n```bash\nx\n```\n"
        "<!-- doc-test: skip () -->\n```bash\nx\n```\n"
        "<!-- doc-test: skip (a reason) -->\n\n```bash\nx\n```\n"
        "<!-- doc-test: check output -->\n```bash\nx\n```\n"
        "As `<!-- doc-test: skip (x) -->` in a sentence.\n"
        "```text\n$ snapshotkit ls ckpt\n```\n"
    )
    problems = _marker_problems(text)
    assert [p.split(":")[0] for p in problems] == ["line 1", "line 5", "line 9", "line 14"], problems
    assert _prompt_block_problems(text) == ["line 19: a ```text block with `$ ` prompts: make it ```console"]


def test_console_statuses_and_outputs_are_checked() -> None:
    sep = _STATUS_SEPARATOR

    def run(source: str, output: str, *, check_output: bool = False) -> list[str]:
        block = _Block("console", 1, source, _console_commands(source), check_output)
        return _output_problems(block, output, 0)

    assert run("$ false\n$ echo $?\n1\n", f"\n{sep} 1@@\n1\n\n{sep} 0@@\n") == []
    assert run("$ false\n$ echo $?\n0\n", f"\n{sep} 1@@\n1\n\n{sep} 0@@\n") != []  # the wrong status shown
    assert run("$ false\n$ true\n", f"\n{sep} 1@@\n\n{sep} 0@@\n") != []  # a failure nobody states
    assert run("$ true\n$ true\n", f"\n{sep} 0@@\n") != []  # the shell ended early
    shown = "$ snapshotkit verify s\nOK: s: [...] pieces  \n\n"
    assert run(shown, f"OK: s: 8 pieces\n\n{sep} 0@@\n", check_output=True) == []
    assert run(shown, f"OK: s: 8 of 9 pieces\n\n{sep} 0@@\n", check_output=True) == []
    assert run(shown, f"OK: s: 8 pieces\nmore\n\n{sep} 0@@\n", check_output=True) != []
    assert run(shown, f"DAMAGED: s\n\n{sep} 0@@\n", check_output=True) != []
    assert run(shown, f"DAMAGED: s\n\n{sep} 0@@\n") == []  # output shown for people only


def test_markers_are_well_formed() -> None:
    problems = [f"{d} {p}" for d in DOCUMENTS for p in _marker_problems((REPO / d).read_text())]
    assert not problems, "\n".join(problems)


def test_sessions_are_console_blocks() -> None:
    problems = [f"{d} {p}" for d in DOCUMENTS for p in _prompt_block_problems((REPO / d).read_text())]
    assert not problems, "\n".join(problems)


def test_pending_pages_are_still_pending() -> None:
    """A page in _MARKERS_PENDING whose shell blocks are now all marked runs like the others."""
    done = [d for d in _MARKERS_PENDING if not _shell_blocks(_blocks((REPO / d).read_text())[0])]
    assert not done, f"{done}: every shell block is marked now: remove the page from _MARKERS_PENDING"


def test_the_shell_blocks_are_found() -> None:
    documents = _documents_to_run()
    assert {"README.md", "docs/quickstart.md", "docs/cli.md", "docs/lightning.md"} <= set(documents), documents


def test_only_what_is_read_per_command_may_differ_from_the_cli_servers_environment() -> None:
    startup = {"PATH": "/bin", "SHLVL": "1", "SNAPSHOTKIT_IO_CONCURRENCY": "4"}
    assert _doc_cli.runs_in_a_fork(startup, startup)
    assert _doc_cli.runs_in_a_fork(
        {"PATH": "/bin", "SHLVL": "2", "_": "/x", "SNAPSHOTKIT_X": "1", "COLUMNS": "40"}, startup
    )
    assert not _doc_cli.runs_in_a_fork({**startup, "PYTHONWARNINGS": "error"}, startup)  # read at startup
    assert not _doc_cli.runs_in_a_fork({**startup, "PATH": "/usr/bin"}, startup)
    assert not _doc_cli.runs_in_a_fork({"PATH": "/bin"}, {"PATH": "/bin", "OMP_NUM_THREADS": "1"})


@pytest.mark.slow
def test_the_cli_server_runs_commands_as_the_installed_command_does(tmp_path: Path) -> None:
    """The same streams, exit statuses and output through the fork server as from the real command."""
    script = (
        'snapshotkit ls missing; echo "status $?"\n'  # usage error: stderr, status 2
        "snapshotkit --help | head -n 2\n"  # a pipe that closes early
        'COLUMNS=40 SNAPSHOTKIT_MEMORY_BUDGET_BYTES=x snapshotkit ls . > out.txt 2>&1; echo "status $?"; cat out.txt\n'
    )
    installed = Path(sys.executable).parent / "snapshotkit"
    real = [str(installed)] if installed.exists() else [sys.executable, "-m", "snapshotkit"]
    _doc_cli.write_shim(tmp_path / "snapshotkit", real)
    env = {**os.environ, "PATH": os.pathsep.join((str(tmp_path), os.environ["PATH"]))}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    env.pop(_doc_cli.SERVER_VARIABLE, None)

    def run(env: dict[str, str]) -> str:
        proc = subprocess.run(
            ["bash", "-c", script], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120
        )
        assert proc.returncode == 0, proc.stderr
        return proc.stdout + "\n--- stderr\n" + proc.stderr

    expected = run(env)  # no server: the shim runs the real command
    server, name = _doc_cli.start(env)
    try:
        assert run({**env, _doc_cli.SERVER_VARIABLE: name}) == expected
    finally:
        server.terminate()
        server.wait()
    assert "status 2" in expected, expected
    (tmp_path / "out.txt").unlink()
    (tmp_path / "snapshotkit").unlink()


@pytest.mark.slow
@pytest.mark.parametrize("document", _documents_to_run())
def test_every_block_runs_as_written(document: str, tmp_path: Path) -> None:
    proc = _run_document(document, tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    left = sorted(p.name for p in (tmp_path / "temp").iterdir())
    assert left == [], f"the blocks left files in the temporary directory: {left}"


def _main(argv: list[str]) -> int:
    if argv[:1] == ["--child"]:
        return _run_blocks(argv[1], json.load(sys.stdin), transcript="--transcript" in argv)
    if len(argv) != 1 or argv[0] not in DOCUMENTS:
        print(f"usage: python tests/test_doc_blocks.py PAGE  (one of {', '.join(DOCUMENTS)})", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as folder:
        return _run_document(argv[0], Path(folder), transcript=True).returncode


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
