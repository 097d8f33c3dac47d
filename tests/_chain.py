"""An incremental chain for the tests of tools that read one: ``step_1`` full, ``step_2`` based on it,
``step_3`` based on ``step_2`` and so referencing both (references never chain).

Tensors are larger than ``Config.min_reference_bytes`` (64 KiB), so unchanged ones are referenced.
"""

from __future__ import annotations

import collections
from typing import Any

import torch

from snapshotkit import Snapshot, StateDict

#: step_3's ``metadata=``. It holds tensors (``a`` referenced in step_2; ``b``, the torch_save ``q``
#: and the object ``bag`` in step_1; ``c`` its own), primitives, a list and an ordered dict.
USER_METADATA = {"run": "chain", "lr": 0.5}


def chain_state() -> dict[str, Any]:
    return {
        "m": StateDict(
            a=torch.arange(20_000, dtype=torch.float32),
            b=torch.ones(30_000, dtype=torch.float64),
            c=torch.zeros(20_000, dtype=torch.int32),
            step=1,
            obj=collections.OrderedDict(x=torch.ones(2), name="w"),
            things=[1, "two", torch.full((3,), 3.0)],
            bag=set(range(20_000)),
            q=torch.quantize_per_tensor(torch.arange(20_000, dtype=torch.float32), 0.5, 0, torch.qint32),
        ),
        "tag": StateDict(text="chain", nothing=None),
    }


def take_chain(run: str, storage_options: dict[str, Any] | None = None) -> dict[str, Any]:
    """Take step_1, step_2, step_3 under ``run`` (a directory or URI); returns step_3's state (what a
    restore must give)."""
    state = chain_state()
    Snapshot.take(f"{run}/step_1", state, storage_options=storage_options)
    state["m"]["a"] = state["m"]["a"] + 1
    state["m"]["step"] = 2
    Snapshot.take(f"{run}/step_2", state, base=f"{run}/step_1", storage_options=storage_options)
    state["m"]["c"] = state["m"]["c"] + 5
    state["m"]["step"] = 3
    Snapshot.take(f"{run}/step_3", state, base=f"{run}/step_2", storage_options=storage_options, metadata=USER_METADATA)
    return state


def empty_like(state: dict[str, Any]) -> dict[str, Any]:
    """An app state to restore ``state``'s keys into (every value replaced)."""
    return {name: StateDict(dict.fromkeys(value)) for name, value in state.items()}


def assert_same(actual: Any, expected: Any, where: str = "") -> None:
    """Bit-exact equality of nested state (tensors by dtype, shape and bytes)."""
    if isinstance(expected, torch.Tensor):
        assert isinstance(actual, torch.Tensor), where
        assert actual.dtype == expected.dtype and actual.shape == expected.shape, where
        if expected.is_quantized:
            actual, expected = actual.int_repr(), expected.int_repr()
        assert torch.equal(actual.view(torch.uint8), expected.view(torch.uint8)), where
    elif isinstance(expected, dict):
        assert type(actual) is type(expected) and list(actual) == list(expected), where
        for key in expected:
            assert_same(actual[key], expected[key], f"{where}/{key}")
    elif isinstance(expected, (list, tuple)):
        assert type(actual) is type(expected) and len(actual) == len(expected), where
        for index, (a, e) in enumerate(zip(actual, expected)):
            assert_same(a, e, f"{where}/{index}")
    else:
        assert actual == expected, where
