"""Fuzzing the manifest: damaged, hostile and oversized manifests give a correct restore or a
:class:`SnapshotkitError`, never another exception, a crash, a hang or memory past the cap.

The fuzzer (``_fuzz_child.py``) runs on a manifest of format version 4 and one of version 5 (columnar
entries), each in a child process whose address space is capped at
1 GiB above its baseline, under a timeout. ``SNAPSHOTKIT_FUZZ_EXAMPLES`` (default 60 per
strategy, three strategies) and ``SNAPSHOTKIT_FUZZ_SEED`` run it longer or differently.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

CHILD = Path(__file__).parent / "_fuzz_child.py"


@pytest.mark.slow
@pytest.mark.parametrize("version", [4, 5])
def test_fuzzed_manifests_give_correct_data_or_a_snapshotkit_error(tmp_path: Path, version: int) -> None:
    examples = int(os.environ.get("SNAPSHOTKIT_FUZZ_EXAMPLES", "60"))
    seed = int(os.environ.get("SNAPSHOTKIT_FUZZ_SEED", "20261125"))
    env = {k: v for k, v in os.environ.items() if not k.startswith("SNAPSHOTKIT_")}
    env["MALLOC_ARENA_MAX"] = "2"  # per-thread malloc arenas would reserve address space
    done = subprocess.run(
        [sys.executable, str(CHILD), str(tmp_path), str(examples), str(seed), str(version)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120 + examples,
        check=False,
    )
    assert done.returncode == 0, f"the fuzzer failed (exit {done.returncode}):\n{done.stderr[-6000:]}"
    outcomes: dict[str, int] = json.loads(done.stdout.splitlines()[-1])["outcomes"]
    print(outcomes)
    assert sum(n for kind, n in outcomes.items() if kind.startswith("bytes:")) > examples // 2
    assert not any(kind.startswith("bytes:ok") for kind in outcomes)  # the child also checks each one
    assert sum(outcomes.values()) > examples
