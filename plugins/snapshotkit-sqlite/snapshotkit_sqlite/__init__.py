"""An example out-of-tree snapshotkit storage plugin: snapshot objects as BLOB rows in SQLite.

URIs are ``sqlite:///abs/path/snap.sqlite`` or ``sqlite://relative/path/snap.sqlite`` (relative
to the working directory): everything after ``sqlite://`` is the path of the database file, and
one database file holds one snapshot. Each object is one row of
``objects(location TEXT PRIMARY KEY, data BLOB NOT NULL)``.

The package declares the plugin in the ``snapshotkit.storage_plugins`` entry-point group, so
once it is installed ``Snapshot.take("sqlite:///tmp/run.sqlite", app_state)`` finds it.
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import threading
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from snapshotkit.errors import ConfigError
from snapshotkit.storage import ByteRange, Capabilities, StoragePlugin

if TYPE_CHECKING:
    from typing_extensions import Buffer

__all__ = ["SQLiteStoragePlugin"]

_SCHEMA = "CREATE TABLE IF NOT EXISTS objects (location TEXT PRIMARY KEY, data BLOB NOT NULL)"
_INSERT = "INSERT INTO objects (location, data) VALUES (?, zeroblob(?))"
_REPLACE = "INSERT OR REPLACE INTO objects (location, data) VALUES (?, zeroblob(?))"


def _views(data: Buffer | Sequence[Buffer]) -> list[memoryview]:
    """``write``'s argument as flat byte views of the caller's buffers, without copying them."""
    items = data if isinstance(data, Sequence) and not isinstance(data, (bytes, bytearray, memoryview)) else [data]
    return [memoryview(item).cast("B") for item in items]


@contextlib.contextmanager
def _transaction(connection: sqlite3.Connection, begin: str = "BEGIN") -> Iterator[None]:
    """Run the block in one transaction: committed (durably) if it returns, rolled back if it raises."""
    connection.execute(begin)
    try:
        yield
    except BaseException:
        if connection.in_transaction:
            connection.rollback()
        raise
    connection.commit()


class SQLiteStoragePlugin(StoragePlugin):
    """Snapshot objects as BLOB rows of one SQLite database file (WAL mode, ``synchronous=FULL``).

    Objects are written and read in place with SQLite's incremental BLOB I/O, so a ranged read
    touches only the pages of that range. Calls run in worker threads (``asyncio.to_thread``)
    on one connection guarded by a lock. A read, delete or list of a database file that does not
    exist raises or returns as for a missing object without creating the file.

    Args:
        root: path of the database file (the URI without ``sqlite://``).
        storage_options: ``{"timeout": seconds}`` to wait for another process's write lock
            (default 60).

    Raises:
        ConfigError: an unknown storage option, or no usable database path.
    """

    capabilities = Capabilities(atomic_exclusive_write=True, listing=True)

    def __init__(self, root: str, storage_options: Mapping[str, Any] | None = None) -> None:
        options = dict(storage_options or {})
        self.timeout = float(options.pop("timeout", 60.0))
        if options:
            raise ConfigError(f"unknown sqlite:// storage_options {sorted(options)}; only 'timeout' is supported")
        if not root or root == ":memory:":
            raise ConfigError(f"sqlite:// needs the path of a database file, not {root!r}")
        self.path = Path(root).absolute()
        self._connection: sqlite3.Connection | None = None
        self._lock = threading.Lock()

    def _connect(self, *, create: bool) -> sqlite3.Connection | None:
        """The shared connection (call with the lock held); None if the file is missing and not ``create``."""
        if self._connection is None:
            if not create and not self.path.is_file():
                return None
            self.path.parent.mkdir(parents=True, exist_ok=True)
            # isolation_level=None: no implicit transactions; _transaction() opens them explicitly.
            connection = sqlite3.connect(self.path, timeout=self.timeout, isolation_level=None, check_same_thread=False)
            connection.execute("PRAGMA journal_mode=WAL")
            connection.execute("PRAGMA synchronous=FULL")  # a commit survives power loss
            connection.execute(_SCHEMA)
            self._connection = connection
        return self._connection

    def _put(self, location: str, views: list[memoryview], *, replace: bool) -> None:
        with self._lock:
            connection = self._connect(create=True)
            assert connection is not None
            size = sum(view.nbytes for view in views)
            with _transaction(connection, "BEGIN IMMEDIATE"):
                try:
                    cursor = connection.execute(_REPLACE if replace else _INSERT, (location, size))
                except sqlite3.IntegrityError:  # the primary key exists: atomic under SQLite's write lock
                    raise FileExistsError(location) from None
                assert cursor.lastrowid is not None
                with connection.blobopen("objects", "data", cursor.lastrowid) as blob:
                    for view in views:
                        blob.write(view)

    def _get(self, location: str, byte_range: ByteRange | None) -> bytes:
        with self._lock:
            connection = self._connect(create=False)
            if connection is None:
                raise FileNotFoundError(location)
            with _transaction(connection):  # the row and its bytes from one consistent snapshot
                row = connection.execute("SELECT rowid FROM objects WHERE location = ?", (location,)).fetchone()
                if row is None:
                    raise FileNotFoundError(location)
                with connection.blobopen("objects", "data", row[0], readonly=True) as blob:
                    start, end = (0, len(blob)) if byte_range is None else (byte_range.start, byte_range.end)
                    if end > len(blob):
                        raise EOFError(f"{location}: range [{start}, {end}) is past the end ({len(blob)} bytes)")
                    blob.seek(start)
                    return blob.read(end - start)

    def _delete(self, location: str) -> None:
        with self._lock:
            connection = self._connect(create=False)
            deleted = 0
            if connection is not None:
                deleted = connection.execute("DELETE FROM objects WHERE location = ?", (location,)).rowcount
            if not deleted:
                raise FileNotFoundError(location)

    def _list(self, prefix: str) -> list[str]:
        with self._lock:
            connection = self._connect(create=False)
            if connection is None:
                return []
            rows = connection.execute(
                "SELECT location FROM objects WHERE substr(location, 1, length(?1)) = ?1 ORDER BY location", (prefix,)
            ).fetchall()
        return [str(location) for (location,) in rows]

    def _close(self) -> None:
        with self._lock:
            if self._connection is not None:
                self._connection.close()
                self._connection = None

    async def write(self, location: str, data: Buffer | Sequence[Buffer]) -> None:
        """Store ``data`` (one buffer, or several back to back) as ``location``, replacing any object there."""
        await asyncio.to_thread(self._put, location, _views(data), replace=True)

    async def write_exclusive(self, location: str, data: Buffer | Sequence[Buffer]) -> None:
        """Store ``location`` only if it does not exist, else raise ``FileExistsError``; atomic."""
        await asyncio.to_thread(self._put, location, _views(data), replace=False)

    async def read(self, location: str, byte_range: ByteRange | None = None) -> bytes:
        """The bytes of ``location``, or of ``byte_range`` of it (``EOFError`` if past the end)."""
        return await asyncio.to_thread(self._get, location, byte_range)

    async def delete(self, location: str) -> None:
        """Remove ``location``; ``FileNotFoundError`` if there is no such object."""
        await asyncio.to_thread(self._delete, location)

    async def list(self, prefix: str = "") -> list[str]:
        """Locations that start with ``prefix``, sorted."""
        return await asyncio.to_thread(self._list, prefix)

    async def close(self) -> None:
        """Close the connection (a later call opens a new one); safe to call more than once."""
        await asyncio.to_thread(self._close)
