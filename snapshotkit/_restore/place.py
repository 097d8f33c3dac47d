"""Place: from manifest entries to values, choosing destinations (in place where possible) and the piece reads that fill them."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from snapshotkit._format.entries import Entry, ObjectEntry, Piece, PrimitiveEntry, ShardedTensorEntry, TensorEntry
from snapshotkit._format.serialization import (
    RAW,
    byte_view,
    copy_flat_range_in,
    deserialize_object,
    dtype_from_name,
    is_zero_copy_source,
    tensor_from_bytes,
)
from snapshotkit._format.sharded import Box, box_slice, destination_boxes, overlap, piece_boxes
from snapshotkit._restore.fetch import PieceRead
from snapshotkit.errors import ManifestError, StateMismatchError


def tensor_matches(entry: TensorEntry, value: object) -> bool:
    """Whether ``value`` can receive ``entry`` in place (a tensor of the same dtype and shape)."""
    return (
        isinstance(value, torch.Tensor)
        and not value.is_quantized
        and value.layout == torch.strided
        and str(value.dtype).removeprefix("torch.") == entry.dtype
        and tuple(value.shape) == entry.shape
    )


def describe_mismatch(logical_path: str, entry: TensorEntry, value: torch.Tensor) -> StateMismatchError:
    return StateMismatchError(
        f"cannot restore {logical_path!r} in place: the snapshot has dtype {entry.dtype} shape {list(entry.shape)}, "
        f"the destination has dtype {str(value.dtype).removeprefix('torch.')} shape {list(value.shape)}. "
        "Build the destination with the saved shape/dtype, or pass strict=False to load a new tensor "
        "and let load_state_dict() convert it"
    )


class _Slot:
    """Holds a value that becomes known once the reads have run."""

    __slots__ = ("value",)

    def __init__(self, value: Any = None) -> None:
        self.value = value


class LeafLoader:
    """Collects the piece reads for many leaves; the thunks :meth:`add` returns give the values once they ran."""

    def __init__(self, *, weights_only: bool) -> None:
        self.weights_only = weights_only
        self.reads: list[PieceRead] = []
        # Keys start with where the entry's first piece lives: entries that share it share all
        # their pieces (tied weights), since a take never overlaps the pieces of two payloads.
        self._fresh: dict[tuple[Any, ...], _Slot] = {}
        self._in_place: set[tuple[Any, ...]] = set()

    def add(self, logical_path: str, entry: Entry, destination: Any = None) -> Callable[[], Any]:
        """Plan loading ``entry``; ``destination`` is used in place when it matches.

        Returns a thunk that gives the loaded value once :attr:`reads` have been fetched.
        """
        if isinstance(entry, PrimitiveEntry):
            value = entry.value
            return lambda: value
        if isinstance(entry, ObjectEntry):
            slot = _Slot()
            self._add_blob(logical_path, entry.piece, lambda obj: setattr(slot, "value", obj))
            return lambda: slot.value
        if isinstance(entry, TensorEntry):
            return self._add_tensor(logical_path, entry, destination)
        if isinstance(entry, ShardedTensorEntry):
            return self._add_sharded(logical_path, entry, destination)
        raise ManifestError(f"{logical_path!r} is a {entry.kind}, not a leaf")

    def _add_blob(self, logical_path: str, piece: Piece, sink: Callable[[Any], None]) -> None:
        weights_only = self.weights_only

        def consume(offset: int, data: memoryview) -> None:
            sink(deserialize_object(data, weights_only=weights_only, logical_path=logical_path))

        self.reads.append(PieceRead(piece, logical_path, consume=consume))

    def _add_tensor(self, logical_path: str, entry: TensorEntry, destination: Any) -> Callable[[], Any]:
        in_place = tensor_matches(entry, destination)
        if entry.serializer != RAW:
            slot = _Slot()

            def receive(loaded: Any) -> None:
                if not isinstance(loaded, torch.Tensor):
                    raise ManifestError(f"{logical_path!r} is recorded as a tensor but holds a {type(loaded).__name__}")
                if in_place:
                    destination.detach().copy_(loaded)
                    slot.value = destination
                else:
                    slot.value = loaded

            self._add_blob(logical_path, entry.pieces[0], receive)
            return lambda: slot.value

        dtype = dtype_from_name(entry.dtype)
        itemsize = dtype.itemsize
        if entry.nbytes != entry.numel * itemsize:
            raise ManifestError(
                f"{logical_path!r}: pieces hold {entry.nbytes} bytes but dtype {entry.dtype} shape "
                f"{list(entry.shape)} needs {entry.numel * itemsize}"
            )
        first = (entry.pieces[0].location, entry.pieces[0].byte_range) if entry.pieces else None
        if in_place:
            target: torch.Tensor = destination.detach()
            key = (first, target.data_ptr(), target.shape, target.stride(), target.device)
            if key in self._in_place:
                return lambda: destination
            self._in_place.add(key)
            result: Any = destination
        else:
            fresh_key = (first, entry.dtype, entry.shape)
            cached = self._fresh.get(fresh_key)
            if cached is not None and entry.pieces:
                return lambda: cached.value
            target = torch.empty(entry.shape, dtype=dtype)
            self._fresh[fresh_key] = _Slot(target)
            result = target
        self._add_raw_reads(logical_path, entry, target, itemsize)
        return lambda: result

    def _add_sharded(self, logical_path: str, entry: ShardedTensorEntry, destination: Any) -> Callable[[], Any]:
        """Fill each destination box from the stored pieces that overlap it (resharding).

        A ``DTensor``/``ShardedTensor`` destination of the saved global shape is filled in its
        local shards, in place; a plain tensor of that shape and dtype is filled whole; anything
        else gets a new tensor with the whole global value. Only pieces (whole row blocks of a
        stored shard) that overlap a destination box are read, each verified as a whole.
        """
        dtype = dtype_from_name(entry.dtype)
        itemsize = dtype.itemsize
        whole = Box((0,) * len(entry.shape), entry.shape)
        boxes = destination_boxes(destination)
        if boxes is not None:
            if tuple(destination.shape) != entry.shape or destination.dtype != dtype:
                raise StateMismatchError(
                    f"cannot restore {logical_path!r} into the sharded destination: the snapshot has dtype "
                    f"{entry.dtype} shape {list(entry.shape)}, the destination {str(destination.dtype)[6:]} "
                    f"shape {list(destination.shape)}"
                )
            targets = [(box, local.detach()) for box, local in boxes]
            result: Any = destination
        elif (
            isinstance(destination, torch.Tensor)
            and destination.dtype == dtype
            and tuple(destination.shape) == entry.shape
            and destination.layout == torch.strided
        ):
            targets, result = [(whole, destination.detach())], destination
        else:
            fresh = torch.empty(entry.shape, dtype=dtype)
            targets, result = [(whole, fresh)], fresh
        for shard in entry.shards:
            shard_box = Box(shard.offsets, shard.sizes)
            if not any(overlap(shard_box, target_box) for target_box, _ in targets):
                continue
            sizes = [piece.nbytes for piece in shard.pieces]
            for piece, piece_box in zip(shard.pieces, piece_boxes(shard_box, sizes, itemsize), strict=True):
                wanted = [(o, t, tensor) for t, tensor in targets if (o := overlap(piece_box, t)) is not None]
                if not wanted:
                    continue

                def consume(
                    within: int, data: memoryview, piece_box: Box = piece_box, wanted: list[Any] = wanted
                ) -> None:
                    source = tensor_from_bytes(data, dtype, piece_box.sizes)
                    for common, target_box, tensor in wanted:
                        box_slice(tensor, target_box.offsets, common).copy_(
                            box_slice(source, piece_box.offsets, common)
                        )

                self.reads.append(PieceRead(piece, logical_path, consume=consume))
        return lambda: result

    def _add_raw_reads(self, logical_path: str, entry: TensorEntry, target: torch.Tensor, itemsize: int) -> None:
        direct = byte_view(target) if is_zero_copy_source(target) and target.numel() else None
        offset = 0
        for piece in entry.pieces:
            if direct is not None:
                self.reads.append(PieceRead(piece, logical_path, direct=direct[offset : offset + piece.nbytes]))
            else:
                first_element = offset // itemsize

                def consume(
                    within: int, data: memoryview, first_element: int = first_element, dtype: torch.dtype = target.dtype
                ) -> None:
                    values = tensor_from_bytes(data, dtype, (data.nbytes // itemsize,))
                    copy_flat_range_in(target, first_element + within // itemsize, values)

                self.reads.append(PieceRead(piece, logical_path, consume=consume, splittable=True, itemsize=itemsize))
            offset += piece.nbytes
