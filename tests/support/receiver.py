"""A real webhook receiver for tests: a Starlette app on uvicorn that records every request
and answers with the status the test sets (200 by default), or redirects. It can be left
unstarted (down) and started later on its reserved port."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import orjson
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from tests.support.servers import ThreadServer, free_port

TOLERANCE_SECONDS = 300


def verify_signature(secret: str, header: str, body: bytes, *, now: float | None = None) -> bool:
    """A receiver's check of `X-UndoLog-Signature` (as docs/notifications.md shows it):
    HMAC-SHA256 of `<t>.<body>`, compared in constant time; older than 5 minutes: refused."""
    parts = dict(p.split("=", 1) for p in header.split(",") if "=" in p)
    try:
        timestamp = int(parts["t"])
    except (KeyError, ValueError):
        return False
    if abs((time.time() if now is None else now) - timestamp) > TOLERANCE_SECONDS:
        return False
    expected = hmac.new(
        secret.encode(), str(timestamp).encode() + b"." + body, hashlib.sha256
    ).hexdigest()
    return hmac.compare_digest(expected, parts.get("v1", ""))


@dataclass
class Received:
    path: str
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return orjson.loads(self.body)


@dataclass
class Receiver:
    status: int = 200
    answer_body: bytes = b"ok"
    redirect_to: str | None = None
    port: int = field(default_factory=free_port)
    received: list[Received] = field(default_factory=list)
    server: ThreadServer | None = None
    # Set: each request is held (recorded, not yet answered) until the test sets it.
    hold: threading.Event | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hook"

    def app(self) -> Starlette:
        async def record(request: Request) -> Response:
            entry = Received(request.url.path, dict(request.headers), await request.body())
            with self._lock:
                self.received.append(entry)
            if self.hold is not None:
                await asyncio.to_thread(self.hold.wait, 60)
            if self.redirect_to and request.url.path == "/hook":
                return Response(status_code=302, headers={"Location": self.redirect_to})
            return Response(self.answer_body, status_code=self.status)

        routes = [
            Route("/hook", record, methods=["POST"]),
            Route("/elsewhere", record, methods=["POST", "GET"]),
        ]
        return Starlette(routes=routes)

    def start(self) -> Receiver:
        self.server = ThreadServer(self.app(), port=self.port).start()
        return self

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop()
            self.server = None

    def at(self, path: str = "/hook") -> list[Received]:
        with self._lock:
            return [r for r in self.received if r.path == path]

    def events(self, type_: str | None = None) -> list[dict[str, Any]]:
        wanted = [r for r in self.at() if type_ in (None, r.headers.get("x-undolog-event"))]
        return [r.json() for r in wanted]
