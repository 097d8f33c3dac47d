"""The sub-byte integer dtypes (``torch.int1``..``int7``, ``uint1``..``uint7``), which torch stores one
byte an element but has no copy kernel for: a take (inline and background staging) of contiguous
and non-contiguous ones, and a restore into contiguous and non-contiguous destinations, round
trip their bytes exactly."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from snapshotkit import Snapshot, StateDict

SUB_BYTE = [
    dtype
    for sign in ("", "u")
    for bits in range(1, 8)
    if isinstance(dtype := getattr(torch, f"{sign}int{bits}", None), torch.dtype)
]


def _bytes(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.view(torch.uint8).contiguous()


@pytest.mark.parametrize("dtype", SUB_BYTE, ids=str)
@pytest.mark.parametrize("how", ["take", "async_take"])
def test_sub_byte_dtypes_round_trip(dtype: torch.dtype, how: str, tmp_path: Path) -> None:
    # found by a review: "copy_kernel" not implemented, a raw NotImplementedError from the staging
    # copy of async_take, from the take of a non-contiguous one, and from a restore into one
    raw = torch.arange(12, dtype=torch.uint8).reshape(2, 6)
    saved = {"c": raw.view(dtype), "t": raw.view(dtype).t(), "s": raw.view(dtype)[:, ::2]}
    path = str(tmp_path / "snap")
    if how == "take":
        Snapshot.take(path, {"s": StateDict(saved)})
    else:
        Snapshot.async_take(path, {"s": StateDict(saved)}).wait()
    fresh = StateDict()
    Snapshot(path).restore({"s": fresh})
    for key, value in saved.items():
        assert fresh[key].dtype == dtype and torch.equal(_bytes(fresh[key]), _bytes(value))
    destinations = {  # in place: contiguous, and non-contiguous (transposed, strided) views
        "c": torch.zeros(2, 6, dtype=torch.uint8).view(dtype),
        "t": torch.zeros(2, 6, dtype=torch.uint8).view(dtype).t(),
        "s": torch.zeros(2, 6, dtype=torch.uint8).view(dtype)[:, 1::2],
    }
    state = StateDict(destinations)
    Snapshot(path).restore({"s": state})
    for key, value in saved.items():
        assert state[key] is destinations[key] and torch.equal(_bytes(destinations[key]), _bytes(value))
    assert torch.equal(
        _bytes(Snapshot(path).read_object("s/t", torch.zeros(2, 6, dtype=torch.uint8).view(dtype).t())),
        _bytes(saved["t"]),
    )
