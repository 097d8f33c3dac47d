"""The loopback S3 server leaves nothing behind, also when it has to be killed."""

from __future__ import annotations

import signal
import socket
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


def test_seaweed_retries_on_fresh_ports_when_one_was_taken_before_weed_bound_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A port is free when chosen, not reserved: a start that loses it to another process is retried."""
    from snapshotkit.testing import _servers

    real_free_ports = _servers.free_ports
    calls: list[list[int]] = []
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        taken = int(squatter.getsockname()[1])

        def free_ports_first_one_taken(count: int, *, below: int = 55000) -> list[int]:
            ports = real_free_ports(count, below=below)
            if not calls:
                ports[3] = taken  # the filer port, as another process took it after it was chosen
            calls.append(ports)
            return ports

        monkeypatch.setattr(_servers, "free_ports", free_ports_first_one_taken)
        try:
            server = SeaweedS3Server().__enter__()
        except ServerUnavailable as exc:
            pytest.skip(f"needs SeaweedFS: {exc}")
        try:
            assert len(calls) == 2
            assert str(calls[1][0]) in server.endpoint_url
            server.create_bucket("after-retry")
        finally:
            server.__exit__(None, None, None)
    for ports in calls:
        assert [p for p in ports if Path(f"/tmp/seaweedfs-filer-grpc-{p + 10000}.sock").exists()] == []


def test_seaweed_that_cannot_start_says_why_from_its_log(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every start losing its port gives up after a few tries, with weed's own words in the error."""
    from snapshotkit.testing import _servers

    real_free_ports = _servers.free_ports
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        taken = int(squatter.getsockname()[1])

        def always_taken(count: int, *, below: int = 55000) -> list[int]:
            ports = real_free_ports(count, below=below)
            ports[3] = taken
            return ports

        monkeypatch.setattr(_servers, "free_ports", always_taken)
        if _servers.weed_binary() is None:
            pytest.skip("needs SeaweedFS: the `weed` binary is not installed")
        with pytest.raises(RuntimeError, match="Port allocation failed") as caught:
            SeaweedS3Server().__enter__()
    assert f"port {taken}" in str(caught.value)
