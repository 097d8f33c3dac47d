"""A node's local root: where the fast-recovery tier keeps each rank's copies, and how they go.

Layout (one local root per node, shared by the node's ranks)::

    <local_root>/step_<n>/rank_<r>/             a committed copy: rank r's snapshot of step n
    <local_root>/step_<n>/rank_<r>.incoming-*   a copy being received from a peer (never read)

A copy is a complete snapshotkit snapshot taken by rank ``r`` alone (a process group of one
rank), whether ``r`` took it on this node or a peer sent it here. It is committed when its
manifest is there, exactly as any snapshot is; a copy without one is the leftover of a take or a
transfer that was cut short, and :meth:`LocalRoot.cleanup` removes it.

IMPORTANT: each rank manages only the copies it *owns or holds* (``managed`` owners): ranks that
share a node never delete each other's copies, and a rank never deletes a copy while another
rank may still be writing it. Deletion goes manifest first (:func:`remove_snapshot`), so a
deletion cut short leaves objects that never open as a snapshot.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import re
import shutil
from collections.abc import Callable, Collection, Iterator
from pathlib import Path

from snapshotkit._format.entries import METADATA_FILENAME
from snapshotkit._format.steps import step_dir, step_of
from snapshotkit._lifecycle.removal import remove_snapshot
from snapshotkit._tier.transfer import INCOMING_INFIX
from snapshotkit.errors import ConfigError

__all__ = ["LocalCopy", "LocalRoot", "local_root_path"]

_log = logging.getLogger("snapshotkit.manager")
_COPY = re.compile(r"rank_(0|[1-9][0-9]*)")
_INCOMING = re.compile(r"rank_(0|[1-9][0-9]*)" + re.escape(INCOMING_INFIX) + r"[0-9a-f]+")


def local_root_path(local_root: object) -> Path:
    """``local_root`` as an absolute local path (a plain path or ``file://``).

    Raises:
        ConfigError: a URI of another scheme (the local tier is this node's own storage), or an
            empty path.
        InvalidArgumentError: not a str or os.PathLike.
    """
    from snapshotkit._config import snapshot_path

    text = snapshot_path(local_root)
    if text.lower().startswith("file://"):
        text = text[7:]
    elif "://" in text:
        raise ConfigError(
            f"local_root must be a directory on this node's own storage (a local disk or a RAM-backed file system "
            f"such as /dev/shm), got {text!r}; the durable tier (root) is where object stores go"
        )
    return Path(os.path.abspath(os.path.expanduser(text)))


@dataclasses.dataclass(frozen=True)
class LocalCopy:
    """One committed copy in a local root: ``owner``'s snapshot of ``step`` at ``path``."""

    step: int
    owner: int
    path: Path


class LocalRoot:
    """The copies under one node's local root that one rank manages.

    Args:
        root: the node's local root (:func:`local_root_path`).
        managed: the owners whose copies this rank keeps and deletes here: itself, and the ranks
            whose replicas it holds.
    """

    def __init__(self, root: Path, managed: Collection[int]) -> None:
        self.root = root
        self.managed = frozenset(managed)

    def __repr__(self) -> str:
        return f"LocalRoot({str(self.root)!r}, managed={sorted(self.managed)})"

    def copy_path(self, step: int, owner: int) -> Path:
        """Where ``owner``'s copy of ``step`` lives (committed or not)."""
        return self.root / step_dir(step) / f"rank_{owner}"

    def copies(self) -> list[LocalCopy]:
        """The committed copies under the root, of any owner, by step then owner (listed now).

        A root that does not exist yet holds none."""
        found = [
            LocalCopy(step, owner, path)
            for step, owner, path in self._entries()
            if (path / METADATA_FILENAME).is_file()
        ]
        return sorted(found, key=lambda c: (c.step, c.owner))

    def holdings(self) -> frozenset[tuple[int, int]]:
        """``(step, owner)`` of every committed copy under the root that this rank manages."""
        return frozenset((c.step, c.owner) for c in self.copies() if c.owner in self.managed)

    def steps(self, owner: int) -> list[int]:
        """The steps of ``owner``'s committed copies here, ascending."""
        return sorted(c.step for c in self.copies() if c.owner == owner)

    def cleanup(self) -> list[Path]:
        """Remove what a cut-short local save or transfer of a managed owner left: copies
        without a manifest, incoming directories, and step directories left empty. Returns the
        paths removed."""
        removed: list[Path] = []
        for step_path in self._step_dirs():
            for child in list(step_path.iterdir()):
                incoming = _INCOMING.fullmatch(child.name)
                if incoming is not None and int(incoming.group(1)) in self.managed:
                    shutil.rmtree(child, ignore_errors=True)
                    removed.append(child)
                    continue
                copy = _COPY.fullmatch(child.name)
                if copy is not None and int(copy.group(1)) in self.managed and not (child / METADATA_FILENAME).exists():
                    remove_snapshot(str(child), {})
                    _remove_if_empty(child)
                    removed.append(child)
            _rmdir_if_empty(step_path)  # only if empty: another rank may have just made its copy's directory
        for path in removed:
            _log.info("local tier: removed the incomplete copy %s", path)
        return removed

    def retain(self, keep_last: int) -> list[int]:
        """Keep the newest ``keep_last`` steps of which this rank holds a committed copy; delete
        the managed copies of every older step (manifest first). Returns the steps whose copies
        were deleted, ascending.

        IMPORTANT: nothing at or after the oldest step kept is touched: a newer copy may still be
        being written (an ``async_take`` in flight) and has no manifest yet."""
        steps = sorted({step for step, _ in self.holdings()})
        if len(steps) <= keep_last:
            return []
        oldest_kept = steps[-keep_last]
        deleted: set[int] = set()
        for step, owner, path in self._entries():
            if step >= oldest_kept or owner not in self.managed:
                continue
            remove_snapshot(str(path), {})
            _remove_if_empty(path)
            deleted.add(step)
        for step in deleted:
            _rmdir_if_empty(self.root / step_dir(step))
        if deleted:
            _log.info("local tier %s: deleted the copies of steps %s", self.root, sorted(deleted))
        return sorted(deleted)

    def remove_steps(self, stale: Callable[[int], bool]) -> list[int]:
        """Delete the managed copies, committed or not, of every step for which ``stale(step)`` is
        true (manifest first). Returns those steps, ascending."""
        deleted: set[int] = set()
        for step, owner, path in self._entries():
            if owner in self.managed and stale(step):
                remove_snapshot(str(path), {})
                shutil.rmtree(path, ignore_errors=True)
                deleted.add(step)
        for step in deleted:
            _rmdir_if_empty(self.root / step_dir(step))
        return sorted(deleted)

    def _step_dirs(self) -> Iterator[Path]:
        try:
            children = list(os.scandir(self.root))
        except FileNotFoundError:
            return
        for child in children:
            if child.is_dir(follow_symlinks=False) and step_of(child.name) is not None:
                yield Path(child.path)

    def _entries(self) -> Iterator[tuple[int, int, Path]]:
        """``(step, owner, path)`` of every copy directory (committed or not) under the root."""
        for step_path in self._step_dirs():
            step = step_of(step_path.name)
            assert step is not None  # _step_dirs yields step directories only
            try:
                children = list(os.scandir(step_path))
            except FileNotFoundError:
                continue
            for child in children:
                match = _COPY.fullmatch(child.name)
                if match is not None and child.is_dir(follow_symlinks=False):
                    yield step, int(match.group(1)), Path(child.path)


def _remove_if_empty(path: Path) -> None:
    """Remove the directory ``path`` (a copy this rank manages) if it exists and is empty (its
    subdirectories too, when they are empty); anything else in it stays."""
    try:
        for child in path.iterdir():
            if child.is_dir() and not child.is_symlink():
                _remove_if_empty(child)
        path.rmdir()
    except OSError:
        pass


def _rmdir_if_empty(path: Path) -> None:
    with contextlib.suppress(OSError):
        path.rmdir()
