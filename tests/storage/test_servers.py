"""The loopback S3 server leaves nothing behind, also when it has to be killed."""

from __future__ import annotations

import signal
import tempfile
import time
from pathlib import Path

import pytest

from snapshotkit.testing import SeaweedS3Server, ServerUnavailable


def _wait_for_sockets(paths: list[Path], timeout_s: float = 30.0) -> None:
    """Until every path is a unix socket (weed's admin server opens its own after S3 answers)."""
    deadline = time.monotonic() + timeout_s
    while not all(path.is_socket() for path in paths):
        missing = [str(path) for path in paths if not path.is_socket()]
        assert time.monotonic() < deadline, f"weed did not open these sockets within {timeout_s:.0f} s: {missing}"
        time.sleep(0.05)


def test_seaweed_leaves_no_socket_or_directory_even_when_killed() -> None:
    try:
        server = SeaweedS3Server().__enter__()
    except ServerUnavailable as exc:
        pytest.skip(f"needs SeaweedFS: {exc}")
    try:
        # weed puts its gRPC sockets in /tmp whatever TMPDIR says; the names the server clears must
        # be the ones weed really uses, or the clean-up below would pass without doing anything.
        sockets = list(server._grpc_sockets)
        assert len(sockets) == 5
        _wait_for_sockets(sockets)
        data_dir = Path(server._data_dir)
        assert data_dir.parent == Path(tempfile.gettempdir())
        assert (data_dir / "weed.log").is_file()
        # A kill (as _stop does when weed ignores SIGTERM) skips weed's own removal of its sockets.
        process = server._process
        assert process is not None
        process.send_signal(signal.SIGKILL)
        process.wait(10)
        assert all(path.is_socket() for path in sockets)
    finally:
        server.__exit__(None, None, None)
    assert [str(path) for path in sockets if path.exists()] == []
    assert not data_dir.exists()
