"""Helpers of the incremental-take tests: bit-exact comparison, the pieces a snapshot references,
and what the pieces of a 1-D tensor are (the oracle for which pieces a take may reuse)."""

from __future__ import annotations

import copy
from typing import Any

import torch

from snapshotkit import Snapshot
from snapshotkit._format.entries import pieces_of
from snapshotkit._format.pieces import Piece

#: Small sizes, so that tensors of a few dozen KiB are several pieces, most of them referencable.
CHUNK_BYTES = 16 * 1024
MIN_REFERENCE_BYTES = 8 * 1024
SMALL_PIECES = {
    "SNAPSHOTKIT_CHUNK_BYTES": str(CHUNK_BYTES),
    "SNAPSHOTKIT_MIN_REFERENCE_BYTES": str(MIN_REFERENCE_BYTES),
}


def raw_bytes(tensor: torch.Tensor) -> bytes:
    """The bytes of a tensor's elements, in order (any dtype, NaN payloads included)."""
    return bytes(tensor.detach().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())


def assert_bit_exact(actual: Any, expected: Any, where: str = "") -> None:
    """``actual`` equals ``expected`` structurally, every tensor in dtype, shape and bytes."""
    if isinstance(expected, torch.Tensor):
        assert isinstance(actual, torch.Tensor), f"{where}: {type(actual).__name__}, not a tensor"
        assert (actual.dtype, tuple(actual.shape)) == (expected.dtype, tuple(expected.shape)), where
        assert raw_bytes(actual) == raw_bytes(expected), f"{where}: the bytes differ"
    elif isinstance(expected, dict):
        assert isinstance(actual, dict), f"{where}: {type(actual).__name__}, not a dict"
        assert sorted(map(str, actual)) == sorted(map(str, expected)), where
        for key, value in expected.items():
            assert_bit_exact(actual[key], value, f"{where}/{key}")
    elif isinstance(expected, (list, tuple)):
        assert type(actual) is type(expected) and len(actual) == len(expected), where
        for index, (a, e) in enumerate(zip(actual, expected, strict=True)):
            assert_bit_exact(a, e, f"{where}/{index}")
    else:
        assert type(actual) is type(expected) and actual == expected, f"{where}: {actual!r} != {expected!r}"


def zeros_like_state(state: Any) -> Any:
    """A copy of ``state`` with every tensor zeroed (a restore target of the same structure)."""
    blank = copy.deepcopy(state)

    def zero(value: Any) -> None:
        if isinstance(value, torch.Tensor):
            value.zero_() if value.dtype != torch.bool else value.fill_(False)
        elif isinstance(value, dict):
            for item in value.values():
                zero(item)
        elif isinstance(value, list):
            for item in value:
                zero(item)

    zero(blank)
    return blank


def pieces(snapshot: Snapshot | str, logical_path: str, rank: int = 0) -> tuple[Piece, ...]:
    """The pieces of ``logical_path`` in the manifest (rank ``rank``'s entry)."""
    opened = Snapshot(snapshot) if isinstance(snapshot, str) else snapshot
    return pieces_of(opened.get_manifest()[f"{rank}/{logical_path}"])


def referenced(snapshot: Snapshot | str, logical_path: str, rank: int = 0) -> list[str | None]:
    """Per piece of ``logical_path``: the base it references, or None for a piece written here."""
    return [piece.base for piece in pieces(snapshot, logical_path, rank)]


def chunks(tensor: torch.Tensor, chunk_bytes: int = CHUNK_BYTES) -> list[bytes]:
    """The bytes of each piece a take makes of a 1-D tensor (the plan splits the payload on element
    boundaries; with power-of-two item sizes every full piece is ``chunk_bytes`` long)."""
    data = raw_bytes(tensor)
    return [data[i : i + chunk_bytes] for i in range(0, len(data), chunk_bytes)]
