"""A fault-injecting HTTP proxy for testing how a storage plugin copes with a flaky service.

:class:`FaultInjectingProxy` listens on loopback and forwards every request, unchanged (the
``Host`` header included, so signed requests stay valid), to a real server such as SeaweedFS.
Faults are queued with :meth:`~FaultInjectingProxy.inject` and consumed by the next matching
requests: an HTTP error status with an S3- or GCS-shaped error body, or a connection reset
(the request is read, then the connection is aborted with no response). Every request the proxy
sees is recorded, so a test can count attempts.

Needs aiohttp (installed with s3fs and gcsfs).
"""

from __future__ import annotations

import asyncio
import dataclasses
import re
import threading
from collections.abc import Callable
from types import TracebackType
from typing import Any

_HOP_BY_HOP = frozenset(
    {"connection", "keep-alive", "transfer-encoding", "content-length", "expect", "upgrade", "te", "trailer"}
)


RESET = 0
LOSE_RESPONSE = -1


@dataclasses.dataclass
class Fault:
    """What to do to the next ``count`` requests whose ``"METHOD path?query"`` matches ``pattern``.

    ``status`` :data:`RESET` (0) resets the connection before the request reaches the server;
    :data:`LOSE_RESPONSE` (-1) forwards it, then resets the connection instead of answering (the
    request took effect, the client cannot know); otherwise answer with that status and ``body``.
    """

    status: int
    count: int = 1
    pattern: str = ""
    body: bytes = b""
    content_type: str = "application/xml"

    def matches(self, line: str) -> bool:
        return re.search(self.pattern, line) is not None


@dataclasses.dataclass(frozen=True)
class SeenRequest:
    """One request the proxy received and what it did with it."""

    method: str
    path: str
    outcome: str  # "forwarded <status>", "fault <status>" or "reset"


def s3_error_body(code: str, message: str) -> bytes:
    """An S3 XML error document."""
    document = f"<Error><Code>{code}</Code><Message>{message}</Message></Error>"
    return f'<?xml version="1.0" encoding="UTF-8"?>\n{document}'.encode()


class FaultInjectingProxy:
    """An HTTP proxy on ``127.0.0.1`` in front of ``upstream`` (``"http://127.0.0.1:8333"``).

    Use as a context manager; :attr:`url` is where clients should connect.
    """

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream.rstrip("/")
        self.url = ""
        self.requests: list[SeenRequest] = []
        self._faults: list[Fault] = []
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._runner: Any = None
        self._session: Any = None

    # ------------------------------------------------------------------ control

    def inject(
        self,
        status: int,
        *,
        count: int = 1,
        pattern: str = "",
        body: bytes = b"",
        content_type: str = "application/xml",
    ) -> None:
        """Answer the next ``count`` requests matching ``pattern`` (a regex searched in
        ``"METHOD /path?query"``) with ``status``, or :data:`RESET` / :data:`LOSE_RESPONSE`."""
        with self._lock:
            self._faults.append(Fault(status, count, pattern, body, content_type))

    def inject_s3_error(self, status: int, code: str, *, count: int = 1, pattern: str = "") -> None:
        """Answer with an S3 error document (``503``, ``"SlowDown"``)."""
        self.inject(status, count=count, pattern=pattern, body=s3_error_body(code, f"injected {code}"))

    def clear(self) -> None:
        """Drop queued faults and the request log."""
        with self._lock:
            self._faults.clear()
            self.requests.clear()

    def count(self, predicate: Callable[[SeenRequest], bool] = lambda r: True) -> int:
        """How many recorded requests satisfy ``predicate``."""
        with self._lock:
            return sum(1 for r in self.requests if predicate(r))

    def _take_fault(self, line: str) -> Fault | None:
        with self._lock:
            for fault in self._faults:
                if fault.count > 0 and fault.matches(line):
                    fault.count -= 1
                    if fault.count == 0:
                        self._faults.remove(fault)
                    return fault
        return None

    def _record(self, method: str, path: str, outcome: str) -> None:
        with self._lock:
            self.requests.append(SeenRequest(method, path, outcome))

    # ------------------------------------------------------------------ serving

    async def _handle(self, request: Any) -> Any:
        from aiohttp import web

        line = f"{request.method} {request.path_qs}"
        body = await request.read()
        fault = self._take_fault(line)
        if fault is not None and fault.status == RESET:
            self._record(request.method, request.path_qs, "reset")
            request.transport.abort()
            return web.Response(status=599)  # never sent: the connection is gone
        if fault is not None and fault.status != LOSE_RESPONSE:
            self._record(request.method, request.path_qs, f"fault {fault.status}")
            return web.Response(status=fault.status, body=fault.body, headers={"Content-Type": fault.content_type})
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP_BY_HOP}
        async with self._session.request(
            request.method, self.upstream + request.path_qs, headers=headers, data=body, allow_redirects=False
        ) as upstream:
            payload = await upstream.read()
            out_headers = {k: v for k, v in upstream.headers.items() if k.lower() not in _HOP_BY_HOP}
            status = upstream.status
        if fault is not None:  # LOSE_RESPONSE
            self._record(request.method, request.path_qs, f"forwarded {status}, response lost")
            request.transport.abort()
            return web.Response(status=599)  # never sent: the connection is gone
        self._record(request.method, request.path_qs, f"forwarded {status}")
        if request.method == "HEAD":
            # Keep the object's size: HEAD answers carry Content-Length without a body.
            response = web.StreamResponse(status=status, headers=out_headers)
            length = upstream.headers.get("Content-Length")
            if length is not None:
                response.content_length = int(length)
            await response.prepare(request)
            return response
        return web.Response(status=status, body=payload, headers=out_headers)

    async def _start(self, ready: threading.Event, errors: list[BaseException]) -> None:
        try:
            import aiohttp
            from aiohttp import web

            self._session = aiohttp.ClientSession(auto_decompress=False)
            app = web.Application(client_max_size=1 << 31)
            app.router.add_route("*", "/{tail:.*}", self._handle)
            self._runner = web.AppRunner(app, access_log=None)
            await self._runner.setup()
            site = web.TCPSite(self._runner, "127.0.0.1", 0)
            await site.start()
            port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
            self.url = f"http://127.0.0.1:{port}"
        except BaseException as exc:  # reported to the starting thread
            errors.append(exc)
        finally:
            ready.set()

    def __enter__(self) -> FaultInjectingProxy:
        self._loop = asyncio.new_event_loop()
        ready = threading.Event()
        errors: list[BaseException] = []
        self._thread = threading.Thread(target=self._loop.run_forever, name="snapshotkit-fault-proxy", daemon=True)
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(ready, errors), self._loop)
        ready.wait(30)
        if errors:
            self.__exit__(None, None, None)
            raise errors[0]
        return self

    async def _stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
        if self._session is not None:
            await self._session.close()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, traceback: TracebackType | None
    ) -> None:
        if self._loop is None:
            return
        asyncio.run_coroutine_threadsafe(self._stop(), self._loop).result(30)
        self._loop.call_soon_threadsafe(self._loop.stop)
        if self._thread is not None:
            self._thread.join(30)
        self._loop.close()
        self._loop = None
