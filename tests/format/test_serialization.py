"""``snapshotkit._format.serialization``: tensors as raw bytes, everything else through ``torch.save``.

Every dtype round-trips bit for bit as raw bytes; quantized and sparse tensors go through
``torch.save``; objects load with ``weights_only=True`` unless the caller trusts the snapshot.
"""

from __future__ import annotations

import math
import pickle
from pathlib import Path

import pytest
import torch
from _snapshots import Opaque

from snapshotkit import Snapshot, StateDict
from snapshotkit.errors import UnsafeObjectError
from snapshotkit.manifest import TensorEntry

pytestmark = pytest.mark.usefixtures("clean_env")

ALL_DTYPES = sorted(
    {v for v in vars(torch).values() if isinstance(v, torch.dtype)},
    key=str,
)
QUANTIZED = {torch.qint8, torch.quint8, torch.qint32, torch.quint4x2, torch.quint2x4}


def _sample(dtype: torch.dtype, shape: tuple[int, ...] = (5, 3)) -> torch.Tensor:
    """Deterministic non-trivial bytes for any dtype (random bits, viewed as the dtype)."""
    itemsize = torch.empty((), dtype=dtype).element_size()
    generator = torch.Generator().manual_seed(hash(str(dtype)) % 1000)
    raw = torch.randint(0, 256, (math.prod(shape) * itemsize,), dtype=torch.uint8, generator=generator)
    if dtype == torch.bool:
        return (raw[: math.prod(shape)] % 2).bool().reshape(shape)
    return raw.view(dtype).reshape(shape)


def _bits(tensor: torch.Tensor) -> bytes:
    return tensor.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


@pytest.mark.parametrize("dtype", [d for d in ALL_DTYPES if d not in QUANTIZED], ids=str)
def test_every_dtype_round_trips_bit_exactly(tmp_path: Path, dtype: torch.dtype) -> None:
    values = {
        "t": _sample(dtype),
        "scalar": _sample(dtype, ()),
        "empty": _sample(dtype, (0, 4)),
    }
    Snapshot.take(str(tmp_path / "s"), {"sd": StateDict(values)})
    fresh = StateDict()
    Snapshot(str(tmp_path / "s")).restore({"sd": fresh})
    for key, value in values.items():
        assert fresh[key].dtype == dtype
        assert fresh[key].shape == value.shape
        assert _bits(fresh[key]) == _bits(value)
    in_place = {k: torch.empty_like(v) for k, v in values.items()}
    before = {k: v.data_ptr() for k, v in in_place.items()}
    Snapshot(str(tmp_path / "s")).restore({"sd": StateDict(in_place)})
    for key, value in values.items():
        assert _bits(in_place[key]) == _bits(value)
        if value.numel():
            assert in_place[key].data_ptr() == before[key]
    entry = Snapshot(str(tmp_path / "s")).get_manifest()["0/sd/t"]
    assert isinstance(entry, TensorEntry)
    assert entry.serializer == "raw"


def test_quantized_tensors_round_trip(tmp_path: Path) -> None:
    base = torch.linspace(-1, 1, 24).reshape(4, 6)
    values = {
        "per_tensor": torch.quantize_per_tensor(base, 0.01, 3, torch.qint8),
        "per_tensor_u": torch.quantize_per_tensor(base, 0.02, 10, torch.quint8),
        "per_channel": torch.quantize_per_channel(
            base, torch.tensor([0.1, 0.2, 0.3, 0.4]), torch.tensor([0, 1, 2, 3]), 0, torch.qint32
        ),
    }
    Snapshot.take(str(tmp_path / "s"), {"sd": StateDict(values)})
    fresh = StateDict()
    Snapshot(str(tmp_path / "s")).restore({"sd": fresh})
    for key, value in values.items():
        assert fresh[key].qscheme() == value.qscheme()
        assert torch.equal(fresh[key].int_repr(), value.int_repr())
        assert torch.equal(fresh[key].dequantize(), value.dequantize())
    assert Snapshot(str(tmp_path / "s")).get_manifest()["0/sd/per_tensor"].serializer == "torch_save"


def test_sparse_tensor_round_trips(tmp_path: Path) -> None:
    sparse = torch.sparse_coo_tensor(
        torch.tensor([[0, 2], [1, 0]]), torch.tensor([3.0, 4.0]), (3, 3), check_invariants=True
    )
    Snapshot.take(str(tmp_path / "s"), {"sd": StateDict(sp=sparse)})
    out = Snapshot(str(tmp_path / "s")).read_object("sd/sp")
    assert out.is_sparse
    assert torch.equal(out.to_dense(), sparse.to_dense())


# --------------------------------------------------------------------------------------------
# objects that only load when the caller trusts the snapshot


def test_custom_object_is_refused_by_weights_only_restore(tmp_path: Path) -> None:
    path = tmp_path / "snap"
    Snapshot.take(str(path), {"extras": StateDict(obj=Opaque(7), step=1)})

    with pytest.raises(UnsafeObjectError) as info:
        Snapshot(str(path)).restore({"extras": StateDict()})
    exc = info.value
    assert isinstance(exc, pickle.UnpicklingError)
    message = str(exc)
    assert "'extras/obj'" in message
    assert "weights_only=False" in message
    assert "trust" in message

    with pytest.raises(UnsafeObjectError):
        Snapshot(str(path)).read_object("extras/obj")


def test_custom_object_loads_with_weights_only_false(tmp_path: Path) -> None:
    path = tmp_path / "snap"
    Snapshot.take(str(path), {"extras": StateDict(obj=Opaque(7), step=1)})

    extras = StateDict()
    Snapshot(str(path)).restore({"extras": extras}, weights_only=False)
    assert isinstance(extras["obj"], Opaque)
    assert extras["obj"].value == 7
    assert extras["step"] == 1

    value = Snapshot(str(path)).read_object("extras/obj", weights_only=False)
    assert isinstance(value, Opaque)
    assert value.value == 7
