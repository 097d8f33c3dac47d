"""Shared fixtures, and the real object-store servers on loopback, one of each per session.

S3 is SeaweedFS ``weed mini`` and GCS is fake-gcs-server, both started through
:mod:`snapshotkit.testing` (the benchmarks use the same helpers). A test that needs a server
skips with the reason only when the server's package is missing; CI installs them all.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator

import pytest

from snapshotkit.testing import FakeGCSServer, SeaweedS3Server, ServerUnavailable

# The helpers shared by test modules assert too: rewrite them like the tests, for readable failures.
pytest.register_assert_rewrite("_snapshots", "_benchmarks", "_chain")


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """Unset every ``SNAPSHOTKIT_*`` variable for the test, so the caller's environment cannot leak in.

    Returns the ``monkeypatch`` fixture, for ``clean_env.setenv(...)``.
    """
    for name in list(os.environ):
        if name.startswith("SNAPSHOTKIT_"):
            monkeypatch.delenv(name)
    return monkeypatch


# s3fs/botocore read credentials and region from the environment; never pass region_name in
# client_kwargs (s3fs.mkdir would then send a LocationConstraint that us-east-1 rejects).
os.environ.setdefault("AWS_ACCESS_KEY_ID", SeaweedS3Server.access_key)
os.environ.setdefault("AWS_SECRET_ACCESS_KEY", SeaweedS3Server.secret_key)
os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
# gcsfs >= 2026.6 stalls 30-75 s per operation against emulators unless this is off; it must be
# set before gcsfs is first imported.
os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")


@pytest.fixture(scope="session")
def seaweed_s3_endpoint() -> Iterator[str]:
    """URL of a SeaweedFS S3 gateway on loopback (``weed mini`` in a temp dir), for the whole session."""
    pytest.importorskip("s3fs", reason="S3 tests need s3fs (pip install s3fs)")
    try:
        with SeaweedS3Server() as server:
            yield server.endpoint_url
    except ServerUnavailable as exc:
        pytest.skip(f"S3 tests need SeaweedFS: {exc}")


@pytest.fixture(scope="session")
def fake_gcs_endpoint() -> Iterator[str]:
    """URL of a fake-gcs-server for the session, with ``STORAGE_EMULATOR_HOST`` pointing at it."""
    pytest.importorskip("gcsfs", reason="GCS tests need gcsfs (pip install gcsfs)")
    try:
        with FakeGCSServer() as server:
            yield server.url
    except ServerUnavailable as exc:
        pytest.skip(f"GCS tests need fake-gcs-server: {exc}")


@pytest.fixture(autouse=True)
def _restore_snapshotkit_logging() -> Iterator[None]:
    """Commands run in-process (click's runner, anywhere in the suite) add a handler to the
    ``snapshotkit`` logger, set its level and stop propagation: put it back after every test."""
    logger = logging.getLogger("snapshotkit")
    handlers, level, propagate = list(logger.handlers), logger.level, logger.propagate
    yield
    logger.handlers[:] = handlers
    logger.setLevel(level)
    logger.propagate = propagate
