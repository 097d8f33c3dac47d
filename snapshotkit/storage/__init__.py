"""Storage plugins: the SPI, the URI registry and the built-in backends."""

from __future__ import annotations

from ._base import ByteRange, Capabilities, StoragePlugin
from ._fs import FSStoragePlugin
from ._fsspec import FsspecStoragePlugin
from ._memory import MemoryStoragePlugin
from ._registry import StoragePluginFactory, register_storage_plugin, url_to_storage_plugin
from ._retry import RetryPolicy

__all__ = [
    "ByteRange",
    "Capabilities",
    "FSStoragePlugin",
    "FsspecStoragePlugin",
    "MemoryStoragePlugin",
    "RetryPolicy",
    "StoragePlugin",
    "StoragePluginFactory",
    "register_storage_plugin",
    "url_to_storage_plugin",
]
