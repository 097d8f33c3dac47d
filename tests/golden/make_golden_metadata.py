"""Build the golden snapshot with ``user_metadata``: ``python tests/golden/make_golden_metadata.py``.

It writes ``tests/golden/v3/user_metadata``: a tiny state taken with ``metadata=`` holding every
kind of JSON value the header member may carry (docs/format.md section 2.2.1). Committed;
``tests/format/test_golden_metadata.py`` must keep reading it value for value. Never regenerate
it to make a failing golden test pass.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path
from typing import Any

import torch

GOLDEN = Path(__file__).resolve().parent / "v3" / "user_metadata"


def build_user_metadata() -> dict[str, Any]:
    """The ``metadata=`` of the take: nesting, key order, escapes and exact numbers."""
    return {
        "step": 1234,
        "zeta_before_alpha": True,  # key order is kept, not sorted
        "alpha": False,
        "nothing": None,
        "loss": 0.1,
        "tiny": 5e-324,  # the smallest subnormal
        "huge": 1.7976931348623157e308,
        "neg_zero": -0.0,
        "exponent": 1e-300,
        "big_int": 2**64 + 1,
        "negative": -7,
        "name": 'run ✓ "quoted"\nsecond line \\ tab\t',
        "": "empty key",
        "a/b%c": "a key with a slash and a percent sign",
        "ключ": "non-ASCII key",
        "tags": ["lora", "r=8", "", "\U0001f680"],
        "nested": {"empty_object": {}, "empty_array": [], "mixed": [1, 2.5, "three", None, [True, {"deep": [[]]}]]},
    }


def build_app_state() -> dict[str, Any]:
    from snapshotkit import StateDict

    return {"progress": StateDict(step=1234, weights=torch.arange(6, dtype=torch.float32) / 4)}


def main() -> None:
    sys.path.insert(0, str(GOLDEN.parent.parent.parent.parent))
    from snapshotkit import Snapshot

    if GOLDEN.exists():
        shutil.rmtree(GOLDEN)
    GOLDEN.parent.mkdir(parents=True, exist_ok=True)
    Snapshot.take(str(GOLDEN), build_app_state(), metadata=build_user_metadata())
    for path in sorted(p for p in GOLDEN.rglob("*") if p.is_file()):
        print(f"{path.stat().st_size:8d}  {path.relative_to(GOLDEN.parent.parent)}")


if __name__ == "__main__":
    main()
