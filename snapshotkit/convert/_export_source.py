"""The snapshot an export reads: rank 0's view, what ``select=`` picks, and reads under the budget.

An export runs in one process and sees what rank 0 restores: its own state, the replicated
state and every sharded tensor, whole (``docs/format.md`` section 3.6). Every read goes through
the restore pipeline (:mod:`snapshotkit._restore.fetch`): data objects are proven long enough
before anything is allocated or written for them, byte ranges are merged and fetched under the
memory budget (a piece larger than the budget in budget-sized sub-ranges), and every piece's
CRC-32C is verified.
"""

from __future__ import annotations

import dataclasses
import math
import mmap
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from snapshotkit._config import Config
from snapshotkit._format.entries import (
    ContainerEntry,
    DictEntry,
    Entry,
    ListEntry,
    Piece,
    Shard,
    ShardedTensorEntry,
    TensorEntry,
)
from snapshotkit._format.serialization import byte_view, deserialize_object, dtype_from_name
from snapshotkit._plan.flatten import Flattened, inflate, join_path, unescape_key
from snapshotkit._plan.partition import matches_any
from snapshotkit._plan.select import prune
from snapshotkit._restore.bases import open_snapshot_storage
from snapshotkit._restore.failures import open_failure
from snapshotkit._restore.fetch import Claim, PieceRead, check_extents, read_pieces
from snapshotkit._restore.metadata import load_metadata
from snapshotkit._restore.place import LeafLoader
from snapshotkit._restore.plan import close_matches, rank_view
from snapshotkit._runtime.budget import MemoryBudget
from snapshotkit._runtime.loop import run_sync
from snapshotkit._runtime.progress import ByteProgress
from snapshotkit.errors import ConfigError, UnsafeObjectError
from snapshotkit.storage import StoragePlugin, open_storage_plugin

#: Logical path -> why it is not in the output.
Skipped = dict[str, str]
#: Where each new tensor of :func:`fresh_tensors` starts in their shared mapping.
_TENSOR_ALIGNMENT = 64


def fresh_tensors(specs: Mapping[str, tuple[str, tuple[int, ...]]]) -> dict[str, torch.Tensor]:
    """New contiguous tensors (``name -> (dtype name, shape)``) in one anonymous memory mapping.

    The mapping goes back to the system as soon as the last of the tensors is dropped, whatever
    the C allocator would do with freed blocks (glibc keeps large ones in the process, so an export
    reading tensor after tensor through ``torch.empty`` could hold several times its budget).
    """
    layout: dict[str, tuple[int, int]] = {}
    total = 0
    for name, (dtype_name, shape) in specs.items():
        nbytes = math.prod(shape) * dtype_from_name(dtype_name).itemsize
        layout[name] = (total, nbytes)
        total += -(-nbytes // _TENSOR_ALIGNMENT) * _TENSOR_ALIGNMENT
    memory = mmap.mmap(-1, max(total, 1))  # the tensors keep it alive
    tensors: dict[str, torch.Tensor] = {}
    for name, (dtype_name, shape) in specs.items():
        dtype = dtype_from_name(dtype_name)
        offset, nbytes = layout[name]
        if nbytes == 0:
            tensors[name] = torch.empty(shape, dtype=dtype)
            continue
        flat = torch.frombuffer(memory, dtype=torch.uint8, count=nbytes, offset=offset)
        tensors[name] = flat.view(dtype).reshape(shape)
    return tensors


@dataclasses.dataclass(frozen=True)
class Written:
    """What a format writer put out: how many tensors, and the selected leaves it left out (with why)."""

    tensors: int
    skipped: Skipped


LIST_REASON = "part of a list or tuple that is not exported whole (a list cannot be rebuilt with a hole)"


def describe(entry: Entry) -> str:
    """What a leaf holds, for a skip reason: ``"an int"``, ``"an object (builtins.set)"``..."""
    value_type = getattr(entry, "value_type", None)
    if value_type is not None:
        return "None" if value_type == "none" else f"a{'n' if value_type[0] in 'aeiou' else ''} {value_type}"
    obj_type = getattr(entry, "obj_type", None)
    if obj_type is not None:
        return f"an object ({obj_type})"
    if isinstance(entry, (DictEntry, ListEntry)):
        return f"an empty {entry.kind}"
    return f"a {entry.kind}"


@dataclasses.dataclass(frozen=True)
class Tree:
    """Selected state as nested containers, which the torch and DCP exports rebuild.

    Attributes:
        containers: container entries by logical path (dicts cut down to the keys kept).
        leaves: leaf entries by logical path, depth first.
        names: the top-level logical paths (escaped ``app_state`` names) kept, in order.
        top: the container whose content is the output (``strip_prefix`` without its final
            ``/``), or None when the output is a dict of ``app_state`` names.
    """

    containers: dict[str, ContainerEntry]
    leaves: dict[str, Entry]
    names: tuple[str, ...]
    top: str | None

    def build(self, values: Mapping[str, Any]) -> Any:
        """The output: the containers rebuilt around ``values`` (one per leaf)."""
        if self.top is not None:
            return inflate(self.top, self.containers, values)
        return {unescape_key(name): inflate(name, self.containers, values) for name in self.names}

    def without(self, dropped: Mapping[str, str]) -> tuple[Tree, Skipped]:
        """This tree without the ``dropped`` leaves, and what goes with them: the other leaves
        of a list or tuple that lost one (each with its reason)."""
        if not dropped:
            return self, {}
        flat = Flattened(self.containers, self.leaves)
        tree = _prune_tree(flat, self.names, self.top, lambda path: path not in dropped)
        lost = {path: LIST_REASON for path in self.leaves if path not in tree.leaves and path not in dropped}
        return tree, lost


def _prune_tree(flat: Flattened, names: Sequence[str], top: str | None, keeps: Callable[[str], bool]) -> Tree:
    containers: dict[str, ContainerEntry] = {}
    leaves: dict[str, Any] = {}
    kept: list[str] = []
    for root in (top,) if top is not None else names:
        part = prune(flat, root, keeps)
        if part is None:
            continue
        kept.append(root)
        containers.update(part.containers)
        leaves.update(part.leaves)
    if top is not None and not kept:  # the output is still the container, empty
        entry = flat.containers[top]
        containers[top] = DictEntry((), entry.ordered) if isinstance(entry, DictEntry) else type(entry)(0)
    ordered = {path: leaves[path] for path in flat.leaves if path in leaves}
    return Tree(containers, ordered, (top,) if top is not None else tuple(kept), top)


def flatten_view(view: Mapping[str, Entry]) -> tuple[Flattened, tuple[str, ...]]:
    """Rank 0's view split into containers and leaves in depth-first order, and the top-level names."""
    names = tuple(path for path in view if "/" not in path)
    containers: dict[str, ContainerEntry] = {}
    leaves: dict[str, Any] = {}
    for name in names:
        stack = [name]
        while stack:
            path = stack.pop()
            entry = view[path]
            if isinstance(entry, (DictEntry, ListEntry)):
                containers[path] = entry
                keys: Sequence[str | int] = entry.keys if isinstance(entry, DictEntry) else range(entry.length)
                stack.extend(join_path(path, key) for key in reversed(keys))
            else:
                leaves[path] = entry
    return Flattened(containers, leaves), names


def _keeps(patterns: Sequence[str] | None) -> Callable[[str], bool]:
    if patterns is None:
        return lambda path: True
    return lambda path: matches_any(path, patterns)


def _nothing_selected(patterns: Sequence[str] | None, flat: Flattened, path: str) -> ConfigError:
    candidates = [*flat.leaves, *flat.containers]
    wanted = patterns[0] if patterns else ""
    return ConfigError(
        f"select={list(patterns or [])} matches no logical path of the snapshot at {path!r}"
        f"{close_matches(wanted, candidates)}. Patterns are globs over logical paths, '*' also matching '/' "
        "(e.g. 'model/**'); list the paths with Snapshot(path).get_manifest()"
    )


def _lacks_prefix(path: str, strip_prefix: str) -> ConfigError:
    return ConfigError(
        f"the selected logical path {path!r} does not start with strip_prefix={strip_prefix!r}; select only "
        f"paths below it (e.g. select={strip_prefix + '**'!r}) or pass another strip_prefix"
    )


def select_flat(
    view: Mapping[str, Entry], patterns: Sequence[str] | None, strip_prefix: str | None, path: str
) -> dict[str, Entry]:
    """The leaves (an empty container counting as one) that ``patterns`` select, depth first.

    Raises:
        ConfigError: nothing is selected, or a selected path does not start with ``strip_prefix``
            or is nothing but it.
    """
    flat, _ = flatten_view(view)
    selected = {p: e for p, e in _selectable(flat) if _keeps(patterns)(p)}
    if not selected:
        raise _nothing_selected(patterns, flat, path)
    if strip_prefix is not None:
        for logical_path in selected:
            if not logical_path.startswith(strip_prefix) or logical_path == strip_prefix:
                raise _lacks_prefix(logical_path, strip_prefix)
    return selected


def _children(entry: Entry) -> int:
    return len(entry.keys) if isinstance(entry, DictEntry) else entry.length if isinstance(entry, ListEntry) else 0


def _selectable(flat: Flattened) -> list[tuple[str, Entry]]:
    """What ``select=`` patterns are matched against: the leaves, and the empty containers."""
    return [*flat.leaves.items(), *((p, e) for p, e in flat.containers.items() if not _children(e))]


def select_tree(
    view: Mapping[str, Entry], patterns: Sequence[str] | None, strip_prefix: str | None, path: str
) -> tuple[Tree, Skipped]:
    """The selected state as a :class:`Tree`, and the selected leaves the list rule leaves out.

    With ``strip_prefix`` (a container's logical path and ``/``), the output is that container.

    Raises:
        ConfigError: nothing is selected; ``strip_prefix`` does not name a container followed by
            ``/``; a selected path lies outside it.
    """
    flat, names = flatten_view(view)
    keeps = _keeps(patterns)
    top: str | None = None
    if strip_prefix is not None:
        top = strip_prefix.removesuffix("/")
        if not strip_prefix.endswith("/") or top not in flat.containers:
            why = (
                "it does not end with '/'"
                if not strip_prefix.endswith("/")
                else f"{top!r} is a leaf"
                if top in flat.leaves
                else f"{top!r} is not in the snapshot{close_matches(top, flat.containers)}"
            )
            raise ConfigError(
                f"strip_prefix={strip_prefix!r} must be the logical path of a container followed by '/' (e.g. "
                f"'model/'), whose content becomes the output, but {why}. To strip part of a key, export "
                "to='safetensors'"
            )
        for logical_path, _ in _selectable(flat):
            if keeps(logical_path) and not logical_path.startswith(strip_prefix):
                raise _lacks_prefix(logical_path, strip_prefix)
    tree = _prune_tree(flat, names, top, keeps)
    if not tree.leaves and not any(not _children(flat.containers[p]) for p in tree.containers):
        raise _nothing_selected(patterns, flat, path)
    lost = {p: LIST_REASON for p in flat.leaves if keeps(p) and p not in tree.leaves}
    return tree, lost


class Source:
    """An open snapshot for one export: its metadata, rank 0's view, and one storage plugin for
    every read (closed by :meth:`close`)."""

    def __init__(self, path: str, storage_options: Mapping[str, Any], config: Config, weights_only: bool) -> None:
        options = dict(storage_options)
        self.path = path
        self.config = config
        self.weights_only = weights_only
        self.metadata = load_metadata(lambda: open_storage_plugin(path, options), path)
        bases = self.metadata.bases
        self._open: Callable[[], StoragePlugin] = lambda: open_snapshot_storage(path, options, bases)
        self.view = rank_view(self.metadata, 0)
        self._plugin: StoragePlugin | None = None
        #: Counts the bytes of the pieces read (the export's bar; its total is not known up front).
        self.progress = ByteProgress(path, enabled=False)

    def close(self) -> None:
        plugin, self._plugin = self._plugin, None
        if plugin is not None:
            run_sync(plugin.close())

    def _storage(self) -> StoragePlugin:
        if self._plugin is None:
            try:
                self._plugin = self._open()
            except Exception as exc:
                raise open_failure(exc, self.path)  # noqa: B904 - the cause is set by open_failure
        return self._plugin

    def prove(self, claims: Sequence[Claim]) -> int:
        """Check that the data objects hold the claimed pieces, before anything is allocated or
        written for them (one byte read per data object; that count is returned).

        Raises:
            TruncatedDataError: a data object ends before a claimed piece does.
            IntegrityError: a claimed data object is missing.
        """
        io_concurrency = self.config.io_concurrency
        return int(run_sync(check_extents(self._storage(), claims, io_concurrency=io_concurrency)))

    def read(self, reads: Sequence[PieceRead], *, budget_bytes: int | None = None) -> int:
        """Fetch ``reads`` (merged, verified) with at most ``budget_bytes`` of bounce buffers and
        gaps at once (default: the export's budget); the bytes read from storage."""
        config = self.config
        budget = MemoryBudget(budget_bytes or config.memory_budget_bytes)
        on_bytes = self.progress.advance if self.progress.enabled else None
        fetch = read_pieces(
            self._storage(),
            reads,
            budget=budget,
            io_concurrency=config.io_concurrency,
            verify=config.verify_checksums,
            on_bytes=on_bytes,
        )
        return int(run_sync(fetch))

    def read_tensors(self, entries: Mapping[str, TensorEntry | ShardedTensorEntry]) -> dict[str, torch.Tensor]:
        """New tensors holding raw tensor and sharded tensor entries (the latter assembled whole),
        read in one pipeline straight into their memory (:func:`fresh_tensors`)."""
        claims = [
            Claim(path, piece, True)
            for path, entry in entries.items()
            for piece in (
                entry.pieces if isinstance(entry, TensorEntry) else [p for s in entry.shards for p in s.pieces]
            )
            if piece.nbytes
        ]
        self.prove(claims)
        tensors = fresh_tensors({path: (entry.dtype, entry.shape) for path, entry in entries.items()})
        loader = LeafLoader(weights_only=self.weights_only)
        for path, entry in entries.items():
            loader.add(path, entry, tensors[path])  # in place: the reads fill the new memory directly
        self.read(loader.reads)
        return tensors

    def read_shard(self, logical_path: str, dtype_name: str, shard: Shard) -> torch.Tensor:
        """A new tensor holding one stored shard (box) of a sharded tensor, read straight into it."""
        self.prove([Claim(logical_path, piece, True) for piece in shard.pieces if piece.nbytes])
        tensor = fresh_tensors({logical_path: (dtype_name, shard.sizes)})[logical_path]
        view, offset, reads = byte_view(tensor), 0, []
        for piece in shard.pieces:
            reads.append(PieceRead(piece, logical_path, direct=view[offset : offset + piece.nbytes]))
            offset += piece.nbytes
        self.read(reads)
        return tensor

    def load_blobs(self, pieces: Mapping[str, Piece]) -> tuple[dict[str, Any], Skipped]:
        """Load ``torch.save`` payloads (objects, ``torch_save`` tensors) under the ``weights_only``
        rule of restore: what loads, and what ``weights_only=True`` refused, with the reason."""
        loaded: dict[str, Any] = {}
        refused: Skipped = {}
        weights_only = self.weights_only

        def consumer(logical_path: str) -> Callable[[int, memoryview], None]:
            def consume(offset: int, data: memoryview) -> None:
                try:
                    loaded[logical_path] = deserialize_object(
                        data, weights_only=weights_only, logical_path=logical_path
                    )
                except UnsafeObjectError as exc:
                    cause = str(exc.__cause__ or exc).splitlines()[0]
                    refused[logical_path] = (
                        f"does not load with weights_only=True ({cause}); pass weights_only=False to export it "
                        "from a snapshot you trust"
                    )

            return consume

        reads = [PieceRead(piece, path, consume=consumer(path)) for path, piece in pieces.items()]
        claims = [Claim(path, piece, False) for path, piece in pieces.items() if piece.nbytes]
        self.prove(claims)
        self.read(reads)
        return loaded, refused
