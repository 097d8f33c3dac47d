"""Build the golden snapshots of format version 4: ``python tests/golden/make_golden_v4.py``.

It writes ``tests/golden/v4/base``, a self-contained snapshot, then ``tests/golden/v4/incremental``,
taken with ``base=`` that snapshot (docs/format.md section 4.4): pieces whose bytes did not change
are references ``"../base"``, the others are written again. The state covers a tensor cut into
several pieces of which some are referenced and one is written, a tensor written whole, a tensor
under the reference threshold (written although unchanged), a replicated model, a referenced
object and primitives. Small chunks, data objects and threshold keep the files a few KiB.

Committed; ``tests/format/test_golden_v4.py`` must keep reading both value for value. The
snapshot ids and ``created_at`` are drawn at build time, so a rebuild changes them: never
regenerate these snapshots to make a failing golden test pass.

Values come from :class:`random.Random` with a fixed seed (its output for a seed is stable across
Python versions) as raw bits, so the same tensors come out on any machine and torch version.
"""

from __future__ import annotations

import os
import random
import shutil
import sys
from collections import OrderedDict
from pathlib import Path
from typing import Any

import torch

GOLDEN_ROOT = Path(__file__).resolve().parent
GOLDEN = GOLDEN_ROOT / "v4"
SEED = 20261125

#: 1 KiB pieces, 4 KiB data objects, and references from 512 bytes up.
ENV = {
    "SNAPSHOTKIT_CHUNK_BYTES": "1024",
    "SNAPSHOTKIT_DATA_OBJECT_BYTES": "4096",
    "SNAPSHOTKIT_MIN_REFERENCE_BYTES": "512",
}
#: The ``replicated=`` of both takes.
REPLICATED = ["model/*"]


def _random_tensor(rng: random.Random, count: int, dtype: torch.dtype) -> torch.Tensor:
    """``count`` elements of ``dtype`` from random bits (float dtypes: small integers, exact)."""
    if dtype.is_floating_point:
        return torch.tensor([rng.randrange(-512, 512) for _ in range(count)], dtype=torch.int64).to(dtype) / 8
    return torch.tensor([rng.randrange(-(2**15), 2**15) for _ in range(count)], dtype=dtype)


def build_base_state() -> dict[str, Any]:
    """The app_state of ``v4/base`` (fresh objects on every call)."""
    from snapshotkit import StateDict

    rng = random.Random(SEED)
    model = StateDict(
        OrderedDict(
            frozen=_random_tensor(rng, 1024, torch.float32),  # 4096 bytes: four 1 KiB pieces
            head=_random_tensor(rng, 256, torch.float32),  # 1024 bytes: one piece
            bias=_random_tensor(rng, 4, torch.float32),  # 16 bytes: under the threshold
        )
    )
    extras = StateDict(
        step=100,
        lr=0.125,
        name="golden v4 ✓",
        done=False,
        vocabulary={f"token_{index:03d}" for index in range(64)},  # an object: torch.save bytes > 512
        counts=_random_tensor(rng, 300, torch.int16),  # 600 bytes: one piece
        history=[1.5, (2, "x")],
    )
    return {"model": model, "extras": extras}


def build_incremental_state() -> dict[str, Any]:
    """The app_state of ``v4/incremental``: the base's, after a step that changed some of it."""
    state = build_base_state()
    model, extras = state["model"], state["extras"]
    model["frozen"][-4:] += 1  # only the last 1 KiB piece changes
    model["head"] += 0.5  # the whole tensor changes
    extras["step"] = 200
    extras["done"] = True
    extras["note"] = "taken with base=../base"
    return state


def main() -> None:
    sys.path.insert(0, str(GOLDEN_ROOT.parent.parent))
    from snapshotkit import Snapshot

    os.environ.update(ENV)
    if GOLDEN.exists():
        shutil.rmtree(GOLDEN)
    GOLDEN.mkdir(parents=True)
    base, incremental = GOLDEN / "base", GOLDEN / "incremental"
    Snapshot.take(str(base), build_base_state(), replicated=REPLICATED)
    Snapshot.take(str(incremental), build_incremental_state(), replicated=REPLICATED, base=str(base))
    files = sorted(p for p in GOLDEN.rglob("*") if p.is_file())
    for path in files:
        print(f"{path.stat().st_size:8d}  {path.relative_to(GOLDEN_ROOT)}")
    total_bytes = sum(p.stat().st_size for p in files)
    print(f"{total_bytes:8d}  total")
    if total_bytes >= 64 * 1024:
        raise SystemExit(f"the golden snapshots are {total_bytes} bytes; keep them under 64 KiB")


if __name__ == "__main__":
    main()
