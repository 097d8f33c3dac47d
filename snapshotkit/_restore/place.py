"""Place: from manifest entries to values: destinations (in place where possible) and the reads that fill them."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Iterable
from typing import Any

import torch

from snapshotkit._format.box_index import BoxIndex
from snapshotkit._format.entries import Entry, ObjectEntry, Piece, PrimitiveEntry, ShardedTensorEntry, TensorEntry
from snapshotkit._format.serialization import (
    RAW,
    byte_view,
    copy_flat_range_in,
    deserialize_object,
    dtype_from_name,
    is_zero_copy_source,
    memory_view,
    tensor_from_bytes,
)
from snapshotkit._format.sharded import Box, box_slice, destination_boxes, is_sharded, overlap, piece_boxes
from snapshotkit._restore.fetch import Claim, PieceRead, union_bytes
from snapshotkit._restore.fits import lazy_bits, receive_loaded, same_bytes, tensor_matches
from snapshotkit._restore.overlap import overlapping_memory
from snapshotkit._restore.runs import InPlaceRun, run_holding
from snapshotkit.errors import ManifestError, RestoreMemoryError, StateMismatchError


class _Slot:
    """Holds a value that becomes known once the reads have run."""

    __slots__ = ("value",)

    def __init__(self, value: Any = None) -> None:
        self.value = value


class LeafLoader:
    """Collects the piece reads for many leaves; the thunks :meth:`add` returns give the values once they ran."""

    def __init__(self, *, weights_only: bool, runs: bool = False) -> None:
        self.weights_only = weights_only
        self.reads: list[PieceRead] = []
        #: Whether the caller fetches :attr:`runs` too (:func:`~.runs.read_runs`); if not, planning
        #: from columns adds a read per tensor to :attr:`reads` instead.
        self.takes_runs = runs
        #: Tensors read in place as arrays (:meth:`add_run`).
        self.runs: list[InPlaceRun] = []
        #: Pieces read into memory the restore allocates; checked before :meth:`allocate`.
        self.claims: list[Claim] = []
        self._fresh_bytes = 0
        self._allocations: list[Callable[[], None]] = []
        # Keys hold where every piece of the entry lives: entries with the same pieces are one
        # payload (tied weights). Not the first piece alone: an incremental take references a
        # base piece for every payload piece with its bytes, so two payloads that begin with the
        # same bytes share their first piece and nothing else.
        self._fresh: dict[tuple[Any, ...], _Slot] = {}
        self._in_place: set[tuple[Any, ...]] = set()
        #: (device, address) of each in-place destination -> the logical path read into it first,
        #: and, for a destination :meth:`add_in_place` planned, its piece and tensor (its key in
        #: ``_in_place`` is built only if another entry meets the same memory). A second stored
        #: tensor whose destination is the same memory (tied in the app state, two tensors in the
        #: snapshot) is read aside and compared, never into the same bytes.
        #: (An entry of a run holds ``(run, index)`` there.)
        self._in_place_memory: dict[tuple[Any, ...], tuple[str, tuple[Any, Any] | None]] = {}
        #: The contiguous CPU and CUDA memory read into in place outside runs: ``(address, nbytes, logical
        #: path)``, checked for overlaps (:func:`~.overlap.overlapping_memory`) before any read.
        self._spans: list[tuple[int, int, str]] = []
        #: The non-contiguous CPU and CUDA tensors read into in place, and their logical paths (the same check).
        self._strided: list[tuple[torch.Tensor, str]] = []
        #: The CUDA devices whose caller's stream :meth:`_after_queued_work` synchronized.
        self._synced_devices: set[int | None] = set()
        #: Whether some read lands in the caller's own memory (an in-place destination).
        self.writes_in_place = False
        #: Set (:meth:`begin_fetch`) just before the first read may land anywhere.
        self.fetch_started = False

    def begin_fetch(self) -> None:
        """Note that reads into the destinations may start now."""
        self.fetch_started = True

    @property
    def may_have_written(self) -> bool:
        """Whether a failure now may have left the caller's destinations partly overwritten."""
        return self.fetch_started and self.writes_in_place

    def add(
        self,
        logical_path: str,
        entry: Entry,
        destination: Any = None,
        *,
        matches: bool | None = None,
        or_new: bool = False,
    ) -> Callable[[], Any]:
        """Plan loading ``entry``; ``destination`` is used in place when it matches.

        ``matches`` is :func:`tensor_matches` of a tensor entry and its destination when the
        caller already computed it (planning a restore does, once per entry). A ``torch.save``d
        tensor ``destination`` cannot take (:func:`~.fits.receive_loaded`) raises once loaded, or
        with ``or_new`` (a new tensor is fine) is the value the thunk gives.

        Returns a thunk that gives the loaded value once :attr:`reads` have been fetched.
        """
        if isinstance(entry, PrimitiveEntry):
            value = entry.value
            return lambda: value
        if isinstance(entry, ObjectEntry):
            slot = _Slot()
            self._add_blob(logical_path, entry.piece, lambda obj: setattr(slot, "value", obj))
            return lambda: slot.value
        if isinstance(destination, torch.Tensor) or is_sharded(destination):
            if is_sharded(destination):  # its local shards hold the memory (a ShardedTensor has no is_cuda)
                for _, local in destination_boxes(destination) or ():
                    if local.is_cuda:
                        self._after_queued_work(local.device)
            elif destination.is_cuda:
                self._after_queued_work(destination.device)
        if isinstance(entry, TensorEntry):
            if is_sharded(destination):
                return self._add_tensor_into_shards(logical_path, entry, destination)
            return self._add_tensor(logical_path, entry, destination, matches, or_new)
        if isinstance(entry, ShardedTensorEntry):
            return self._add_sharded(logical_path, entry, destination)
        raise ManifestError(f"{logical_path!r} is a {entry.kind}, not a leaf")

    def add_in_place(self, logical_path: str, entry: TensorEntry, destination: torch.Tensor) -> bool:
        """Plan reading ``entry`` straight into ``destination``, if it is the common case, with
        none of :meth:`add`'s per-entry objects: a restore of many small tensors calls this once
        per tensor.

        The common case: :func:`tensor_matches` holds, ``destination`` is a plain non-empty
        contiguous CPU ``Tensor``/``Parameter`` without a lazy conj/neg bit, and ``entry`` is one
        raw piece of exactly its bytes, into memory no other entry planned so far is read into.

        Returns:
            Whether it was planned (the value after the reads is ``destination``); if not,
            nothing was, and :meth:`add` handles the entry.
        """
        pieces = entry.pieces
        if (
            (type(destination) is not torch.Tensor and type(destination) is not torch.nn.Parameter)
            or len(pieces) != 1
            or entry.serializer != RAW
            or not destination.is_cpu
            or not destination.is_contiguous()
            or destination.is_conj()
            or destination.is_neg()
            or destination.is_inference()  # refused by plan.check_destination
        ):
            return False
        piece = pieces[0]
        nbytes = destination.nbytes
        start, end = piece.byte_range
        if not nbytes or end - start != nbytes:
            return False
        return self.add_piece_in_place(logical_path, piece, destination)

    def add_piece_in_place(self, logical_path: str, piece: Piece, destination: torch.Tensor) -> bool:
        """:meth:`add_in_place` once the caller checked everything but the memory: ``destination``
        is a plain non-empty contiguous CPU tensor of the entry's dtype and shape, ``piece`` its
        one raw piece of exactly its bytes (planning from a version-5 manifest's columns does).

        Returns:
            Whether it was planned; not when another entry planned so far is read into the same
            memory (tied destinations: :meth:`add` compares or skips).
        """
        address = destination.data_ptr()
        if self.runs and self._in_run((_CPU, address)) is not None:
            return False
        known = self._in_place_memory.setdefault((_CPU, address), (logical_path, (piece, destination)))
        if known[0] is not logical_path:  # tied to an entry planned earlier: add() compares or skips
            return False
        self.writes_in_place = True
        self.reads.append(PieceRead(piece, logical_path, memory_view(address, piece.nbytes)))
        self._spans.append((address, piece.nbytes, logical_path))
        return True

    def in_place_addresses(self) -> list[int]:
        """The addresses of the CPU memory some entry planned so far is read into in place."""
        found = [address for device, address in self._in_place_memory if device == _CPU]
        return found + [address for run in self.runs for address in run.addresses.tolist()]

    def add_run(self, run: InPlaceRun) -> None:
        """Plan reading ``run`` in place: its destinations passed :meth:`add_piece_in_place`'s
        checks, and none is memory another entry planned so far is read into, nor another's of
        the run. An entry planned later into one of them meets it as :meth:`add` meets any."""
        self.writes_in_place = True
        self.runs.append(run)

    def _in_run(self, memory: tuple[Any, ...]) -> tuple[str, tuple[Any, Any]] | None:
        """What :attr:`_in_place_memory` would hold for ``memory`` if runs were entered there."""
        return run_holding(self.runs, memory[1]) if memory[0] == _CPU else None

    def add_stored_bytes(self, logical_path: str, piece: Piece) -> Callable[[], bytes]:
        """Plan reading the bytes of ``piece`` as stored (verified, not deserialized).

        Returns a thunk that gives them once :attr:`reads` have been fetched.
        """
        slot = _Slot()
        self._claim(logical_path, (piece,), fresh_tensor=False)

        def consume(offset: int, data: memoryview) -> None:
            slot.value = bytes(data)

        self.reads.append(PieceRead(piece, logical_path, consume=consume))
        return lambda: slot.value

    def _after_queued_work(self, device: torch.device) -> None:
        """Wait for the work queued on the caller's current stream of ``device`` (once per device).

        Reads fill GPU destinations from worker threads, whose current stream is the device's
        default stream: a kernel the caller queued on another stream and that still writes a
        destination would otherwise land after the restored values. The fills themselves are
        synchronous copies, so work queued after the restore sees the restored values.
        """
        if device.index not in self._synced_devices:
            self._synced_devices.add(device.index)
            torch.cuda.current_stream(device).synchronize()

    def allocate(self) -> None:
        """Allocate the new tensors planned so far and add their reads to :attr:`reads`.

        Call once the :attr:`claims` are proven (the engine checks them against the data objects'
        real sizes); before that, planning allocates nothing a manifest could inflate.

        Raises:
            ManifestError: new tensors would take more bytes than the distinct stored ranges
                they are read from (pieces reused across tensors of another dtype or shape).
            RestoreMemoryError: torch cannot allocate a tensor of the recorded size.
            StateMismatchError: two in-place destinations partly share memory.
        """
        stored = union_bytes([claim.piece for claim in self.claims if claim.fresh_tensor])
        if self._fresh_bytes > stored:
            raise ManifestError(
                f"the manifest asks for {self._fresh_bytes} bytes of new tensors read from {stored} stored bytes: "
                "pieces are reused across tensors of another dtype or shape, which no take writes; "
                "the manifest is corrupt or crafted"
            )
        overlapping_memory(self._spans, self.runs, self._strided)  # before anything is read into the caller's memory
        allocations, self._allocations = self._allocations, []
        for allocation in allocations:
            allocation()

    def _claim(self, logical_path: str, pieces: Iterable[Piece], *, fresh_tensor: bool) -> None:
        self.claims.extend(Claim(logical_path, piece, fresh_tensor) for piece in pieces if piece.nbytes)

    def _add_blob(self, logical_path: str, piece: Piece, sink: Callable[[Any], None]) -> None:
        weights_only = self.weights_only
        self._claim(logical_path, (piece,), fresh_tensor=False)

        def consume(offset: int, data: memoryview) -> None:
            sink(deserialize_object(data, weights_only=weights_only, logical_path=logical_path))

        self.reads.append(PieceRead(piece, logical_path, consume=consume))

    def _add_tensor(
        self, logical_path: str, entry: TensorEntry, destination: Any, matches: bool | None = None, or_new: bool = False
    ) -> Callable[[], Any]:
        in_place = tensor_matches(entry, destination) if matches is None else matches
        if entry.serializer != RAW:
            slot = _Slot()

            def receive(loaded: Any) -> None:
                if not isinstance(loaded, torch.Tensor):
                    raise ManifestError(f"{logical_path!r} is recorded as a tensor but holds a {type(loaded).__name__}")
                slot.value = receive_loaded(logical_path, destination, loaded, or_new) if in_place else loaded

            self._add_blob(logical_path, entry.pieces[0], receive)
            self.writes_in_place = self.writes_in_place or in_place
            return lambda: slot.value

        dtype = dtype_from_name(entry.dtype)
        itemsize = dtype.itemsize
        nbytes, needed = entry.nbytes, entry.numel * itemsize
        if nbytes != needed:
            raise ManifestError(
                f"{logical_path!r}: pieces hold {nbytes} bytes but dtype {entry.dtype} shape "
                f"{list(entry.shape)} needs {needed}"
            )
        pieces = entry.pieces
        if len(pieces) == 1:
            piece = pieces[0]
            first: tuple[Any, ...] | None = ((piece.address, piece.byte_range),)
        else:
            first = tuple([(piece.address, piece.byte_range) for piece in pieces]) or None
        if in_place:
            target: torch.Tensor = destination.detach()
            # a lazy conj/neg bit is part of how the memory reads: such a view is another destination
            key = (first, target.data_ptr(), target.shape, target.stride(), target.device, lazy_bits(target))
            memory = (target.device, target.data_ptr())
            known = self._in_place_memory.get(memory)
            if known is None:
                known = self._in_place_memory[memory] = (self.runs and self._in_run(memory)) or (logical_path, None)
            earlier, fast = known
            if fast is not None:  # planned by add_in_place or in a run: its key is needed now
                if type(fast[0]) is InPlaceRun:
                    fast = (fast[0].piece_at(fast[1]), fast[0].destinations[fast[1]])
                self._in_place.add(_in_place_key(*fast))
                self._in_place_memory[memory] = (earlier, None)
            if key not in self._in_place:
                if earlier != logical_path and target.numel():
                    return self._add_compared(logical_path, entry, destination, earlier)
                self._in_place.add(key)
                self.writes_in_place = True
                self._add_raw_reads(logical_path, entry, target, itemsize)
                if (target.is_cpu or target.is_cuda) and target.nbytes:  # one address space (UVA)
                    if target.is_contiguous():
                        self._spans.append((target.data_ptr(), target.nbytes, logical_path))
                    else:
                        self._strided.append((target, logical_path))
            return functools.partial(_identity, destination)
        # Entries of the very same pieces are tied tensors, one new tensor for both, when a piece
        # was written by this snapshot (each written piece is one tensor's). Pieces that all
        # reference a base are shared by content: two distinct tensors of equal bytes may name them.
        fresh_key = (first, entry.dtype, entry.shape)
        tied = any(piece.base is None for piece in pieces)
        cached = self._fresh.get(fresh_key) if tied else None
        if cached is not None:
            return lambda: cached.value
        slot = _Slot()
        if tied:
            self._fresh[fresh_key] = slot
        self._fresh_bytes += entry.nbytes
        self._claim(logical_path, entry.pieces, fresh_tensor=True)

        def allocate() -> None:
            slot.value = _new_tensor(logical_path, entry.shape, dtype)
            self._add_raw_reads(logical_path, entry, slot.value, itemsize)

        self._allocations.append(allocate)
        return lambda: slot.value

    def _add_compared(self, logical_path: str, entry: TensorEntry, destination: Any, earlier: str) -> Callable[[], Any]:
        """``entry`` whose destination is the memory ``earlier`` is read into: read it into a new
        tensor and check the bytes are the same (reading both into one memory would interleave
        them, and the checksum of each would fail as if the snapshot were damaged)."""
        fresh = self._add_tensor(logical_path, entry, None)

        def compared() -> Any:
            if not same_bytes(fresh(), destination.detach()):
                raise StateMismatchError(
                    f"{logical_path!r} and {earlier!r} are one tensor in the app state (tied: they share memory), "
                    "but the snapshot holds values for them that one memory cannot show at once (they were not tied "
                    "when it was taken, or one is a negated or conjugated view of the other). Restore into a model "
                    "built as the saved one was, its tensors untied, and tie them afterwards if they are meant to be "
                    "one"
                )
            return destination

        return compared

    def _add_tensor_into_shards(self, logical_path: str, entry: TensorEntry, destination: Any) -> Callable[[], Any]:
        """A plain stored tensor into a ``DTensor``/``ShardedTensor`` of its shape: read it whole
        into a new tensor, then copy each local box of the destination from it."""
        if tuple(destination.shape) != entry.shape or str(destination.dtype).removeprefix("torch.") != entry.dtype:
            raise StateMismatchError(
                f"cannot restore {logical_path!r} into the sharded destination: the snapshot has dtype "
                f"{entry.dtype} shape {list(entry.shape)}, the destination {str(destination.dtype)[6:]} "
                f"shape {list(destination.shape)}"
            )
        whole = self._add_tensor(logical_path, entry, None)
        boxes = destination_boxes(destination) or []
        origin = (0,) * len(entry.shape)

        def fill() -> Any:
            value = whole()
            for box, local in boxes:
                box_slice(local.detach(), box.offsets, box).copy_(box_slice(value, origin, box))
            return destination

        return fill

    def _add_sharded(self, logical_path: str, entry: ShardedTensorEntry, destination: Any) -> Callable[[], Any]:
        """Fill each destination box from the stored pieces that overlap it (resharding).

        A ``DTensor``/``ShardedTensor`` destination of the saved global shape is filled in its
        local shards, in place; a plain tensor of that shape and dtype is filled whole; anything
        else gets a new tensor with the whole global value. Only pieces (whole row blocks of a
        stored shard) that overlap a destination box are read, each verified as a whole; a take
        stores a large ``Shard(1)`` or ``Shard(0)`` box as column sub-boxes, so a box needing
        some of its columns reads only the sub-boxes holding them.
        """
        dtype = dtype_from_name(entry.dtype)
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
        else:  # a new tensor: nothing of the caller's is written
            slot = _Slot()
            self._fresh_bytes += entry.nbytes
            self._claim(logical_path, (p for shard in entry.shards for p in shard.pieces), fresh_tensor=True)

            def allocate() -> None:
                slot.value = _new_tensor(logical_path, entry.shape, dtype)
                self._add_shard_reads(logical_path, entry, [(whole, slot.value)], dtype)

            self._allocations.append(allocate)
            return lambda: slot.value
        self.writes_in_place = True
        self._add_shard_reads(logical_path, entry, targets, dtype)
        return lambda: result

    def _add_shard_reads(
        self,
        logical_path: str,
        entry: ShardedTensorEntry,
        targets: list[tuple[Box, torch.Tensor]],
        dtype: torch.dtype,
    ) -> None:
        itemsize = dtype.itemsize
        # Only the stored shards overlapping a target, found through an index (a restore onto
        # thousands of ranks would otherwise check every shard against every target).
        index = BoxIndex(entry.shards)
        for position in sorted({i for target_box, _ in targets for i in index.overlapping(target_box)}):
            shard = entry.shards[position]
            shard_box = Box(shard.offsets, shard.sizes)
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

                self._claim(logical_path, (piece,), fresh_tensor=False)  # read into a buffer of its size
                self.reads.append(PieceRead(piece, logical_path, consume=consume))

    def _add_raw_reads(self, logical_path: str, entry: TensorEntry, target: torch.Tensor, itemsize: int) -> None:
        # Only a tensor's own memory is read into directly: a subclass may wrap other storage.
        plain = type(target) is torch.Tensor or type(target) is torch.nn.Parameter
        direct = byte_view(target) if plain and is_zero_copy_source(target) and target.numel() else None
        if direct is not None and len(entry.pieces) == 1:  # the common case: the piece is the whole tensor
            self.reads.append(PieceRead(entry.pieces[0], logical_path, direct))
            return
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


_CPU = torch.device("cpu")


def _in_place_key(piece: Piece, target: torch.Tensor) -> tuple[Any, ...]:
    """The key :meth:`LeafLoader._add_tensor` gives a one-piece entry read into ``target``."""
    return (((piece.address, piece.byte_range),), target.data_ptr(), target.shape, target.stride(), target.device, 0)


def _identity(value: Any) -> Any:
    return value


def _new_tensor(logical_path: str, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    try:
        return torch.empty(shape, dtype=dtype)
    except (RuntimeError, MemoryError) as exc:
        nbytes = math.prod(shape) * dtype.itemsize
        raise RestoreMemoryError(
            f"cannot allocate {nbytes} bytes for {logical_path!r} (dtype {str(dtype)[6:]} shape {list(shape)}): "
            "restore it in place into an existing tensor, or read it on a machine with more memory"
        ) from exc
