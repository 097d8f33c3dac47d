"""Copying a committed snapshot from one rank's local root to another's, over the process group.

The fast-recovery tier keeps each rank's snapshot of a step under its node's local root (a
snapshot taken by a group of that rank alone) and copies it to ranks on other nodes: after a
local save (replication), and at restore to a rank whose node lost its local root (serving).
:func:`send_and_receive` runs one round of such copies, each a :class:`Transfer`.

One transfer is a conversation between its sender and its receiver alone (gloo point-to-point
messages; a JSON message is an int64 length, then that many uint8 bytes):

1. header, sender to receiver: ``{"available", "reason", "files": [[relative path, size], ...]}``.
   A source that is not a committed snapshot is unavailable (``reason`` says why); the transfer
   ends there.
2. reply, receiver to sender: ``{"send", "ok", "reason"}``. ``send`` false ends the transfer: the
   receiver already holds a committed copy (``ok``), or refuses the header or cannot write.
3. body: every file in the header's order (the manifest first, so that the receiver checks the
   data objects' bytes against it as they arrive), in messages of at most ``chunk_bytes``
   through two buffers reused for the whole round (one is filled while the other is sent or written).
4. trailer, sender to receiver: ``{"ok", "reason"}``, false when a file could not be read in full
   (the bytes sent in its place were padding, so that both sides stay in step).
5. outcome, receiver to sender: ``{"ok", "reason"}``, once the copy is verified and in place.

IMPORTANT: the receiver (:mod:`.receive`) writes into a fresh ``<target>.incoming-<16 hex>``
beside the target (:func:`is_incoming` recognizes the name, for the local root's clean-up),
checks every piece's checksum and hash as its bytes arrive, fsyncs every file and directory, and
only then renames it to the target. A target path is therefore either absent or a complete,
verified copy; a receiver killed midway leaves at most an incoming directory.
"""

from __future__ import annotations

import concurrent.futures
import math
import os
import pathlib
import stat
from collections.abc import Callable, Sequence
from typing import Any

from snapshotkit._dist import Group, resolve_group
from snapshotkit._format.pieces import METADATA_FILENAME
from snapshotkit._tier.receive import Buffers, receive
from snapshotkit._tier.wire import (
    INCOMING_INFIX,
    Transfer,
    TransferOutcome,
    describe,
    is_incoming,
    ok_reason,
    receive_json,
    send_json,
)
from snapshotkit.errors import ConfigError, InvalidArgumentError

__all__ = ["INCOMING_INFIX", "Transfer", "TransferOutcome", "is_incoming", "send_and_receive"]

#: How far ahead of the chunk it reads the sender asks the kernel to read a file into the page cache.
_READ_AHEAD_BYTES = 64 << 20
#: The bytes one read-ahead hint covers.
_ADVICE_BYTES = 2 << 20


def send_and_receive(
    pg: Any,
    rank: int,
    transfers: Sequence[Transfer],
    source_dir: Callable[[Transfer], pathlib.Path],
    target_dir: Callable[[Transfer], pathlib.Path],
    *,
    chunk_bytes: int = 16 << 20,
    timeout_s: float,
) -> list[TransferOutcome]:
    """Make the ``transfers`` this rank sends or receives, one after another in list order.

    Every rank of ``pg`` calls it with the same ``transfers``; a rank that neither sends nor
    receives any returns at once. A sender reads ``source_dir(transfer)`` (a committed snapshot,
    or the transfer fails with ``ok`` false on both sides, without a hang); a receiver writes
    ``target_dir(transfer)``, which then holds a copy that passed verification (every checksum,
    and taken by its owner alone), or nothing new. A committed target is kept as it is. Only the
    snapshot's own files are copied: an incremental snapshot verifies on the receiver only if its
    bases are there too.

    Args:
        pg: a gloo process group over the ranks named in ``transfers`` (None: the default group).
        rank: this process's rank in ``pg``.
        transfers: the round, the same list on every rank.
        source_dir: where the sender of a transfer finds the snapshot to send.
        target_dir: where the receiver of a transfer puts its copy.
        chunk_bytes: the largest message of file bytes (this rank holds two buffers of it).
        timeout_s: how long each wait for the peer may last; the peer may first have to finish
            transfers earlier in the list, and the sender waits for the receiver's verification.

    Returns:
        The outcome of every transfer this rank sent or received, in list order.

    Raises:
        InvalidArgumentError: ``transfers`` holds something other than a :class:`Transfer`.
        ConfigError: ``rank`` is not this process's rank in ``pg``; a transfer names a rank
            outside ``pg`` or the same rank as sender and receiver; ``chunk_bytes`` or
            ``timeout_s`` is not positive. Raised before anything is sent or written.
        CollectiveTimeoutError: a peer did not answer within ``timeout_s``.
        RankFailedError: the connection to a peer was lost (it crashed or was killed). An
            incoming copy this rank was receiving is removed; the target stays as it was.
    """
    group = _checked_group(pg, rank, transfers, chunk_bytes, timeout_s)
    buffers: Buffers = ()
    outcomes = []
    # IMPORTANT: every rank walks the same list in the same order, and a transfer involves its
    # sender and receiver only, each blocking until the other answers. So no wait can go on for
    # ever: the earliest transfer in the list not yet done has both its ranks done with every
    # earlier one they take part in (those are earlier, hence done), so both are at this one and
    # it completes; by induction every transfer does. Skipping or reordering a transfer on one
    # rank breaks this (its peer then waits until ``timeout_s``).
    for transfer in transfers:
        if rank not in (transfer.sender, transfer.receiver):
            continue
        if not buffers:
            import torch

            buffers = [torch.empty(chunk_bytes, dtype=torch.uint8) for _ in range(2)]
        if rank == transfer.sender:
            outcomes.append(_send(group, transfer, source_dir(transfer), buffers))
        else:
            outcomes.append(receive(group, transfer, target_dir(transfer), buffers))
    return outcomes


def _checked_group(pg: Any, rank: int, transfers: Sequence[Transfer], chunk_bytes: int, timeout_s: float) -> Group:
    if isinstance(chunk_bytes, bool) or not isinstance(chunk_bytes, int) or chunk_bytes <= 0:
        raise ConfigError(f"chunk_bytes must be a positive int (bytes per message), got {chunk_bytes!r}")
    if isinstance(timeout_s, bool) or not isinstance(timeout_s, int | float) or not (0 < timeout_s < math.inf):
        raise ConfigError(f"timeout_s must be a positive number of seconds, got {timeout_s!r}")
    group = resolve_group(pg, timeout_seconds=float(timeout_s))
    if rank != group.rank:
        raise ConfigError(f"rank is {rank!r}, but this process is rank {group.rank} of pg; pass dist.get_rank(pg)")
    for transfer in transfers:
        if not isinstance(transfer, Transfer):
            raise InvalidArgumentError(f"transfers must hold Transfer values, got {type(transfer).__name__}")
        ranks = (transfer.owner, transfer.sender, transfer.receiver)
        if not all(isinstance(r, int) and 0 <= r < group.world_size for r in ranks):
            raise ConfigError(f"{transfer} names a rank outside the process group of {group.world_size} ranks")
        if transfer.sender == transfer.receiver:
            raise ConfigError(f"{transfer} has the same rank as sender and receiver; a copy goes to another rank")
    return group


# ------------------------------------------------------------------ the sender


def _send(group: Group, transfer: Transfer, source: pathlib.Path, buffers: Buffers) -> TransferOutcome:
    what = describe(transfer)
    peer = transfer.receiver
    try:
        files, unavailable = _listing(source)
    except OSError as exc:  # the snapshot changed while it was listed (removed by retention)
        files, unavailable = [], f"the sender could not list its snapshot at {source}: {exc}"
    header = {"available": not unavailable, "reason": unavailable, "files": [[p, s] for p, s in files]}
    send_json(group, peer, header, what)
    if unavailable:
        return TransferOutcome(transfer, False, unavailable)
    reply = receive_json(group, peer, what)
    if reply.get("send") is not True:
        return TransferOutcome(transfer, *ok_reason(reply))
    problems = _send_files(group, peer, source, files, buffers, what)
    send_json(group, peer, {"ok": not problems, "reason": "; ".join(problems)}, what)
    return TransferOutcome(transfer, *ok_reason(receive_json(group, peer, what)))


def _listing(source: pathlib.Path) -> tuple[list[tuple[str, int]], str]:
    """Every file of the snapshot at ``source`` as ``(relative path, size)``, the manifest first;
    or why it cannot be sent (then no files)."""
    if not (source / METADATA_FILENAME).is_file():
        whereabouts = "no snapshot" if not source.is_dir() else f"no committed snapshot (no {METADATA_FILENAME})"
        return [], f"the sender holds {whereabouts} at {source}"
    files = []
    for directory, dirnames, filenames in os.walk(source, onerror=_raise):
        for name in sorted(dirnames) + sorted(filenames):
            path = pathlib.Path(directory, name)
            found = path.lstat()
            if stat.S_ISDIR(found.st_mode):
                continue
            if not stat.S_ISREG(found.st_mode):
                return [], f"the sender's snapshot at {source} holds {path}, which is not a regular file"
            files.append((path.relative_to(source).as_posix(), found.st_size))
    files.sort(key=lambda file: (file[0] != METADATA_FILENAME, file[0]))
    return files, ""


def _raise(error: OSError) -> None:
    raise error


def _send_files(
    group: Group, peer: int, source: pathlib.Path, files: list[tuple[str, int]], buffers: Buffers, what: str
) -> list[str]:
    """Send every file's bytes, padding in place of what cannot be read; why there was any.

    Double-buffered: a reader thread reads the next chunk into one buffer while this thread
    sends the previous one out of the other (no collective runs on the reader)."""
    chunks = [
        (relative, size_bytes, offset, min(len(buffers[0]), size_bytes - offset))
        for relative, size_bytes in files
        for offset in range(0, size_bytes, len(buffers[0]))
    ]
    reader = _Reader(source)
    with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="snapshotkit-tier-send") as worker:
        read = [worker.submit(reader.read, *chunk, buffers[k]) for k, chunk in enumerate(chunks[: len(buffers)])]
        try:
            for k, (_, _, _, n) in enumerate(chunks):
                slot = k % len(buffers)
                read[slot].result()
                group.send_to(buffers[slot][:n], peer, what)
                if k + len(buffers) < len(chunks):  # the buffer just sent takes the chunk after the next
                    read[slot] = worker.submit(reader.read, *chunks[k + len(buffers)], buffers[slot])
        finally:
            worker.submit(reader.close)
    return [reader.problems[relative] for relative, _ in files if reader.problems.get(relative)]


class _Reader:
    """Reads the files of a snapshot chunk by chunk, in order (on one thread)."""

    def __init__(self, source: pathlib.Path) -> None:
        self.source = source
        #: Why a file could not be read in full (its missing bytes were sent as zeros).
        self.problems: dict[str, str] = {}
        self._relative: str | None = None
        self._file: Any = None
        self._advised = 0  # the current file's bytes before this were advised to be read ahead

    def read(self, relative: str, size_bytes: int, offset: int, n: int, buffer: Any) -> None:
        """Fill ``buffer[:n]`` with the file's bytes from ``offset`` (zeros for what cannot be read)."""
        path = self.source / relative
        if relative != self._relative:
            self.close()
            self._relative = relative
            try:
                self._file = open(path, "rb", buffering=0, opener=_open_no_follow)  # noqa: SIM115 - closed in close()
            except OSError as exc:
                self.problems[relative] = f"the sender could not read {path}: {exc}"
        filled = 0
        if self._file is not None and relative not in self.problems:
            self._read_ahead(offset + n, size_bytes)
            filled, problem = _fill(self._file, memoryview(buffer.numpy())[:n], path, offset, size_bytes)
            if problem:
                self.problems[relative] = problem
        if filled < n:
            buffer[filled:n].zero_()

    def _read_ahead(self, start: int, size_bytes: int) -> None:
        """Ask the kernel to read the file's next :data:`_READ_AHEAD_BYTES` from ``start`` into the
        page cache in the background (a copy that is not cached streams from the disk while the
        chunks before it are sent), in calls of :data:`_ADVICE_BYTES`: Linux reads ahead at most
        about its read-ahead window per call."""
        advise = getattr(os, "posix_fadvise", None)
        end = min(start + _READ_AHEAD_BYTES, size_bytes)
        start = max(start, self._advised)
        if advise is None or start >= end:
            return
        try:
            for at in range(start, end, _ADVICE_BYTES):
                advise(self._file.fileno(), at, min(_ADVICE_BYTES, end - at), os.POSIX_FADV_WILLNEED)
        except OSError:
            pass  # a hint the kernel declined
        self._advised = end

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
        self._advised = 0


def _open_no_follow(path: str, flags: int) -> int:
    return os.open(path, flags | getattr(os, "O_NOFOLLOW", 0))


def _fill(file: Any, view: memoryview, path: pathlib.Path, offset: int, size_bytes: int) -> tuple[int, str]:
    """Read into all of ``view`` (the file's bytes from ``offset``): bytes read, and why not all."""
    filled = 0
    try:
        while filled < len(view):
            got = file.readinto(view[filled:])
            if not got:
                return filled, f"the sender's {path} ended at {offset + filled} of {size_bytes} bytes"
            filled += got
    except OSError as exc:
        return filled, f"the sender could not read {path}: {exc}"
    return filled, ""
