"""Incremental takes on ``s3://`` (SeaweedFS): fewer data objects written, bit-exact restores, and
a deleted base prefix is a BaseSnapshotError."""

from __future__ import annotations

import contextlib
import copy
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import torch

from snapshotkit import Snapshot, StateDict
from snapshotkit.errors import BaseSnapshotError

from ._incremental import CHUNK_BYTES, SMALL_PIECES, assert_bit_exact, referenced

pytest.importorskip("s3fs", reason="the S3 plugin needs s3fs installed")
boto3 = pytest.importorskip("boto3", reason="the S3 tests list and delete keys through boto3")

BUCKET = "snapshotkit-incremental"
NUMEL = 4 * CHUNK_BYTES // 4  # float32: four full pieces


@pytest.fixture
def s3(seaweed_s3_endpoint: str) -> Iterator[tuple[Any, str]]:
    """A boto3 client and a fresh prefix in the bucket, every key under it deleted afterwards."""
    client = boto3.client("s3", endpoint_url=seaweed_s3_endpoint)
    with contextlib.suppress(client.exceptions.BucketAlreadyOwnedByYou):
        client.create_bucket(Bucket=BUCKET)
    prefix = uuid.uuid4().hex
    yield client, prefix
    for key in keys(client, prefix):
        client.delete_object(Bucket=BUCKET, Key=key)


def keys(client: Any, prefix: str) -> list[str]:
    found = []
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=f"{prefix}/"):
        found += [item["Key"] for item in page.get("Contents", [])]
    return sorted(found)


def test_incremental_take_on_s3(s3: tuple[Any, str], seaweed_s3_endpoint: str, monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in SMALL_PIECES.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("SNAPSHOTKIT_DATA_OBJECT_BYTES", str(CHUNK_BYTES))  # one data object per piece
    client, prefix = s3
    options = {"endpoint_url": seaweed_s3_endpoint}
    root = f"s3://{BUCKET}/{prefix}"
    state = {"s": StateDict(**{f"w{i}": torch.full((NUMEL,), float(i)) for i in range(3)}, step=1)}
    Snapshot.take(f"{root}/a", state, storage_options=options)
    state["s"]["w1"][0] = -1.0
    expected = copy.deepcopy(dict(state["s"]))
    b = Snapshot.take(f"{root}/b", state, storage_options=options, base=f"{root}/a")

    assert referenced(b, "s/w0") == ["../a"] * 4 and referenced(b, "s/w1") == [None, "../a", "../a", "../a"]
    written = {name: [k for k in keys(client, f"{prefix}/{name}") if "/data/" in k] for name in ("a", "b")}
    assert len(written["a"]) >= 12 and len(written["b"]) == 1, written
    assert_bit_exact(Snapshot(f"{root}/b", storage_options=options).read_object("s"), expected)
    target = {"s": StateDict(**{f"w{i}": torch.zeros(NUMEL) for i in range(3)}, step=0)}
    Snapshot(f"{root}/b", storage_options=options).restore(target)
    assert_bit_exact(dict(target["s"]), expected)

    for key in keys(client, f"{prefix}/a"):
        client.delete_object(Bucket=BUCKET, Key=key)
    with pytest.raises(BaseSnapshotError, match=r"'\.\./a'.*'s/w0'"):
        Snapshot(f"{root}/b", storage_options=options).read_object("s/w0")
    with pytest.raises(BaseSnapshotError, match="deleted"):
        Snapshot(f"{root}/b", storage_options=options).restore(target)
