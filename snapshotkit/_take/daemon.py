"""The checkpoint daemon of ``async_take(executor="process")``.

``async_take`` starts it as a fresh interpreter through a small bootstrap that first lowers the
process's scheduling priority (so every thread, torch's included, inherits it and the daemon uses
only CPU time the trainer leaves idle), then calls :func:`main` with the socket's ``fd`` as the
first argument. It reads messages from the socket ``fd``
(a :class:`multiprocessing.connection.Connection`): first the runtime storage-plugin
registrations to repeat, then ``("write", job, path, storage_options, location,
shared_memory_name, nbytes, slots, io_concurrency, reuse)`` for each staged data object
(``slots``: the ``(offset, nbytes)`` of each piece; ``reuse``: an incremental take's
:class:`~snapshotkit._take.reuse.ReuseIndex`, or None),
``("segment", name)`` followed by the segment's file descriptor (``SCM_RIGHTS``: the trainer
unlinks every segment's name as soon as it made it, so a kill -9 of the whole process group
leaves nothing in ``/dev/shm``; sent once, before the first write from it), ``("release", name)``,
``("stop",)``. For each write it checksums the staged bytes in the
shared-memory segment, writes them with the storage plugin for ``path`` (at most
``io_concurrency`` writes at once) and answers ``("done", job, pieces)`` (the final piece of each
slot, in order: :func:`~snapshotkit._take.reuse.decide`, then
:meth:`~snapshotkit._take.reuse.Layout.finish` beside the write) or
``("error", job, exception, text)``. It exits when told to or when the trainer goes away.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import mmap
import multiprocessing.connection
import os
import sys
import threading
import traceback
from multiprocessing import reduction
from typing import Any

from snapshotkit._dist import portable
from snapshotkit._format.pieces import Piece
from snapshotkit._runtime.frames import drop_frames
from snapshotkit._take.reuse import ReuseIndex, decide
from snapshotkit._take.writers import plugin_key
from snapshotkit.storage import StoragePlugin, open_storage_plugin, register_storage_plugin
from snapshotkit.storage._registry import split_uri


class _Segment:
    """A shared-memory segment the trainer sent as a file descriptor, mapped here."""

    def __init__(self, fd: int) -> None:
        try:
            self._map = mmap.mmap(fd, os.fstat(fd).st_size)
        finally:
            os.close(fd)  # the mapping keeps the memory
        self.buf: memoryview | None = memoryview(self._map)

    def close(self) -> None:
        """Unmap; BufferError while a view of :attr:`buf` is still exported."""
        if self.buf is not None:
            self.buf.release()
            self.buf = None
        self._map.close()


def serve(connection: multiprocessing.connection.Connection) -> None:
    """Write staged objects from shared memory until told to stop."""
    import torch

    torch.set_num_threads(1)
    for scheme, factory in connection.recv().items():
        register_storage_plugin(scheme, factory)
    loop = asyncio.new_event_loop()
    plugins: dict[tuple[str, str], StoragePlugin] = {}
    retired: list[StoragePlugin] = []
    segments: dict[str, _Segment] = {}  # the receiving thread adds, the loop uses, both remove
    slots: dict[int, asyncio.Semaphore] = {}
    send_lock = threading.Lock()

    def reply(message: tuple[Any, ...]) -> None:
        with send_lock:
            connection.send(message)

    async def write(
        job: int,
        path: str,
        options: dict[str, Any],
        location: str,
        name: str,
        nbytes: int,
        pieces: Any,
        io_concurrency: int,
        reuse: ReuseIndex | None,
    ) -> None:
        semaphore = slots.get(io_concurrency)
        if semaphore is None:
            semaphore = slots[io_concurrency] = asyncio.Semaphore(io_concurrency)
        try:
            async with semaphore:
                written = await write_one(path, options, location, name, nbytes, pieces, reuse)
            reply(("done", job, written))
        except BaseException as exc:  # reported to the trainer, which raises it from wait()
            text = "".join(traceback.format_exception_only(type(exc), exc)).strip()
            reply(("error", job, portable(exc), text))
            # The frames of the failed write (the plugin's among them) hold views of the shared
            # memory segment; left to the garbage collector, they make closing it raise BufferError.
            drop_frames(exc)

    async def write_one(
        path: str, options: dict[str, Any], location: str, name: str, nbytes: int, pieces: Any, reuse: Any
    ) -> tuple[Piece, ...]:
        key = plugin_key(path, options)
        plugin = plugins.get(key)
        if plugin is None:
            plugin = plugins[key] = open_storage_plugin(path, options)
        segment = segments[name]  # its descriptor came before the first write from it
        assert segment.buf is not None
        view = segment.buf[:nbytes]
        views = [view[offset : offset + size] for offset, size in pieces]
        try:
            layout = await loop.run_in_executor(None, decide, location, views, reuse)
            finishing = loop.run_in_executor(None, layout.finish)  # checksums and hashes beside the write
            try:
                if layout.buffers:
                    await plugin.write(location, layout.buffers)
            finally:
                written: tuple[Piece, ...] = await finishing  # the thread reads the segment: wait for it
            del layout  # its buffers are views of the segment: gone before the views are released
        finally:
            for piece_view in views:
                piece_view.release()
            view.release()
        return written

    async def close_segment(segment: _Segment) -> None:
        # On the loop, after the writes that used it (they finished before the trainer freed it).
        try:
            segment.close()
        except BufferError:  # views only reference cycles still hold (a failed write's frames)
            gc.collect()
            with contextlib.suppress(BufferError):
                segment.close()

    def retire(scheme: str) -> None:
        """Stop reusing the plugins of a scheme registered anew (a write may still use one: closed at exit)."""
        for key in [key for key in plugins if split_uri(key[0])[0] == scheme]:
            retired.append(plugins.pop(key))

    def receive() -> None:
        while True:
            try:
                message = connection.recv()
            except (EOFError, OSError):
                break
            if message[0] == "stop":
                break
            if message[0] == "register":  # plugins registered in the trainer after this daemon started
                for scheme, factory in message[1].items():
                    register_storage_plugin(scheme, factory)
                    loop.call_soon_threadsafe(retire, scheme.lower())  # on the loop, before the next write
                continue
            if message[0] == "segment":
                segments[message[1]] = _Segment(reduction.recv_handle(connection))
                continue
            if message[0] == "release":  # the trainer freed a pooled segment: unmap it
                segment = segments.pop(message[1], None)
                if segment is not None:
                    asyncio.run_coroutine_threadsafe(close_segment(segment), loop)
                continue
            asyncio.run_coroutine_threadsafe(write(*message[1:]), loop)
        loop.call_soon_threadsafe(loop.stop)

    threading.Thread(target=receive, name="snapshotkit-daemon-reader", daemon=True).start()
    loop.run_forever()
    for plugin in [*plugins.values(), *retired]:
        loop.run_until_complete(plugin.close())
    gc.collect()  # views of the segments that only reference cycles still hold
    for segment in segments.values():
        segment.close()


def main() -> None:
    serve(multiprocessing.connection.Connection(int(sys.argv[1])))


if __name__ == "__main__":
    main()
