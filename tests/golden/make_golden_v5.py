"""Build the golden snapshots of format version 5: ``python tests/golden/make_golden_v5.py``.

The same two takes as ``make_golden_v4.py`` (same state, settings and ``replicated=``), written by
a snapshotkit that writes version 5 (columnar entries, docs/format.md section 11):
``tests/golden/v5/base``, self-contained, and ``tests/golden/v5/incremental``, taken with ``base=``
it, whose columns hold references (a ``bases`` table and a ``base`` column).

Committed; ``tests/format/test_golden_v5.py`` must keep reading both value for value. Never
regenerate them to make a failing golden test pass.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
from pathlib import Path

GOLDEN_ROOT = Path(__file__).resolve().parent
GOLDEN = GOLDEN_ROOT / "v5"


def _v4_builder() -> object:
    spec = importlib.util.spec_from_file_location("make_golden_v4", GOLDEN_ROOT / "make_golden_v4.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main() -> None:
    sys.path.insert(0, str(GOLDEN_ROOT.parent.parent))
    from snapshotkit import Snapshot
    from snapshotkit.manifest import FORMAT_VERSION

    if FORMAT_VERSION != 5:
        raise SystemExit(f"this snapshotkit writes format version {FORMAT_VERSION}, not 5")
    v4: object = _v4_builder()
    os.environ.update(v4.ENV)  # type: ignore[attr-defined]
    if GOLDEN.exists():
        shutil.rmtree(GOLDEN)
    GOLDEN.mkdir(parents=True)
    base, incremental = GOLDEN / "base", GOLDEN / "incremental"
    replicated = v4.REPLICATED  # type: ignore[attr-defined]
    Snapshot.take(str(base), v4.build_base_state(), replicated=replicated)  # type: ignore[attr-defined]
    state = v4.build_incremental_state()  # type: ignore[attr-defined]
    Snapshot.take(str(incremental), state, replicated=replicated, base=str(base))
    files = sorted(p for p in GOLDEN.rglob("*") if p.is_file())
    for path in files:
        print(f"{path.stat().st_size:8d}  {path.relative_to(GOLDEN_ROOT)}")
    total_bytes = sum(p.stat().st_size for p in files)
    print(f"{total_bytes:8d}  total")
    if total_bytes >= 64 * 1024:
        raise SystemExit(f"the golden snapshots are {total_bytes} bytes; keep them under 64 KiB")


if __name__ == "__main__":
    main()
