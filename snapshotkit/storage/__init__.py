"""Storage plugins: the SPI, the URI registry and the built-in backends."""

from __future__ import annotations

from snapshotkit.storage._base import ByteRange, Capabilities, StoragePlugin
from snapshotkit.storage._fs import FSStoragePlugin
from snapshotkit.storage._fsspec import FsspecStoragePlugin
from snapshotkit.storage._memory import MemoryStoragePlugin
from snapshotkit.storage._registry import (
    StoragePluginFactory,
    open_storage_plugin,
    register_storage_plugin,
    url_to_storage_plugin,
)
from snapshotkit.storage._retry import RetryPolicy, is_transient_error
from snapshotkit.storage._retry_layer import RetryingStoragePlugin

__all__ = [
    "ByteRange",
    "Capabilities",
    "FSStoragePlugin",
    "FsspecStoragePlugin",
    "MemoryStoragePlugin",
    "RetryPolicy",
    "RetryingStoragePlugin",
    "StoragePlugin",
    "StoragePluginFactory",
    "is_transient_error",
    "open_storage_plugin",
    "register_storage_plugin",
    "url_to_storage_plugin",
]
