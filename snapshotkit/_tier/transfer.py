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
3. body: every file in the header's order (the manifest last), in messages of at most
   ``chunk_bytes`` through one buffer reused for the whole round.
4. trailer, sender to receiver: ``{"ok", "reason"}``, false when a file could not be read in full
   (the bytes sent in its place were padding, so that both sides stay in step).
5. outcome, receiver to sender: ``{"ok", "reason"}``, once the copy is verified and in place.

IMPORTANT: the receiver writes into a fresh ``<target>.incoming-<16 hex>`` beside the target
(:func:`is_incoming` recognizes the name, for the local root's clean-up), fsyncs every file and
directory, verifies every checksum (:func:`~snapshotkit.verify.verify_snapshot`) and only then
renames it to the target. A target path is therefore either absent or a complete, verified copy;
a receiver killed midway leaves at most an incoming directory.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import os
import pathlib
import re
import secrets
import shutil
import stat
from collections.abc import Callable, Sequence
from typing import Any

from snapshotkit._dist import Group, resolve_group
from snapshotkit._format.pieces import METADATA_FILENAME
from snapshotkit.errors import ConfigError, InvalidArgumentError, SnapshotkitError
from snapshotkit.snapshot import Snapshot
from snapshotkit.verify import verify_snapshot

__all__ = ["INCOMING_INFIX", "Transfer", "TransferOutcome", "is_incoming", "send_and_receive"]

#: What separates the target's name from the random part in the name of an incoming copy.
INCOMING_INFIX = ".incoming-"
_INCOMING = re.compile(r".+" + re.escape(INCOMING_INFIX) + r"[0-9a-f]{16}")

#: Problems of a damaged copy named in an outcome's reason (the rest are counted).
_PROBLEMS_NAMED = 3


@dataclasses.dataclass(frozen=True)
class Transfer:
    """One copy to make: ``owner``'s snapshot of ``step``, from the sender's local root into the receiver's.

    Attributes:
        step: the training step of the snapshot.
        owner: the rank whose state the snapshot holds.
        sender: the rank that reads the copy from its node's local root and sends it.
        receiver: the rank that receives it and writes it into its node's local root.

    Every rank is a rank of the process group passed to :func:`send_and_receive`.
    """

    step: int
    owner: int
    sender: int
    receiver: int


@dataclasses.dataclass(frozen=True)
class TransferOutcome:
    """How one transfer ended (on its sender and its receiver alike).

    Attributes:
        transfer: the transfer.
        ok: whether the receiver now holds a committed, verified copy at its target (a copy it
            already held counts).
        reason: why not, when not ``ok`` (the source is not a committed snapshot, the copy failed
            verification, the receiver could not write); empty when ``ok``.
    """

    transfer: Transfer
    ok: bool
    reason: str = ""


def is_incoming(name: str) -> bool:
    """Whether ``name`` (a file name, no directory) is that of a copy still being received:
    ``<target name>.incoming-<16 hex digits>``. One whose receiver died stays behind; nothing
    else reads it, and the local root's clean-up removes it."""
    return _INCOMING.fullmatch(name) is not None


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
        chunk_bytes: the largest message of file bytes (the one buffer this rank holds for them).
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
    buffer: Any = None
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
        if buffer is None:
            import torch

            buffer = torch.empty(chunk_bytes, dtype=torch.uint8)
        if rank == transfer.sender:
            outcomes.append(_send(group, transfer, source_dir(transfer), buffer))
        else:
            outcomes.append(_receive(group, transfer, target_dir(transfer), buffer))
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


def _what(transfer: Transfer) -> str:
    return (
        f"copying rank {transfer.owner}'s snapshot of step {transfer.step} "
        f"from rank {transfer.sender} to rank {transfer.receiver}"
    )


# ------------------------------------------------------------------ messages


def _send_json(group: Group, peer: int, message: dict[str, Any], what: str) -> None:
    import torch

    data = json.dumps(message).encode()
    group.send_to(torch.tensor([len(data)], dtype=torch.int64), peer, what)
    group.send_to(torch.frombuffer(bytearray(data), dtype=torch.uint8), peer, what)


def _receive_json(group: Group, peer: int, what: str) -> dict[str, Any]:
    import torch

    length = torch.zeros(1, dtype=torch.int64)
    group.receive_from(length, peer, what)
    data = torch.empty(int(length.item()), dtype=torch.uint8)
    group.receive_from(data, peer, what)
    message = json.loads(data.numpy().tobytes())
    return message if isinstance(message, dict) else {}


def _ok_reason(message: dict[str, Any]) -> tuple[bool, str]:
    ok = message.get("ok") is True
    return ok, "" if ok else str(message.get("reason") or "the peer gave no reason")


# ------------------------------------------------------------------ the sender


def _send(group: Group, transfer: Transfer, source: pathlib.Path, buffer: Any) -> TransferOutcome:
    what = _what(transfer)
    peer = transfer.receiver
    try:
        files, unavailable = _listing(source)
    except OSError as exc:  # the snapshot changed while it was listed (removed by retention)
        files, unavailable = [], f"the sender could not list its snapshot at {source}: {exc}"
    header = {"available": not unavailable, "reason": unavailable, "files": [[p, s] for p, s in files]}
    _send_json(group, peer, header, what)
    if unavailable:
        return TransferOutcome(transfer, False, unavailable)
    reply = _receive_json(group, peer, what)
    if reply.get("send") is not True:
        return TransferOutcome(transfer, *_ok_reason(reply))
    problems = [_send_file(group, peer, source, relative, size_bytes, buffer, what) for relative, size_bytes in files]
    problems = [problem for problem in problems if problem]
    _send_json(group, peer, {"ok": not problems, "reason": "; ".join(problems)}, what)
    return TransferOutcome(transfer, *_ok_reason(_receive_json(group, peer, what)))


def _listing(source: pathlib.Path) -> tuple[list[tuple[str, int]], str]:
    """Every file of the snapshot at ``source`` as ``(relative path, size)``, the manifest last;
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
    files.sort(key=lambda file: (file[0] == METADATA_FILENAME, file[0]))
    return files, ""


def _raise(error: OSError) -> None:
    raise error


def _send_file(
    group: Group, peer: int, source: pathlib.Path, relative: str, size_bytes: int, buffer: Any, what: str
) -> str:
    """Send ``size_bytes`` of the file, padding in place of what cannot be read; say why there was any."""
    path = source / relative
    view = memoryview(buffer.numpy())
    file = None
    problem = ""
    try:
        file = open(path, "rb", buffering=0, opener=_open_no_follow)  # noqa: SIM115 - closed below
    except OSError as exc:
        problem = f"the sender could not read {path}: {exc}"
    try:
        offset = 0
        while offset < size_bytes:
            n = min(len(view), size_bytes - offset)
            filled = 0
            if file is not None and not problem:
                filled, problem = _fill(file, view[:n], path, offset, size_bytes)
            if filled < n:
                buffer[filled:n].zero_()
            group.send_to(buffer[:n], peer, what)
            offset += n
    finally:
        if file is not None:
            file.close()
    return problem


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


# ------------------------------------------------------------------ the receiver


def _receive(group: Group, transfer: Transfer, target: pathlib.Path, buffer: Any) -> TransferOutcome:
    what = _what(transfer)
    peer = transfer.sender
    header = _receive_json(group, peer, what)
    if header.get("available") is not True:
        return TransferOutcome(transfer, False, str(header.get("reason") or "the sender cannot send it"))
    files, refused = _checked_files(header.get("files"))
    if not refused and _committed(target):
        _send_json(group, peer, {"send": False, "ok": True, "reason": ""}, what)
        return TransferOutcome(transfer, True)
    incoming = None
    if not refused:
        try:
            incoming = _make_incoming(target)
        except OSError as exc:
            refused = f"the receiver could not create a directory beside {target}: {exc}"
    if incoming is None:
        _send_json(group, peer, {"send": False, "ok": False, "reason": refused}, what)
        return TransferOutcome(transfer, False, refused)
    try:
        _send_json(group, peer, {"send": True}, what)
        problem = _receive_files(group, peer, incoming, files, buffer, what)
        _, sent_problem = _ok_reason(_receive_json(group, peer, what))
        problem = sent_problem or problem or _verified(incoming) or _place(incoming, target)
    finally:
        if incoming.exists():  # not placed: a damaged copy, or the sender was lost midway
            shutil.rmtree(incoming, ignore_errors=True)
    _send_json(group, peer, {"ok": not problem, "reason": problem}, what)
    return TransferOutcome(transfer, not problem, problem)


def _checked_files(raw: object) -> tuple[list[tuple[str, int]], str]:
    """The header's file list, or why it is refused (a path that could leave the copy's directory)."""
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


def _receive_files(
    group: Group, peer: int, incoming: pathlib.Path, files: list[tuple[str, int]], buffer: Any, what: str
) -> str:
    """Receive every file into ``incoming`` and fsync it; why not, if something could not be
    written (every byte is received all the same, so that both sides stay in step)."""
    view = memoryview(buffer.numpy())
    directories = {incoming}
    problem = ""
    for relative, size_bytes in files:
        path = incoming / relative
        fd = -1
        if not problem:
            try:
                parents = [incoming / parent for parent in pathlib.PurePosixPath(relative).parents][:-1]
                path.parent.mkdir(parents=True, exist_ok=True)
                directories.update(parents)
                flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
                fd = os.open(path, flags, 0o666)
            except OSError as exc:
                problem = f"the receiver could not write {path}: {exc}"
        try:
            offset = 0
            while offset < size_bytes:
                n = min(len(view), size_bytes - offset)
                group.receive_from(buffer[:n], peer, what)
                if fd >= 0 and not problem:
                    problem = _write_all(fd, view[:n], path)
                offset += n
            if fd >= 0 and not problem:
                problem = _synced(functools.partial(os.fsync, fd), path)
        finally:
            if fd >= 0:
                os.close(fd)
    for directory in sorted(directories, reverse=True):
        problem = problem or _synced(functools.partial(_fsync_dir, directory), directory)
    return problem


def _write_all(fd: int, data: memoryview, path: pathlib.Path) -> str:
    try:
        written = 0
        while written < len(data):
            written += os.write(fd, data[written:])
    except OSError as exc:
        return f"the receiver could not write {path}: {exc}"
    return ""


def _synced(sync: Callable[[], None], path: pathlib.Path) -> str:
    try:
        sync()
    except OSError as exc:
        return f"the receiver could not fsync {path}: {exc}"
    return ""


def _fsync_dir(path: pathlib.Path) -> None:
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _verified(incoming: pathlib.Path) -> str:
    """Why the copy at ``incoming`` is not an intact snapshot of one rank, or ``""``.

    Reads no process group: the copy was taken by a group of its owner alone (world size 1)."""
    try:
        report = verify_snapshot(str(incoming))
        world_size = Snapshot(str(incoming)).metadata.world_size
    except (SnapshotkitError, OSError) as exc:
        return f"the copy does not open as a snapshot, so it was deleted: {exc}"
    if not report.ok:
        named = "; ".join(
            f"{problem.location} ({problem.kind}): {problem.message}" for problem in report.problems[:_PROBLEMS_NAMED]
        )
        more = f"; and {len(report.problems) - _PROBLEMS_NAMED} more" if len(report.problems) > _PROBLEMS_NAMED else ""
        return f"the copy failed verification, so it was deleted: {named}{more}"
    if world_size != 1:
        return f"the copy was taken by {world_size} ranks, not by its owner alone, so it was deleted"
    return ""


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
        _fsync_dir(target.parent)
    except OSError as exc:
        return f"the receiver could not put its copy at {target}: {exc}"
    return ""
