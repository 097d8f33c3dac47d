"""The harness every benchmark script shares.

* :mod:`.cli`: size units and parsing, the argparse preamble, output paths, scratch directories;
* :mod:`.launch`: :class:`~.launch.Launcher`, one measured run (or a group of ranks) in fresh processes;
* :mod:`.measure`: :class:`~.measure.Measure` (wall time plus opt-in peak RSS, I/O and CPU counters),
  cache dropping, medians and the run summary;
* :mod:`.report`: machine facts, number formatting, tables, the report skeleton and its writer (JSON + text);
* :mod:`.workloads`: the deterministic states (tensor specs, materialise / verify) and the raw-disk
  baselines.

The scripts put ``benchmarks/`` on ``sys.path`` and import this as the top-level ``_harness``, so
they run as ``python benchmarks/bench_x.py`` from anywhere without the checkout being installed.

Only the standard library is imported at module level, so a launcher stays light; ``torch`` and
``psutil`` are imported where they are used.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

#: A run's record, a summary, a report: JSON-shaped dicts throughout.
Record = dict[str, Any]

# The scripts import snapshotkit lazily; from a checkout that is not installed, it must still be
# the checkout's snapshotkit they measure -- unless PYTHONPATH names a snapshotkit checkout: that
# one is measured (bench_small_entries --compare-with runs its children so).
REPO_ROOT = Path(__file__).resolve().parents[2]
_CHOSEN = any((Path(p) / "snapshotkit").is_dir() for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p)
if (REPO_ROOT / "snapshotkit").is_dir() and str(REPO_ROOT) not in sys.path and not _CHOSEN:
    sys.path.insert(0, str(REPO_ROOT))
