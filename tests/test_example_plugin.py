"""The example out-of-tree storage plugin (plugins/snapshotkit-sqlite) passes its own tests.

They run in a subprocess, as the plugin's own CI would run them, rather than being collected into
this suite: pytest then picks the plugin's pyproject.toml as its config (its rootdir, its
warning filters), and the plugin's test module is imported under its own rootdir rather than
next to this suite's modules. The plugin must be installed
(``pip install -e plugins/snapshotkit-sqlite``): its entry point, which is what those tests
exercise, exists only in an installed distribution's metadata.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PLUGIN_TESTS = REPO / "plugins" / "snapshotkit-sqlite" / "tests"


@pytest.mark.slow
def test_sqlite_example_plugin_passes_its_tests(tmp_path: Path) -> None:
    if importlib.util.find_spec("snapshotkit_sqlite") is None:
        pytest.skip("the example plugin is not installed: pip install -e plugins/snapshotkit-sqlite")
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    proc = subprocess.run(
        # --basetemp: its tmp_path trees go in ours, which our pytest removes (pytest's default keeps them).
        [
            sys.executable,
            "-m",
            "pytest",
            str(PLUGIN_TESTS),
            "-q",
            "-p",
            "no:cacheprovider",
            "--basetemp",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=240,
        env=env,
        cwd=REPO,
    )
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output
    # Every test ran and passed: nothing skipped, nothing collected from somewhere else.
    summary = re.search(r"^(\d+) passed in [\d.]+s", proc.stdout, re.MULTILINE)
    assert summary is not None, output
    assert int(summary.group(1)) >= 40, output
