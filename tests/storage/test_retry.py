"""Retry policy, and how the object-store plugins behave when the service fails.

The unit tests pin the policy's arithmetic. The fault tests run real takes and restores against
SeaweedFS and fake-gcs-server through :class:`FaultInjectingProxy`, which forwards requests to
the real server and injects error statuses, connection resets and lost responses.
"""

from __future__ import annotations

import json
import logging
import random
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
import torch

from snapshotkit import Snapshot, StateDict
from snapshotkit.errors import (
    BucketNotFoundError,
    ConfigError,
    RetriesExhaustedError,
    SnapshotNotFoundError,
    StorageError,
    StoragePermissionError,
)
from snapshotkit.storage import RetryPolicy
from snapshotkit.storage._retry import call_with_retries, is_transient_connection_error
from snapshotkit.testing import LOSE_RESPONSE, RESET, FakeGCSServer, FaultInjectingProxy

# ---------------------------------------------------------------------- policy arithmetic


def test_delays_are_full_jitter_under_exponential_caps() -> None:
    policy = RetryPolicy(max_attempts=8, initial_delay_seconds=0.5, max_delay_seconds=4.0)
    caps = [0.5, 1.0, 2.0, 4.0, 4.0, 4.0, 4.0]
    for seed in range(50):
        delays = list(policy.delays(random.Random(seed)))
        assert len(delays) == 7
        assert all(0.0 <= d <= cap for d, cap in zip(delays, caps, strict=True)), delays
    # jitter: the draws differ between clients
    assert len({tuple(policy.delays(random.Random(seed))) for seed in range(10)}) == 10


@pytest.mark.parametrize(
    ("option", "expected"),
    [
        (None, RetryPolicy()),
        (3, RetryPolicy(max_attempts=3)),
        ({"max_attempts": 2, "deadline_seconds": 5}, RetryPolicy(max_attempts=2, deadline_seconds=5)),
        (RetryPolicy(max_attempts=9), RetryPolicy(max_attempts=9)),
    ],
)
def test_policy_from_option(option: Any, expected: RetryPolicy) -> None:
    assert RetryPolicy.from_option(option) == expected


@pytest.mark.parametrize(
    ("option", "message"),
    [
        (0, "at least 1"),
        ({"max_atempts": 3}, "unknown retry option.*max_atempts"),
        ({"initial_delay_seconds": -1}, "must not be negative"),
        ("often", "RetryPolicy, a dict or an int"),
        (True, "RetryPolicy, a dict or an int"),
    ],
)
def test_bad_policy_options_are_config_errors(option: Any, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        RetryPolicy.from_option(option)


def test_transient_failures_are_retried_and_logged(caplog: pytest.LogCaptureFixture) -> None:
    calls = []
    slept: list[float] = []

    def flaky() -> str:
        calls.append(1)
        if len(calls) < 3:
            raise ConnectionResetError("connection reset by peer")
        return "ok"

    with caplog.at_level(logging.WARNING, logger="snapshotkit.storage"):
        result = call_with_retries(
            flaky,
            describe="PUT x",
            policy=RetryPolicy(),
            is_transient=is_transient_connection_error,
            sleep=slept.append,
        )
    assert result == "ok"
    assert len(calls) == 3
    assert len(slept) == 2
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 2
    assert "PUT x failed (attempt 1 of 6): ConnectionResetError: connection reset by peer; retrying in" in messages[0]


def test_permanent_errors_are_not_retried() -> None:
    calls = []

    def refused() -> None:
        calls.append(1)
        raise PermissionError("403 Forbidden")

    with pytest.raises(PermissionError, match="403"):
        call_with_retries(refused, describe="GET x", policy=RetryPolicy(), is_transient=is_transient_connection_error)
    assert len(calls) == 1


def test_attempts_are_bounded_and_the_last_error_is_attached() -> None:
    calls = []

    def down() -> None:
        calls.append(1)
        raise TimeoutError(f"timed out #{len(calls)}")

    with pytest.raises(RetriesExhaustedError, match=r"GET x failed 4 time\(s\).*timed out #4") as info:
        call_with_retries(
            down,
            describe="GET x",
            policy=RetryPolicy(max_attempts=4),
            is_transient=is_transient_connection_error,
            sleep=lambda _: None,
        )
    assert len(calls) == 4
    assert isinstance(info.value.__cause__, TimeoutError)
    assert isinstance(info.value, StorageError)


def test_deadline_bounds_the_time_spent() -> None:
    calls = []

    def down() -> None:
        calls.append(1)
        raise ConnectionRefusedError("refused")

    policy = RetryPolicy(max_attempts=1000, initial_delay_seconds=0.05, max_delay_seconds=0.05, deadline_seconds=0.3)
    started = time.monotonic()
    with pytest.raises(RetriesExhaustedError):
        call_with_retries(down, describe="GET x", policy=policy, is_transient=is_transient_connection_error)
    assert time.monotonic() - started < 0.3 + 0.05 + 0.5  # the deadline, one delay, scheduling slack
    assert 2 <= len(calls) < 1000


def test_connection_errors_are_found_in_the_exception_chain() -> None:
    outer = OSError("request failed")
    outer.__cause__ = ConnectionResetError("reset")
    assert is_transient_connection_error(outer)
    assert not is_transient_connection_error(ValueError("bad"))


# ---------------------------------------------------------------------- S3 through a faulty proxy

pytest.importorskip("s3fs", reason="the S3 plugin needs s3fs installed")
boto3 = pytest.importorskip("boto3", reason="the S3 fault tests create buckets through boto3")

BUCKET = "snapshotkit-faults"
FAST_RETRY = {"max_attempts": 4, "initial_delay_seconds": 0.01, "max_delay_seconds": 0.05}


@pytest.fixture(scope="module")
def s3_proxy(seaweed_s3_endpoint: str) -> Iterator[FaultInjectingProxy]:
    boto3.client("s3", endpoint_url=seaweed_s3_endpoint).create_bucket(Bucket=BUCKET)
    with FaultInjectingProxy(seaweed_s3_endpoint) as proxy:
        yield proxy


@pytest.fixture
def proxy(s3_proxy: FaultInjectingProxy) -> Iterator[FaultInjectingProxy]:
    s3_proxy.clear()
    yield s3_proxy
    s3_proxy.clear()


def _state() -> dict[str, Any]:
    return {"model": torch.nn.Linear(64, 32), "progress": StateDict(step=7)}


def _options(proxy: FaultInjectingProxy, **extra: Any) -> dict[str, Any]:
    return {"endpoint_url": proxy.url, "retry": FAST_RETRY, **extra}


def _path() -> str:
    return f"s3://{BUCKET}/{uuid.uuid4().hex}"


def _assert_restores(path: str, options: dict[str, Any], state: dict[str, Any]) -> None:
    fresh = _state()
    Snapshot(path, storage_options=options).restore(fresh)
    for name, tensor in state["model"].state_dict().items():
        assert torch.equal(fresh["model"].state_dict()[name], tensor)
    assert fresh["progress"]["step"] == 7


def test_s3_take_survives_throttling_and_5xx(proxy: FaultInjectingProxy, caplog: pytest.LogCaptureFixture) -> None:
    proxy.inject_s3_error(503, "SlowDown", count=2, pattern=r"^PUT /.*/data/")
    proxy.inject_s3_error(500, "InternalError", count=1, pattern=r"^PUT /.*\.snapshot_metadata")
    state, path = _state(), _path()
    with caplog.at_level(logging.WARNING, logger="snapshotkit.storage"):
        Snapshot.take(path, state, storage_options=_options(proxy))
    assert proxy.count(lambda r: r.outcome.startswith("fault")) == 3
    retries = [r.getMessage() for r in caplog.records if "retrying in" in r.getMessage()]
    assert len(retries) == 3
    assert any("SlowDown" in m for m in retries)
    _assert_restores(path, _options(proxy), state)


def test_s3_restore_survives_connection_resets(proxy: FaultInjectingProxy) -> None:
    state, path = _state(), _path()
    Snapshot.take(path, state, storage_options=_options(proxy))
    proxy.inject(RESET, count=2, pattern=r"^GET /.*/data/")
    proxy.inject(RESET, count=1, pattern=r"^GET /.*\.snapshot_metadata")
    _assert_restores(path, _options(proxy), state)
    assert proxy.count(lambda r: r.outcome == "reset") == 3


def test_s3_commit_whose_response_was_lost_still_commits(proxy: FaultInjectingProxy) -> None:
    """The conditional commit PUT reached the server, the answer did not: the retry sees its own object."""
    state, path = _state(), _path()
    proxy.inject(LOSE_RESPONSE, count=1, pattern=r"^PUT /.*\.snapshot_metadata")
    Snapshot.take(path, state, storage_options=_options(proxy))
    assert proxy.count(lambda r: r.outcome.endswith("response lost")) == 1
    _assert_restores(path, _options(proxy), state)


def test_s3_persistent_failure_gives_up_and_leaves_nothing(proxy: FaultInjectingProxy) -> None:
    proxy.inject_s3_error(503, "ServiceUnavailable", count=1000, pattern=r"^PUT /.*/data/")
    path = _path()
    started = time.monotonic()
    with pytest.raises(RetriesExhaustedError, match=r"failed 4 time\(s\).*ServiceUnavailable") as info:
        Snapshot.take(path, _state(), storage_options=_options(proxy))
    assert time.monotonic() - started < 30
    assert "retry" in str(info.value)
    # One retry layer: each request was sent max_attempts times, never max_attempts squared.
    faulted = Counter(r.path for r in proxy.requests if r.outcome.startswith("fault"))
    assert max(faulted.values()) == 4, faulted
    proxy.clear()
    with pytest.raises(SnapshotNotFoundError):
        Snapshot(path, storage_options=_options(proxy)).metadata
    bucket, _, prefix = path.removeprefix("s3://").partition("/")
    listed = boto3.client("s3", endpoint_url=proxy.upstream).list_objects_v2(Bucket=bucket, Prefix=prefix)
    assert listed.get("KeyCount", 0) == 0


def test_s3_refused_credentials_fail_fast(proxy: FaultInjectingProxy) -> None:
    options = _options(proxy, key="testing", secret="not-the-secret")
    with pytest.raises(
        StoragePermissionError, match=r"access denied \((SignatureDoesNotMatch|403)\b.*Check the credentials"
    ) as info:
        Snapshot(_path(), storage_options=options).restore(_state())
    assert isinstance(info.value, PermissionError)
    assert proxy.count() == 1  # one request, no retries


def test_s3_unknown_access_key_on_take_fails_fast(proxy: FaultInjectingProxy) -> None:
    options = _options(proxy, key="nobody", secret="x")
    # The first request is the HEAD that checks for an existing snapshot: a 403 with no body.
    with pytest.raises(StoragePermissionError, match=r"head_object .* access denied \(403"):
        Snapshot.take(_path(), _state(), storage_options=options)
    assert proxy.count() == 1
    assert proxy.count(lambda r: r.method == "PUT") == 0


def test_s3_missing_bucket_is_a_clear_error(proxy: FaultInjectingProxy) -> None:
    path = f"s3://no-such-bucket-{uuid.uuid4().hex[:12]}/run/step_1"
    with pytest.raises(BucketNotFoundError, match=r"bucket 'no-such-bucket-.*' does not exist.*create it") as info:
        Snapshot(path, storage_options=_options(proxy)).restore(_state())
    assert isinstance(info.value, FileNotFoundError)
    # No retries: no request was sent twice.
    seen = [(r.method, r.path) for r in proxy.requests]
    assert 1 <= len(seen) <= 2
    assert len(set(seen)) == len(seen)
    proxy.clear()
    with pytest.raises(BucketNotFoundError):
        Snapshot.take(path, _state(), storage_options=_options(proxy))
    assert proxy.count(lambda r: r.method == "PUT") == 0  # refused before writing anything


# ---------------------------------------------------------------------- GCS through a faulty proxy


@pytest.fixture(scope="module")
def gcs_proxy(fake_gcs_endpoint: str) -> Iterator[FaultInjectingProxy]:
    pytest.importorskip("gcsfs", reason="the GCS plugin needs gcsfs installed")
    with FaultInjectingProxy(fake_gcs_endpoint) as proxy:
        yield proxy


def _gcs_error(status: int, message: str) -> bytes:
    return json.dumps({"error": {"code": status, "message": message}}).encode()


def _gcs_options(proxy: FaultInjectingProxy) -> dict[str, Any]:
    return {"project": "test", "token": "anon", "endpoint_url": proxy.url}


@pytest.fixture
def gcs_bucket(gcs_proxy: FaultInjectingProxy) -> Iterator[str]:
    name = f"faults-{uuid.uuid4().hex[:12]}"
    FakeGCSServer.create_bucket_at(gcs_proxy.upstream, name)
    gcs_proxy.clear()
    yield name
    gcs_proxy.clear()


def test_gcs_take_survives_a_503(gcs_proxy: FaultInjectingProxy, gcs_bucket: str) -> None:
    # gcsfs retries GCS requests itself (6 attempts, exponential backoff with jitter).
    gcs_proxy.inject(503, count=1, pattern=r"^POST /upload/", body=_gcs_error(503, "backend unavailable"))
    state, path = _state(), f"gs://{gcs_bucket}/run"
    Snapshot.take(path, state, storage_options=_gcs_options(gcs_proxy))
    assert gcs_proxy.count(lambda r: r.outcome == "fault 503") == 1
    _assert_restores(path, _gcs_options(gcs_proxy), state)


def test_gcs_forbidden_is_a_permission_error(gcs_proxy: FaultInjectingProxy, gcs_bucket: str) -> None:
    denied = _gcs_error(403, "caller does not have storage.objects.get")
    gcs_proxy.inject(403, count=100, pattern=r"^GET ", body=denied)
    with pytest.raises(StoragePermissionError, match=r"access denied.*storage\.objects\.get"):
        Snapshot(f"gs://{gcs_bucket}/run", storage_options=_gcs_options(gcs_proxy)).restore(_state())
    seen = [(r.method, r.path) for r in gcs_proxy.requests]
    assert len(set(seen)) == len(seen), seen  # nothing retried


def test_gcs_missing_bucket_is_a_clear_error(gcs_proxy: FaultInjectingProxy) -> None:
    gcs_proxy.clear()
    path = f"gs://no-such-bucket-{uuid.uuid4().hex[:12]}/run"
    with pytest.raises(BucketNotFoundError, match="the bucket does not exist"):
        Snapshot(path, storage_options=_gcs_options(gcs_proxy)).restore(_state())
    with pytest.raises(BucketNotFoundError):
        Snapshot.take(path, _state(), storage_options=_gcs_options(gcs_proxy))
