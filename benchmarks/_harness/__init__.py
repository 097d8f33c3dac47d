"""The harness every benchmark script shares.

* :mod:`.cli`: size units and parsing, the argparse preamble, output paths, scratch directories;
* :mod:`.launch`: :class:`~.launch.Launcher`, one measured run (or a group of ranks) in fresh processes;
* :mod:`.measure`: :class:`~.measure.Measure` (wall time plus opt-in peak RSS, I/O and CPU counters),
  cache dropping, medians and the run summary;
* :mod:`.report`: machine facts, number formatting, the report skeleton and its writer (JSON + text).

Only the standard library is imported at module level, so a launcher stays light; ``torch`` and
``psutil`` are imported where they are used.
"""

import sys
from pathlib import Path

# The scripts import snapshotkit lazily; from a checkout that is not installed, it must still be
# the checkout's snapshotkit they measure.
_REPO_ROOT = Path(__file__).resolve().parents[2]
if (_REPO_ROOT / "snapshotkit").is_dir() and str(_REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(_REPO_ROOT))
