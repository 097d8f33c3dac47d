"""The S3 plugin passes the conformance suite against a real S3 server (SeaweedFS ``weed mini``)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from snapshotkit.storage import StoragePlugin, url_to_storage_plugin
from snapshotkit.testing import StoragePluginConformance

pytest.importorskip("s3fs", reason="the S3 plugin needs s3fs installed")
boto3 = pytest.importorskip("boto3", reason="the S3 tests check the server through boto3")

from snapshotkit.storage._s3 import S3StoragePlugin  # noqa: E402

pytestmark = pytest.mark.slow

BUCKET = "snapshotkit-conformance"
PART_SIZE = 5 * 1024 * 1024  # S3's minimum, so a 12 MiB object takes the multipart path


@pytest.fixture(scope="module")
def s3_client(seaweed_s3_endpoint: str) -> Any:
    client = boto3.client("s3", endpoint_url=seaweed_s3_endpoint)
    client.create_bucket(Bucket=BUCKET)
    return client


def _split(root: str, location: str) -> tuple[str, str]:
    bucket, _, prefix = root.partition("/")
    return bucket, f"{prefix}/{location}" if prefix else location


class TestS3Plugin(StoragePluginConformance):
    large_object_bytes = 12 * 1024 * 1024 + 123  # three parts, the last one short

    @pytest.fixture(autouse=True)
    def _endpoint(self, seaweed_s3_endpoint: str, s3_client: Any, monkeypatch: pytest.MonkeyPatch) -> None:
        # The end-to-end case opens the URI with no storage options: botocore (>= 1.31) takes the
        # endpoint from AWS_ENDPOINT_URL_S3.
        monkeypatch.setenv("AWS_ENDPOINT_URL_S3", seaweed_s3_endpoint)
        self.endpoint = seaweed_s3_endpoint
        self.client = s3_client

    @pytest.fixture
    def root(self, s3_client: Any) -> Iterator[str]:
        root = f"{BUCKET}/{uuid.uuid4().hex}"
        yield root
        prefix = root.partition("/")[2] + "/"
        for page in s3_client.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=prefix):
            keys = [{"Key": item["Key"]} for item in page.get("Contents", [])]
            if keys:
                s3_client.delete_objects(Bucket=BUCKET, Delete={"Objects": keys, "Quiet": True})

    async def make_plugin(self, root: str) -> StoragePlugin:
        plugin = url_to_storage_plugin(self.uri(root), {"endpoint_url": self.endpoint, "part_size_bytes": PART_SIZE})
        assert isinstance(plugin, S3StoragePlugin)
        return plugin

    def uri(self, root: str) -> str:
        return f"s3://{root}"

    def ground_truth_write(self, root: str, location: str, data: bytes) -> None:
        bucket, key = _split(root, location)
        self.client.put_object(Bucket=bucket, Key=key, Body=data)

    def ground_truth_read(self, root: str, location: str) -> bytes | None:
        bucket, key = _split(root, location)
        try:
            body: bytes = self.client.get_object(Bucket=bucket, Key=key)["Body"].read()
        except self.client.exceptions.NoSuchKey:
            return None
        return body


class TestS3PluginBucketRoot(TestS3Plugin):
    """The same suite with the bucket itself as the root (no key prefix)."""

    @pytest.fixture
    def root(self, s3_client: Any) -> Iterator[str]:
        bucket = f"skt-{uuid.uuid4().hex[:20]}"
        s3_client.create_bucket(Bucket=bucket)
        yield bucket
        for page in s3_client.get_paginator("list_objects_v2").paginate(Bucket=bucket):
            keys = [{"Key": item["Key"]} for item in page.get("Contents", [])]
            if keys:
                s3_client.delete_objects(Bucket=bucket, Delete={"Objects": keys, "Quiet": True})
        s3_client.delete_bucket(Bucket=bucket)


def test_multipart_upload_is_used_above_part_size(seaweed_s3_endpoint: str, s3_client: Any) -> None:
    root = f"{BUCKET}/{uuid.uuid4().hex}"
    payload = bytes(range(256)) * (PART_SIZE // 256 * 2 + 1)  # two full parts and a short one
    plugin = S3StoragePlugin(root, {"endpoint_url": seaweed_s3_endpoint, "part_size_bytes": PART_SIZE})

    async def scenario() -> None:
        await plugin.write("big.bin", [memoryview(payload)[:1000], memoryview(payload)[1000:]])
        await plugin.close()

    asyncio.run(scenario())
    _, key = _split(root, "big.bin")
    head = s3_client.head_object(Bucket=BUCKET, Key=key)
    assert head["ContentLength"] == len(payload)
    assert head["ETag"].strip('"').endswith("-3"), head["ETag"]  # multipart ETags end in -<parts>
    assert s3_client.get_object(Bucket=BUCKET, Key=key)["Body"].read() == payload


def test_write_exclusive_is_atomic_under_a_race(seaweed_s3_endpoint: str, s3_client: Any) -> None:
    root = f"{BUCKET}/{uuid.uuid4().hex}"
    plugin = S3StoragePlugin(root, {"endpoint_url": seaweed_s3_endpoint})
    assert plugin.capabilities.atomic_exclusive_write

    async def attempt(i: int) -> bool:
        try:
            await plugin.write_exclusive("COMMIT", f"writer {i}".encode())
        except FileExistsError:
            return False
        return True

    async def scenario() -> list[bool]:
        results = await asyncio.gather(*(attempt(i) for i in range(16)))
        await plugin.close()
        return list(results)

    assert sum(asyncio.run(scenario())) == 1


def _stored_crc32c(s3_client: Any, key: str) -> str:
    head = s3_client.head_object(Bucket=BUCKET, Key=key, ChecksumMode="ENABLED")
    return str(head.get("ChecksumCRC32C"))


@pytest.mark.parametrize("size", [1000, PART_SIZE * 2 + 1000], ids=["put", "multipart"])
def test_uploads_carry_a_crc32c_the_server_checks(seaweed_s3_endpoint: str, s3_client: Any, size: int) -> None:
    import base64

    import crc32c

    root = f"{BUCKET}/{uuid.uuid4().hex}"
    payload = bytes(range(251)) * (size // 251 + 1)
    view = memoryview(payload)[:size]
    plugin = S3StoragePlugin(root, {"endpoint_url": seaweed_s3_endpoint, "part_size_bytes": PART_SIZE})

    async def scenario() -> None:
        # Pieces that do and do not straddle a part boundary: views, and one joined part.
        await plugin.write("obj", [view[:700], view[700 : PART_SIZE + 10], view[PART_SIZE + 10 :]])
        await plugin.close()

    asyncio.run(scenario())
    _, key = _split(root, "obj")
    assert s3_client.get_object(Bucket=BUCKET, Key=key)["Body"].read() == payload[:size]

    def b64(data: Any) -> str:
        return base64.b64encode(crc32c.crc32c(data).to_bytes(4, "big")).decode()

    if size < PART_SIZE:  # the object's own CRC-32C, as the server computed and checked it
        assert _stored_crc32c(s3_client, key) == b64(payload[:size])
    else:  # a multipart object's checksum is the CRC-32C of its parts' CRC-32Cs
        bounds = [(0, PART_SIZE), (PART_SIZE, 2 * PART_SIZE), (2 * PART_SIZE, size)]
        parts = b"".join(crc32c.crc32c(view[a:b]).to_bytes(4, "big") for a, b in bounds)
        assert _stored_crc32c(s3_client, key) == f"{b64(parts)}-3"


def test_a_body_that_does_not_match_its_checksum_is_refused(seaweed_s3_endpoint: str) -> None:
    # What a damaged upload looks like to the server: the plugin's request, with a CRC-32C that
    # is not the body's. The server refuses it (a transient failure: sent again, it may pass).
    plugin = S3StoragePlugin(f"{BUCKET}/{uuid.uuid4().hex}", {"endpoint_url": seaweed_s3_endpoint})
    wrong = plugin._checksum(b"other bytes")
    with pytest.raises(Exception) as caught:  # how s3fs translates BadDigest varies
        plugin._call("put_object", "obj", Body=b"these bytes", **wrong)
    assert plugin.is_transient(caught.value), repr(caught.value)
    with pytest.raises(FileNotFoundError):
        plugin._size("obj")


def test_botocore_upload_checksum_round_trips(seaweed_s3_endpoint: str) -> None:
    options = {"endpoint_url": seaweed_s3_endpoint, "part_size_bytes": PART_SIZE, "upload_checksum": "botocore"}
    plugin = S3StoragePlugin(f"{BUCKET}/{uuid.uuid4().hex}", options)
    payload = bytes(range(256)) * (PART_SIZE // 256 + 7)

    async def scenario() -> bytes | memoryview:
        await plugin.write("obj", [memoryview(payload)[:5], memoryview(payload)[5:]])
        data = await plugin.read("obj")
        await plugin.close()
        return data

    assert bytes(asyncio.run(scenario())) == payload


def test_options_are_validated() -> None:
    with pytest.raises(ValueError, match="part_size_bytes"):
        S3StoragePlugin("bucket/prefix", {"part_size_bytes": 1024})
    with pytest.raises(ValueError, match="upload_checksum"):
        S3StoragePlugin("bucket/prefix", {"upload_checksum": "md5"})
    with pytest.raises(ValueError, match="bucket"):
        S3StoragePlugin("", {})
