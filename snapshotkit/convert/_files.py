"""Tensors over byte ranges of a source's local files: mapped, not read.

An import builds its whole app_state before the take starts, so a tensor read into memory would
stay there until the take ends. Mapped instead (the way ``torch.load(mmap=True)`` maps a file,
copy-on-write), a tensor's bytes are only paged in while the take writes them, and those pages
belong to the file: the kernel can drop them again, so an import needs about the take's memory
budget whatever the checkpoint's size.

Every name a source's metadata gives is resolved inside the source's directory first: no
absolute paths, no ``..``, regular files only. Symlinks are followed: the Hugging Face cache links
every file of a model's directory to a blob elsewhere, and whoever made the directory chose them.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

import torch

from snapshotkit.errors import ImportSourceError


class MappedFiles:
    """The files of one source, each mapped once (lazily) and shared by the tensors viewing it.

    Args:
        root: the directory names are resolved in.
        source: the source as the user named it, for messages.
    """

    def __init__(self, root: Path, source: Path) -> None:
        self._root = root
        self._source = source
        self._storages: dict[Path, torch.UntypedStorage] = {}
        self._sizes: dict[Path, int] = {}

    def resolve(self, name: str, what: str) -> Path:
        """The regular file ``name`` (relative, ``/``-separated) names inside the root.

        Raises:
            ImportSourceError: the name is not a plain relative path, or names no regular file.
        """
        parts = name.split("/")
        if not name or name.startswith("/") or "\\" in name or any(part in ("", ".", "..") for part in parts):
            raise ImportSourceError(
                f"{self._source}: {what} names the file {name!r}, which is not a plain relative path inside "
                f"{self._root}; the checkpoint is corrupt or crafted"
            )
        path = self._root.joinpath(*parts)
        if not path.is_file():
            raise ImportSourceError(
                f"{self._source}: {what} is stored in {name!r}, which is missing or not a regular file; the "
                "checkpoint is incomplete (copy all of its files)"
            )
        return path

    def size_bytes(self, path: Path) -> int:
        """The size of a file (as resolved by :meth:`resolve`)."""
        if path not in self._sizes:
            self._sizes[path] = os.path.getsize(path)
        return self._sizes[path]

    def _storage(self, path: Path) -> torch.UntypedStorage:
        if path not in self._storages:
            # shared=False maps the file privately (copy-on-write): nothing is ever written back.
            mapped: Any = torch.UntypedStorage.from_file(os.fspath(path), False, self.size_bytes(path))
            self._storages[path] = mapped
        return self._storages[path]

    def check_range(self, path: Path, start: int, end: int, what: str) -> None:
        """Refuse a byte range ``[start, end)`` that is not inside the file."""
        size = self.size_bytes(path)
        if not (0 <= start <= end <= size):
            raise ImportSourceError(
                f"{self._source}: {what} is at bytes [{start}, {end}) of {path.name!r}, which has {size} bytes; the "
                "file is truncated or the checkpoint is corrupt"
            )

    def tensor(self, path: Path, start: int, dtype: torch.dtype, shape: tuple[int, ...], what: str) -> torch.Tensor:
        """A contiguous tensor of ``dtype`` and ``shape`` whose elements are the file's bytes from ``start``.

        Mapped when ``start`` is a multiple of the element size (always, in practice); otherwise
        copied into fresh memory (a tensor's elements must be aligned).
        """
        itemsize = torch.empty((), dtype=dtype).element_size()
        numel = math.prod(shape)
        end = start + numel * itemsize
        self.check_range(path, start, end, what)
        if numel == 0:
            return torch.empty(shape, dtype=dtype)
        strides = _contiguous_strides(shape)
        if start % itemsize == 0:
            return torch.empty(0, dtype=dtype).set_(self._storage(path), start // itemsize, shape, strides)
        raw = torch.empty(0, dtype=torch.uint8).set_(self._storage(path), start, (end - start,), (1,))
        out = torch.empty(shape, dtype=dtype)
        out.view(-1).view(torch.uint8).copy_(raw)
        return out

    def read_bytes(self, path: Path, start: int, end: int, what: str) -> bytes:
        """The bytes ``[start, end)`` of a file, read (for small things: objects, headers)."""
        self.check_range(path, start, end, what)
        with open(path, "rb") as f:
            f.seek(start)
            data = f.read(end - start)
        if len(data) != end - start:  # the file shrank meanwhile
            self.check_range(path, start, start + len(data) + 1, what)
        return data

    def storage_window(self, path: Path, start: int, end: int, what: str) -> torch.UntypedStorage:
        """The bytes ``[start, end)`` of a file as an untyped storage over its mapping."""
        self.check_range(path, start, end, what)
        window: torch.UntypedStorage = self._storage(path)[start:end]
        return window


def _contiguous_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    strides: list[int] = []
    step = 1
    for size in reversed(shape):
        strides.append(step)
        step *= max(size, 1)
    return tuple(reversed(strides))
