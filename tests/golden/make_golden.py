"""Build the golden snapshot of today's format version: ``python tests/golden/make_golden.py``.

It writes ``tests/golden/v<FORMAT_VERSION>/basic``. The snapshots there (``v1/basic``, written
by the snapshotkit of format version 1, and ``v3/basic``) are committed and must keep loading
with every later snapshotkit (``tests/format/test_golden_basic.py`` checks them value by value).
Write a new one when the format version changes; never regenerate an existing one to make a
failing golden test pass.

Every value is built without a random generator and with exactly representable numbers, so the
same objects come out bit for bit on any machine and torch version (the optimizer step works on
multiples of 1/8 with lr 0.5, which float32 computes without rounding).
"""

from __future__ import annotations

import math
import os
import shutil
import sys
import warnings
from collections import OrderedDict
from pathlib import Path
from typing import Any

import torch

GOLDEN_ROOT = Path(__file__).resolve().parent

#: Small chunks and data objects so the golden snapshot has multi-piece tensors and several data objects.
GOLDEN_ENV = {"SNAPSHOTKIT_CHUNK_BYTES": "2048", "SNAPSHOTKIT_DATA_OBJECT_BYTES": "4096"}


class TinyNet(torch.nn.Module):
    """A linear layer, a batch norm (with an int64 buffer) and a plain registered buffer."""

    def __init__(self) -> None:
        super().__init__()
        self.layer1 = torch.nn.Linear(4, 3)
        self.norm = torch.nn.BatchNorm1d(3)
        self.register_buffer("scale", torch.zeros(2, 2))


def _dyadic(shape: tuple[int, ...], offset: int = 0) -> torch.Tensor:
    """float32 multiples of 1/8 in [-2, 2): exact under the additions the optimizer step does."""
    count = math.prod(shape)
    values = (torch.arange(count, dtype=torch.int64) * 5 + offset) % 32 - 16
    return (values.to(torch.float32) / 8).reshape(shape)


def build_model() -> TinyNet:
    """The model as saved: deterministic parameters and buffers, before the optimizer step."""
    model = TinyNet()
    with torch.no_grad():
        for index, (_, tensor) in enumerate(sorted(model.state_dict().items())):
            if tensor.is_floating_point():
                tensor.copy_(_dyadic(tuple(tensor.shape), offset=index))
        model.norm.num_batches_tracked.fill_(7)
    return model


def build_optimizer(model: torch.nn.Module) -> torch.optim.Optimizer:
    """SGD with momentum, after one step on fixed gradients (momentum buffers exist)."""
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5, momentum=0.5)
    for index, parameter in enumerate(model.parameters()):
        parameter.grad = _dyadic(tuple(parameter.shape), offset=11 + index)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return optimizer


def build_extras() -> dict[str, Any]:
    """Loose state: every primitive kind, containers, and tensors of many dtypes and layouts."""
    base = torch.arange(24, dtype=torch.float32).reshape(4, 6) / 4
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # quantized tensor creation is deprecated, still stored
        quantized = torch.quantize_per_tensor(
            torch.tensor([-1.0, 0.0, 0.5, 1.0, 2.5]), scale=0.5, zero_point=10, dtype=torch.quint8
        )
    return {
        "step": 1234,
        "big_int": 2**53 + 1,
        "negative_int": -7,
        "lr": 0.1,
        "third": 1 / 3,
        "pos_inf": math.inf,
        "neg_inf": -math.inf,
        "nan": math.nan,
        "neg_zero": -0.0,
        "name": 'golden run ✓ "quoted"\nsecond line',
        "empty_str": "",
        "flag": True,
        "off": False,
        "blob": b"\x00\xffsnapshot\x7f",
        "nothing": None,
        "pair": (1, "two", 3.5),
        "items": [1, [2, 3], {"k": "v"}, None],
        "by_int": {1: "one", 2: {3: 4.5, 40: [True]}},
        "ordered": OrderedDict([("zeta", 1), ("alpha", 2), ("mid", (3,))]),
        "empty_list": [],
        "empty_dict": {},
        # Leaves stored as torch.save objects that weights_only=True loading accepts.
        "objects": {
            "complex": 1.5 - 2j,
            "size": torch.Size([2, 3]),
            "dtype": torch.float16,
            "device": torch.device("cpu"),
            "tuple_keys": {(1, 2): "a", (3,): "b"},
            "set": {3, 1, 2},
            "bytearray": bytearray(b"\x01\x02"),
        },
        "tensors": {
            "float32": torch.arange(600, dtype=torch.float32) / 256 - 1,  # 2400 bytes: two pieces
            "bfloat16": torch.tensor([1.5, -2.25, 3.0e38, -0.0, 1e-20], dtype=torch.bfloat16),
            "float16": torch.tensor([[0.5, 65504.0], [-6.1e-5, math.inf]], dtype=torch.float16),
            "int8": torch.tensor([-128, -1, 0, 1, 127], dtype=torch.int8),
            "uint16": torch.tensor([0, 1, 65535, 1234], dtype=torch.uint16),
            "bool": torch.tensor([[True, False, True], [False, False, True]]),
            "complex64": torch.tensor([1 + 2j, -0.5j, 3.25 + 0j], dtype=torch.complex64),
            "float8_e4m3fn": torch.tensor([0.5, -1.75, 448.0, 0.0, -0.015625]).to(torch.float8_e4m3fn),
            "float32_special": torch.tensor([math.nan, -0.0, math.inf, -math.inf, 1e-45], dtype=torch.float32),
            "scalar": torch.tensor(3.5, dtype=torch.float64),
            "empty": torch.zeros(0, 3, dtype=torch.float32),
            "transposed": base.t(),  # non-contiguous view
            "strided": base[1:, ::2],  # non-contiguous view with an offset
            "quantized": quantized,
        },
    }


def build_app_state() -> dict[str, Any]:
    """The app_state the golden snapshot was taken from (fresh objects on every call)."""
    from snapshotkit import StateDict

    model = build_model()
    optimizer = build_optimizer(model)
    return {"model": model, "optim": optimizer, "extras": StateDict(build_extras())}


def main() -> None:
    sys.path.insert(0, str(GOLDEN_ROOT.parent.parent))
    from snapshotkit import Snapshot
    from snapshotkit.manifest import FORMAT_VERSION

    basic = GOLDEN_ROOT / f"v{FORMAT_VERSION}" / "basic"
    os.environ.update(GOLDEN_ENV)
    if basic.exists():
        shutil.rmtree(basic)
    basic.parent.mkdir(parents=True, exist_ok=True)
    Snapshot.take(str(basic), build_app_state())
    files = sorted(p for p in basic.rglob("*") if p.is_file())
    total_bytes = sum(p.stat().st_size for p in files)
    for path in files:
        print(f"{path.stat().st_size:8d}  {path.relative_to(GOLDEN_ROOT)}")
    print(f"{total_bytes:8d}  total")
    if total_bytes >= 200 * 1024:
        raise SystemExit(f"the golden snapshot is {total_bytes} bytes; keep it under 200 KiB")


if __name__ == "__main__":
    main()
