"""Property: random chains of incremental takes restore, each to its own state, whatever the chain.

Every example builds a state (tensors of several dtypes and sizes, some below the minimum
reference size, an optimizer-like nested dict, primitives), then runs a few steps: each applies a
random set of mutations (in-place add to a slice, wholesale replacement, resize, adding and
removing keys, or nothing) and takes a snapshot against a random earlier one (or none), all in one
folder. At the end every snapshot restores and reads bit-exact against the deep copy kept when it
was taken, and each piece was referenced exactly when its bytes are a piece of the base.
"""

from __future__ import annotations

import copy
import shutil
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from snapshotkit import Snapshot, StateDict
from snapshotkit.verify import verify_snapshot

from ._incremental import MIN_REFERENCE_BYTES, SMALL_PIECES, assert_bit_exact, chunks, pieces, zeros_like_state

SETTINGS = settings(
    max_examples=25,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
DTYPES = [torch.float32, torch.float64, torch.bfloat16, torch.int64, torch.int16, torch.uint8, torch.bool]


def values(numel: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    drawn = torch.randint(-1000, 1000, (numel,), generator=generator)
    return (drawn % 2 == 0) if dtype == torch.bool else drawn.to(dtype)


def initial_state() -> dict[str, Any]:
    return {
        "big_f32": values(24 * 1024, torch.float32, 1),  # 96 KiB: six full pieces
        "f64": values(5000, torch.float64, 2),  # two full pieces and a short one (below the minimum)
        "bf16": values(3000, torch.bfloat16, 3),  # one piece below the minimum: always written
        "i64": values(4096, torch.int64, 4),
        "flags": values(64, torch.bool, 5),
        "optim": {
            "state": {0: {"exp_avg": values(8192, torch.float32, 6), "step": torch.tensor(3.0)}},
            "param_groups": [{"lr": 0.1, "params": [0]}],
        },
        "step": 0,
        "name": "run",
    }


def tensor_slots(state: dict[str, Any]) -> list[tuple[Any, Any]]:
    """(container, key) of every tensor a mutation may touch."""
    slots: list[tuple[Any, Any]] = [(state, k) for k in sorted(state) if isinstance(state[k], torch.Tensor)]
    return [*slots, (state["optim"]["state"][0], "exp_avg")]


def mutate(state: dict[str, Any], data: st.DataObject, step: int) -> None:
    kinds = data.draw(st.lists(st.sampled_from(["add", "replace", "resize", "add_key", "remove_key", "nothing"])))
    for index, kind in enumerate(kinds):
        seed = step * 1000 + index
        slots = tensor_slots(state)
        holder, key = data.draw(st.sampled_from(slots))
        tensor = holder[key]
        if kind == "add" and tensor.numel() > 0 and tensor.dtype != torch.bool:
            start = data.draw(st.integers(0, tensor.numel() - 1))
            length = data.draw(st.integers(1, 64))
            tensor[start : start + length] += 1  # in place: the tensor object is the same
        elif kind == "replace":
            holder[key] = values(tensor.numel(), tensor.dtype, seed)
        elif kind == "resize":
            holder[key] = values(data.draw(st.integers(0, 12_000)), tensor.dtype, seed)
        elif kind == "add_key":
            dtype = data.draw(st.sampled_from(DTYPES))
            state[f"new_{step}_{index}"] = values(data.draw(st.integers(0, 12_000)), dtype, seed)
        elif kind == "remove_key" and holder is state and len(slots) > 2:
            del state[key]
    if data.draw(st.booleans()):
        state["step"] += 1
        state["optim"]["param_groups"][0]["lr"] /= 2


def leaves(state: Any, prefix: str) -> dict[str, torch.Tensor]:
    """Logical path -> tensor, for every tensor in ``state``."""
    if isinstance(state, torch.Tensor):
        return {prefix: state}
    if isinstance(state, dict):
        return {k: v for key, value in state.items() for k, v in leaves(value, f"{prefix}/{key}").items()}
    if isinstance(state, list):
        return {k: v for i, value in enumerate(state) for k, v in leaves(value, f"{prefix}/{i}").items()}
    return {}


def check_references(folder: str, names: list[str], expected: list[dict[str, Any]], i: int, base: int | None) -> None:
    """Each piece of snapshot ``i`` references a base exactly when its bytes (and it is large
    enough) are a piece of its base; references name the snapshot that holds the bytes."""
    snapshot = Snapshot(f"{folder}/{names[i]}")
    if base is None:
        assert snapshot.metadata.bases == {}
        reusable: set[bytes] = set()
    else:
        reusable = {c for t in leaves(expected[base], "s").values() for c in chunks(t)}
        allowed = {f"../{names[base]}", *Snapshot(f"{folder}/{names[base]}").metadata.bases}
        assert set(snapshot.metadata.bases) <= allowed
    for logical_path, tensor in leaves(expected[i], "s").items():
        stored = pieces(snapshot, logical_path)
        expected_chunks = chunks(tensor)
        assert len(stored) == len(expected_chunks), logical_path
        for piece, chunk in zip(stored, expected_chunks, strict=True):
            should = len(chunk) >= MIN_REFERENCE_BYTES and chunk in reusable
            assert (piece.base is not None) == should, (names[i], logical_path, piece, base)
            if piece.base is not None:
                holder = names.index(piece.base.removeprefix("../"))
                assert chunk in {c for t in leaves(expected[holder], "s").values() for c in chunks(t)}


@pytest.mark.slow
@SETTINGS
@given(data=st.data())
def test_random_chains_restore_each_snapshot_bit_exact(
    data: st.DataObject, tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in SMALL_PIECES.items():
        monkeypatch.setenv(name, value)
    folder = tmp_path_factory.mktemp("chain")
    try:
        state = initial_state()
        names: list[str] = []
        expected: list[dict[str, Any]] = []
        bases: list[int | None] = []
        for step in range(data.draw(st.integers(1, 5), label="steps")):
            if step:
                mutate(state, data, step)
            base = data.draw(st.none() | st.integers(0, step - 1), label="base") if step else None
            names.append(f"step_{step}")
            Snapshot.take(
                str(folder / names[-1]),
                {"s": StateDict(state)},
                base=None if base is None else str(folder / names[base]),
            )
            expected.append(copy.deepcopy(state))
            bases.append(base)
        for i, name in enumerate(names):
            check_references(str(folder), names, expected, i, bases[i])
            snapshot = Snapshot(str(folder / name))
            target = {"s": StateDict(zeros_like_state(expected[i]))}
            snapshot.restore(target)
            assert_bit_exact(dict(target["s"]), expected[i], name)
            assert_bit_exact(snapshot.read_object("s"), expected[i], name)
            assert verify_snapshot(str(folder / name)).ok
    finally:
        shutil.rmtree(folder)
