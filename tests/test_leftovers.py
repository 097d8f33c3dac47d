"""The checks in tests/conftest.py: a run that leaves files in the temp directory fails, by name, and so does
a test that leaves a shared-memory segment in /dev/shm.

Each case runs pytest in a subprocess on a small project that uses a copy of our conftest.py, with
``TMPDIR`` pointing at a directory of the case's own, which must be empty afterwards either way.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # two pytest sessions that import torch: ~15 s each

CONFTEST = Path(__file__).resolve().parent / "conftest.py"

_TESTS = """
import tempfile
from pathlib import Path


def test_tmp_path_is_cleaned_by_pytest(tmp_path):
    (tmp_path / "kept-by-pytest-until-the-end").write_text("x")


def test_removes_what_it_makes():
    with tempfile.TemporaryDirectory() as work:
        (Path(work) / "f").write_text("x")


def test_subprocesses_share_the_private_temp_dir():
    import os, subprocess, sys
    code = "import tempfile; print(tempfile.gettempdir())"
    child = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert child.stdout.strip() == tempfile.gettempdir() == os.environ["TMPDIR"]
"""

_FORGETS = """

def test_forgets_a_file():
    handle, _ = tempfile.mkstemp(prefix="forgotten-")
"""


def _run(tmp_path: Path, tests: str) -> tuple[subprocess.CompletedProcess[str], Path]:
    project, outer_tmp = tmp_path / "project", tmp_path / "tmp"
    (project / "tests").mkdir(parents=True)
    outer_tmp.mkdir()
    (project / "pyproject.toml").write_text('[tool.pytest.ini_options]\ntmp_path_retention_policy = "none"\n')
    shutil.copy(CONFTEST, project / "tests" / "conftest.py")
    (project / "tests" / "test_cases.py").write_text(tests)
    env = {**os.environ, "TMPDIR": str(outer_tmp)}
    env.pop("TORCHINDUCTOR_CACHE_DIR", None)
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "tests"],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=project,
    )
    return proc, outer_tmp


def test_a_clean_run_passes_and_leaves_nothing(tmp_path: Path) -> None:
    proc, outer_tmp = _run(tmp_path, _TESTS)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output
    assert "3 passed" in output, output
    assert "leftovers" not in output, output
    assert list(outer_tmp.iterdir()) == [], output


def test_a_forgotten_temp_file_fails_the_run_by_name(tmp_path: Path) -> None:
    proc, outer_tmp = _run(tmp_path, _TESTS + _FORGETS)
    output = proc.stdout + proc.stderr
    assert proc.returncode == pytest.ExitCode.TESTS_FAILED, output
    assert "leftovers in the temp directory" in output, output
    assert "left 1 entry in its temp directory" in output, output
    assert "forgotten-" in output, output
    assert "kept-by-pytest" not in output, output  # pytest's own tmp_path trees are not leftovers
    assert list(outer_tmp.iterdir()) == [], output  # the private directory is removed either way


_LEAKS_SHARED_MEMORY = """

def test_uses_shared_memory_and_unlinks_it():
    from multiprocessing import shared_memory
    segment = shared_memory.SharedMemory(create=True, size=4096)
    segment.close()
    segment.unlink()


def test_leaves_a_shared_memory_segment():
    from multiprocessing import shared_memory
    segment = shared_memory.SharedMemory(create=True, size=4096)
    segment.close()  # unmapped, never unlinked
"""


@pytest.mark.skipif(not Path("/dev/shm").is_dir(), reason="POSIX shared memory in /dev/shm (Linux)")
def test_a_leaked_shared_memory_segment_fails_the_test_by_name(tmp_path: Path) -> None:
    proc, outer_tmp = _run(tmp_path, _LEAKS_SHARED_MEMORY)
    output = proc.stdout + proc.stderr
    leaked = sorted(set(re.findall(r"\bpsm_\w+", output)))
    for name in leaked:  # ours; the child's resource tracker may have removed it already, at its exit
        with contextlib.suppress(FileNotFoundError):
            (Path("/dev/shm") / name).unlink()
    assert proc.returncode == pytest.ExitCode.TESTS_FAILED, output
    assert "2 passed, 1 error" in output, output  # the leak is an error at its teardown
    assert "ERROR at teardown of test_leaves_a_shared_memory_segment" in output, output
    assert len(leaked) == 1 and "left 1 shared-memory segment(s) in /dev/shm that no process uses" in output, output
    assert list(outer_tmp.iterdir()) == [], output
