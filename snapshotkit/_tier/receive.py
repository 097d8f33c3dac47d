"""The receiving side of a transfer (:mod:`.transfer` describes the conversation).

The manifest arrives first and is decoded; every data object's bytes are then checked as they
land in the receive buffer (:class:`~.arrival.ArrivalCheck`: each piece's CRC-32C and content
hash against the manifest) and written into ``<target>.incoming-<16 hex>`` beside the target, in
slices the page cache takes cheaply, with the disk asked to start writing each chunk back at once.

IMPORTANT: the copy is renamed to its target only when every piece verified, every byte was
written, and every file (the manifest, written last) and directory was fsynced; the rename is
then fsynced in the parent before the sender is told. The data objects' fsyncs wait until the
last byte has arrived (their writeback runs meanwhile), so that a busy disk does not hold up the
receiving. A target path is therefore either absent or a complete, verified, durable copy; a
receiver killed midway leaves at most an incoming directory, which :func:`~.wire.is_incoming`
lets the local root's clean-up recognize. A copy whose pieces are partly in base snapshots
(incremental) is, in addition, verified whole with its bases
(:func:`~snapshotkit.verify.verify_snapshot`) before the rename.
"""

from __future__ import annotations

import collections
import concurrent.futures
import functools
import os
import pathlib
import secrets
import shutil
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from snapshotkit._dist import Group
from snapshotkit._format.document import SnapshotMetadata
from snapshotkit._format.pieces import METADATA_FILENAME
from snapshotkit._runtime.filewrite import fsync_path, pwrite_all, start_writeback
from snapshotkit._tier.arrival import ArrivalCheck, FileCheck
from snapshotkit._tier.wire import (
    INCOMING_INFIX,
    Transfer,
    TransferOutcome,
    describe,
    ok_reason,
    receive_json,
    send_json,
)
from snapshotkit.errors import SnapshotkitError
from snapshotkit.verify import VerifyProblem, verify_snapshot

__all__ = ["Buffers", "checked_files", "receive"]

#: The buffers a transfer's chunks go through: uint8 tensors of the chunk size, two.
Buffers = Sequence[Any]

#: Files written and still open for their fsync, at most (the copy's are fsynced together at its end).
_UNSYNCED_FILES = 64

#: Problems of a damaged copy named in an outcome's reason (the rest are counted).
_PROBLEMS_NAMED = 3


def receive(group: Group, transfer: Transfer, target: pathlib.Path, buffers: Buffers) -> TransferOutcome:
    """Receive ``transfer``'s copy into ``target`` through ``buffers`` (two uint8 tensors of the chunk size)."""
    what = describe(transfer)
    peer = transfer.sender
    header = receive_json(group, peer, what)
    if header.get("available") is not True:
        return TransferOutcome(transfer, False, str(header.get("reason") or "the sender cannot send it"))
    files, refused = checked_files(header.get("files"))
    if not refused and _committed(target):
        send_json(group, peer, {"send": False, "ok": True, "reason": ""}, what)
        return TransferOutcome(transfer, True)
    incoming = None
    if not refused:
        try:
            incoming = _make_incoming(target)
        except OSError as exc:
            refused = f"the receiver could not create a directory beside {target}: {exc}"
    if incoming is None:
        send_json(group, peer, {"send": False, "ok": False, "reason": refused}, what)
        return TransferOutcome(transfer, False, refused)
    try:
        send_json(group, peer, {"send": True}, what)
        problem = _receive_copy(group, peer, incoming, files, buffers, what)
        _, sent_problem = ok_reason(receive_json(group, peer, what))
        problem = sent_problem or problem or _place(incoming, target)
    finally:
        if incoming.exists():  # not placed: a damaged copy, or the sender was lost midway
            shutil.rmtree(incoming, ignore_errors=True)
    send_json(group, peer, {"ok": not problem, "reason": problem}, what)
    return TransferOutcome(transfer, not problem, problem)


def checked_files(raw: object) -> tuple[list[tuple[str, int]], str]:
    """The header's file list, or why it is refused: a path that could leave the copy's
    directory, or a list that does not start with the manifest (which is checked first)."""
    if not isinstance(raw, list):
        return [], f"the sender's file list is malformed ({type(raw).__name__}); nothing was written"
    files: list[tuple[str, int]] = []
    seen: set[str] = set()
    for item in raw:
        if not (isinstance(item, list) and len(item) == 2 and isinstance(item[0], str) and _is_size(item[1])):
            return [], f"the sender's file list holds {item!r}, not a [path, size]; nothing was written"
        relative, size_bytes = item
        if (
            relative.startswith("/")
            or any(part in ("", ".", "..") for part in relative.split("/"))
            or "\\" in relative
            or "\x00" in relative
            or relative in seen
        ):
            return [], (
                f"the sender's file list names {relative!r}, which is not a plain relative path inside the "
                "snapshot (or is named twice); nothing was written"
            )
        seen.add(relative)
        files.append((relative, size_bytes))
    if not files or files[0][0] != METADATA_FILENAME:
        first = files[0][0] if files else "nothing"
        return [], f"the sender's file list starts with {first!r}, not {METADATA_FILENAME!r}; nothing was written"
    return files, ""


def _is_size(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _committed(target: pathlib.Path) -> bool:
    return target.is_dir() and not target.is_symlink() and (target / METADATA_FILENAME).is_file()


def _make_incoming(target: pathlib.Path) -> pathlib.Path:
    target.parent.mkdir(parents=True, exist_ok=True)
    incoming = target.with_name(f"{target.name}{INCOMING_INFIX}{secrets.token_hex(8)}")
    incoming.mkdir()
    return incoming


# ------------------------------------------------------------------ the body


def _receive_copy(
    group: Group, peer: int, incoming: pathlib.Path, files: list[tuple[str, int]], buffers: Buffers, what: str
) -> str:
    """Receive the manifest, then every data object (checked as it arrives) into ``incoming``;
    why the copy is not usable, or ``""`` once it is complete, verified and fsynced. Every byte
    is received whatever happens, so that both sides stay in step.

    Double-buffered: this thread receives the next chunk into one buffer while a writer thread
    checks and writes the previous one out of the other (in order; no collective runs there)."""
    (_, manifest_bytes), data_files = files[0], files[1:]
    manifest = bytearray()
    for _, n in _chunk_sizes(manifest_bytes, len(buffers[0])):
        group.receive_from(buffers[0][:n], peer, what)
        manifest += memoryview(buffers[0].numpy())[:n]
    check, problem = _arrival_check(bytes(manifest), data_files)
    writer = _CopyWriter(incoming, check, problem)
    views = [memoryview(buffer.numpy()) for buffer in buffers]
    in_use: list[concurrent.futures.Future[None] | None] = [None] * len(buffers)
    try:
        # leaving the block waits for the writer, also when a receive raised: the caller then removes
        # the incoming copy, which nothing writes to any more
        with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="snapshotkit-tier-receive") as worker:
            chunks = 0
            for relative, size_bytes in data_files:
                worker.submit(writer.open, relative)
                for offset, n in _chunk_sizes(size_bytes, len(views[0])):
                    slot = chunks % len(buffers)
                    chunks += 1
                    if in_use[slot] is not None:
                        in_use[slot].result()  # type: ignore[union-attr]  # its bytes are written out
                    group.receive_from(buffers[slot][:n], peer, what)
                    in_use[slot] = worker.submit(writer.write, views[slot][:n], offset)
                worker.submit(writer.close)
        return writer.finish(bytes(manifest))
    finally:
        writer.release()


def _chunk_sizes(size_bytes: int, chunk_bytes: int) -> Iterator[tuple[int, int]]:
    """``(offset, length)`` of each chunk of a file of ``size_bytes``."""
    for offset in range(0, size_bytes, chunk_bytes):
        yield offset, min(chunk_bytes, size_bytes - offset)


class _CopyWriter:
    """Checks and writes the data objects of a copy, in the order they arrive (on one thread).

    Once the copy is known to be unusable (a piece failed its check, a write failed), nothing
    more is written; the check goes on, so that the reason names every damaged piece."""

    def __init__(self, incoming: pathlib.Path, check: ArrivalCheck | None, problem: str) -> None:
        self.incoming, self.check, self.problem = incoming, check, problem
        self.directories = {incoming}
        self._fd = -1
        self._path = incoming
        self._file_check: FileCheck | None = None
        self._unsynced: collections.deque[tuple[int, pathlib.Path]] = collections.deque()  # written, open
        self._error: BaseException | None = None  # a bug, raised by finish() on the caller's thread

    def _writing(self) -> bool:
        return self.check is not None and not self.check.problems and not self.problem

    def open(self, relative: str) -> None:
        try:
            self._path = self.incoming / relative
            self._file_check = self.check.file(relative) if self.check is not None else None
            if self._writing():
                self._fd, self.problem = _create(self.incoming, relative, self.directories)
        except BaseException as exc:
            self._error = self._error or exc

    def write(self, data: memoryview, offset: int) -> None:
        try:
            if self._file_check is not None:
                self._file_check.update(data)
            if self._fd >= 0 and self._writing():
                self.problem = _write_chunk(self._fd, data, offset, self._path)
        except BaseException as exc:
            self._error = self._error or exc

    def close(self) -> None:
        """The file's bytes are all written: its fsync is left for :meth:`finish` (its writeback runs
        meanwhile), except for the oldest of more than :data:`_UNSYNCED_FILES` files left so."""
        try:
            if self._file_check is not None:
                self._file_check.close()
            if self._fd >= 0:
                self._unsynced.append((self._fd, self._path))
            while len(self._unsynced) > _UNSYNCED_FILES:
                self._sync_oldest()
        except BaseException as exc:
            self._error = self._error or exc
        finally:
            self._fd, self._file_check = -1, None

    def _sync_oldest(self) -> None:
        fd, path = self._unsynced.popleft()
        try:
            if self._writing():
                self.problem = _synced(functools.partial(os.fsync, fd), path)
        finally:
            os.close(fd)

    def finish(self, manifest: bytes) -> str:
        """After the last file: every file fsynced, then the manifest and the directories; why
        the copy is not usable, or ``""``."""
        if self._error is not None:
            raise self._error
        while self._unsynced:
            self._sync_oldest()
        if self.check is None or self.problem:
            return self.problem
        problem = _named(self.check.finish()) or _write_manifest(self.incoming, manifest)
        for directory in sorted(self.directories, reverse=True):
            problem = problem or _synced(functools.partial(fsync_path, directory), directory)
        if not problem and self.check.bases:  # pieces in base snapshots: verify the whole copy with them
            problem = _verified(self.incoming)
        return problem

    def release(self) -> None:
        """Close every file still open (the copy is abandoned, or :meth:`finish` has run)."""
        for fd in [self._fd, *(fd for fd, _ in self._unsynced)]:
            if fd >= 0:
                os.close(fd)
        self._fd = -1
        self._unsynced.clear()


def _arrival_check(manifest: bytes, data_files: list[tuple[str, int]]) -> tuple[ArrivalCheck | None, str]:
    """The check of the copy's data objects, or why the manifest rules the copy out."""
    try:
        metadata = SnapshotMetadata.from_text(manifest)
        if metadata.world_size != 1:
            return None, f"the copy was taken by {metadata.world_size} ranks, not by its owner alone, so it was deleted"
        return ArrivalCheck(metadata, dict(data_files)), ""
    except SnapshotkitError as exc:
        return None, f"the copy does not open as a snapshot, so it was deleted: {exc}"


def _named(problems: Sequence[VerifyProblem]) -> str:
    if not problems:
        return ""
    named = "; ".join(f"{p.location} ({p.kind}): {p.message}" for p in problems[:_PROBLEMS_NAMED])
    more = f"; and {len(problems) - _PROBLEMS_NAMED} more" if len(problems) > _PROBLEMS_NAMED else ""
    return f"the copy failed verification, so it was deleted: {named}{more}"


def _create(incoming: pathlib.Path, relative: str, directories: set[pathlib.Path]) -> tuple[int, str]:
    """A new file at ``incoming / relative`` (its directories made, and noted for the fsync)."""
    path = incoming / relative
    try:
        parents = [incoming / parent for parent in pathlib.PurePosixPath(relative).parents][:-1]
        path.parent.mkdir(parents=True, exist_ok=True)
        directories.update(parents)
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
        return os.open(path, flags, 0o666), ""
    except OSError as exc:
        return -1, f"the receiver could not write {path}: {exc}"


def _write_chunk(fd: int, data: memoryview, offset: int, path: pathlib.Path) -> str:
    """Write ``data`` at ``offset`` and start its writeback; why not, if it could not be written."""
    try:
        pwrite_all(fd, data, offset)
        start_writeback(fd, offset, len(data))
    except OSError as exc:
        return f"the receiver could not write {path}: {exc}"
    return ""


def _write_manifest(incoming: pathlib.Path, manifest: bytes) -> str:
    """The manifest, written last and fsynced (the copy's commit marker, once it is renamed)."""
    fd, problem = _create(incoming, METADATA_FILENAME, set())
    if problem:
        return problem
    path = incoming / METADATA_FILENAME
    try:
        return _write_chunk(fd, memoryview(manifest), 0, path) or _synced(functools.partial(os.fsync, fd), path)
    finally:
        os.close(fd)


def _synced(sync: Callable[[], None], path: pathlib.Path) -> str:
    try:
        sync()
    except OSError as exc:
        return f"the receiver could not fsync {path}: {exc}"
    return ""


def _verified(incoming: pathlib.Path) -> str:
    """Why the copy at ``incoming``, with its bases, is not an intact snapshot, or ``""``."""
    try:
        report = verify_snapshot(str(incoming))
    except (SnapshotkitError, OSError) as exc:
        return f"the copy does not open as a snapshot, so it was deleted: {exc}"
    return _named(report.problems)


def _place(incoming: pathlib.Path, target: pathlib.Path) -> str:
    """Rename the verified copy to ``target`` (leftovers of an uncommitted one there are removed;
    a committed one is kept, and ``incoming`` is left for the caller to remove)."""
    try:
        if _committed(target):
            return ""
        if target.is_symlink() or target.is_file():
            target.unlink()
        elif target.exists():
            shutil.rmtree(target)
        os.rename(incoming, target)
        fsync_path(target.parent)
    except OSError as exc:
        return f"the receiver could not put its copy at {target}: {exc}"
    return ""
