"""Describing the tensors of a take (``_take.collect``): tied tensors found by the address of
their first element, then by their full identity; the serializer and dtype of every tensor
the same as :func:`tensor_serializer` says."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from snapshotkit import Snapshot, StateDict
from snapshotkit._format.serialization import RAW, dtype_name, tensor_serializer
from snapshotkit._plan.leaves import TensorLeaf
from snapshotkit._take.collect import describe_state


def _tensor_leaves(state: dict[str, object]) -> dict[str, TensorLeaf]:
    local = describe_state({"m": state})
    leaves = {path.removeprefix("m/"): leaf for path, leaf in local.leaves.items()}
    assert all(isinstance(leaf, TensorLeaf) for leaf in leaves.values())
    return leaves  # type: ignore[return-value]


def test_tied_tensors_share_one_payload_and_views_of_one_buffer_do_not() -> None:
    flat = torch.arange(24.0)
    weight = torch.nn.Parameter(torch.ones(2, 3))
    state = {
        "a": flat[:6],  # the same first element as "whole", "square": another shape, not tied
        "whole": flat,
        "square": flat[:6].view(2, 3),
        "b": flat[6:12],  # the same storage, other elements
        "a_again": flat[:6],  # another view object of the elements of "a": tied
        "w": weight,
        "w_tied": weight,  # the same object under a second key
        "empty": flat[:0],
        "empty_too": flat[:0],  # empty tensors are tied to nothing
    }
    leaves = _tensor_leaves(state)
    assert leaves["a_again"].alias_of == "m/a" and leaves["a_again"].payload == leaves["a"].payload
    assert leaves["w_tied"].alias_of == "m/w" and leaves["w_tied"].payload == leaves["w"].payload
    distinct = ["a", "whole", "square", "b", "w", "empty", "empty_too"]
    assert all(leaves[key].alias_of is None for key in distinct)
    assert len({leaves[key].payload for key in distinct}) == len(distinct)


def test_tied_after_a_collision_at_the_same_address_are_found_in_any_order() -> None:
    base = torch.arange(12.0)
    state = {"k0": base.view(3, 4), "k1": base, "k2": base.view(3, 4), "k3": base, "k4": base[:4]}
    leaves = _tensor_leaves(state)
    assert leaves["k2"].alias_of == "m/k0" and leaves["k3"].alias_of == "m/k1"
    assert leaves["k0"].alias_of is leaves["k1"].alias_of is leaves["k4"].alias_of is None


@pytest.mark.parametrize("take", ["take", "async_take"])
@pytest.mark.parametrize("lazy", ["neg", "conj", "neg-first"])
def test_a_lazy_neg_or_conj_view_of_a_tensor_is_not_tied_to_it(take: str, lazy: str, tmp_path: Path) -> None:
    # found by a review: it has the same storage, offset, shape and strides, so it was stored as an
    # alias of the tensor, and restored (and read_object) with the tensor's values, not its own
    z = torch.tensor([1 + 2j, 3 - 4j])
    t = torch.tensor([1.0, 2.0, 3.0])
    state = {
        "neg": {"a": t, "b": t._neg_view()},
        "conj": {"a": z, "b": z.conj()},
        "neg-first": {"a": t._neg_view(), "b": t},
    }[lazy]
    assert all(leaf.alias_of is None for leaf in _tensor_leaves(state).values())
    if take == "take":
        Snapshot.take(str(tmp_path / "snap"), {"m": StateDict(state)})
    else:
        Snapshot.async_take(str(tmp_path / "snap"), {"m": StateDict(state)}).wait()
    restored = StateDict()
    Snapshot(str(tmp_path / "snap")).restore({"m": restored})
    for key, value in state.items():
        assert torch.equal(restored[key].resolve_conj().resolve_neg(), value.resolve_conj().resolve_neg())
        read = Snapshot(str(tmp_path / "snap")).read_object(f"m/{key}")
        assert torch.equal(read.resolve_conj().resolve_neg(), value.resolve_conj().resolve_neg())


@pytest.mark.parametrize(
    "tensor",
    [
        torch.arange(6, dtype=torch.float16),
        torch.arange(6.0).t(),
        torch.arange(6.0).view(2, 3).t(),  # not contiguous: still raw, staged by a copy
        torch.randn(3, dtype=torch.complex64).conj(),
        torch.quantize_per_tensor(torch.rand(4), 0.1, 0, torch.quint8),
        torch.eye(3).to_sparse(),
        torch.nn.Parameter(torch.ones(2), requires_grad=False),
        torch.tensor([True, False]),
    ],
    ids=["float16", "1d-t", "transposed", "conj", "quantized", "sparse", "parameter", "bool"],
)
def test_serializer_and_dtype_are_what_tensor_serializer_says(tensor: torch.Tensor) -> None:
    leaf = _tensor_leaves({"t": tensor})["t"]
    assert (leaf.serializer, leaf.dtype, leaf.shape) == (
        tensor_serializer(tensor),
        dtype_name(tensor.dtype),
        tuple(tensor.shape),
    )


def test_views_of_one_buffer_and_tied_tensors_restore_bit_exact(tmp_path: Path) -> None:
    flat = torch.randn(32)
    state = {"a": flat[:8], "b": flat[8:16].view(2, 4), "a_again": flat[:8], "whole": flat}
    assert _tensor_leaves(state)["a"].serializer == RAW
    Snapshot.take(str(tmp_path / "snap"), {"m": StateDict(state)})
    restored = StateDict({key: torch.zeros_like(value) for key, value in state.items()})
    Snapshot(str(tmp_path / "snap")).restore({"m": restored})
    assert all(torch.equal(restored[key], value) for key, value in state.items())


def test_a_payload_knows_the_address_of_memory_written_as_it_is_and_only_of_that() -> None:
    contiguous, strided = torch.arange(6.0), torch.arange(6.0).reshape(2, 3).t()
    negated = torch.ones(3, dtype=torch.complex64).conj().imag  # a lazy neg view
    assert negated.is_neg()
    local = describe_state({"m": {"c": contiguous, "s": strided, "n": negated, "e": torch.empty(0)}})
    payloads = {path: local.payloads[leaf.payload] for path, leaf in local.leaves.items()}  # type: ignore[union-attr]
    assert payloads["m/c"].address == contiguous.data_ptr() and payloads["m/c"].zero_copy
    assert payloads["m/s"].address == 0 and not payloads["m/s"].zero_copy  # staged by a copy
    assert payloads["m/n"].address == 0 and not payloads["m/n"].zero_copy
    assert payloads["m/e"].address == 0  # no bytes to write


def test_views_that_cannot_be_written_as_they_are_are_stored_by_value(tmp_path: Path) -> None:
    negated = torch.tensor([1 + 2j, 3 - 4j], dtype=torch.complex64).conj().imag
    state = {"n": negated, "s": torch.arange(6.0).reshape(2, 3).t(), "c": torch.arange(4.0)}
    Snapshot.take(str(tmp_path / "s"), {"m": StateDict(state)})
    out = {key: torch.zeros_like(value).contiguous() for key, value in state.items()}
    Snapshot(str(tmp_path / "s")).restore({"m": StateDict(out)})
    for key, value in state.items():
        assert torch.equal(out[key], value.resolve_neg().resolve_conj()), key
