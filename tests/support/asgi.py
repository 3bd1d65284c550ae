"""The proxy's ASGI app in process, without a socket: its lifespan run as uvicorn would run it,
requests through `httpx.ASGITransport`, and held-open responses (an SSE stream) driven by hand,
since `ASGITransport` waits for a response's end before it returns.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import orjson

from undolog.config import Settings
from undolog.proxy import create_app

START_SECONDS = 10  # for a response to start: a deadline, not an expectation


@dataclass
class InProcess:
    """A running app: `client(key)` for requests, `runtime` for what it holds."""

    app: Any

    @property
    def runtime(self) -> Any:
        return self.app.fastapi.state.runtime

    def client(self, api_key: str) -> httpx.AsyncClient:
        return httpx.AsyncClient(
            transport=httpx.ASGITransport(app=self.app),
            base_url="http://undolog.test",
            headers={"X-Api-Key": api_key},
        )


@contextlib.asynccontextmanager
async def in_process(settings: Settings) -> AsyncIterator[InProcess]:
    """The proxy built from `settings`, started (store open, broker running) until exit."""
    app = create_app(settings)
    api = app.fastapi
    async with api.router.lifespan_context(api):
        yield InProcess(app)


@dataclass
class HeldResponse:
    """A response the app has started (status and headers known) and may still be sending."""

    status: int
    headers: dict[str, str]
    body: bytes
    _disconnect: asyncio.Event = field(repr=False)
    _task: asyncio.Task[None] = field(repr=False)

    def json(self) -> Any:
        return orjson.loads(self.body)

    async def close(self) -> None:
        """The client goes away: the app sees `http.disconnect` and ends the response."""
        self._disconnect.set()
        await asyncio.wait_for(self._task, 10)


@contextlib.asynccontextmanager
async def held_get(running: InProcess, path: str, api_key: str) -> AsyncIterator[HeldResponse]:
    """GET `path` and hold the response open (an SSE stream) until the block exits. An error
    answer comes whole; of a stream, `body` holds what it had sent when its head arrived."""
    started = asyncio.Event()
    disconnect = asyncio.Event()
    head: dict[str, Any] = {}
    chunks: list[bytes] = []
    requested = False

    async def receive() -> dict[str, Any]:
        nonlocal requested
        if not requested:
            requested = True
            return {"type": "http.request", "body": b"", "more_body": False}
        await disconnect.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            head["status"] = message["status"]
            head["headers"] = {k.decode(): v.decode() for k, v in message.get("headers", [])}
            started.set()
        elif message["type"] == "http.response.body":
            chunks.append(message.get("body", b""))

    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "GET",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "headers": [(b"host", b"undolog.test"), (b"x-api-key", api_key.encode())],
        "client": ("127.0.0.1", 50000),
        "server": ("undolog.test", 80),
        "root_path": "",
    }
    task = asyncio.create_task(running.app(scope, receive, send))
    waiter = asyncio.create_task(started.wait())
    await asyncio.wait({task, waiter}, timeout=START_SECONDS, return_when=asyncio.FIRST_COMPLETED)
    if not started.is_set():
        waiter.cancel()
        task.cancel()
        raise AssertionError(f"GET {path} did not start a response within {START_SECONDS}s")
    waiter.cancel()
    response = HeldResponse(head["status"], head["headers"], b"".join(chunks), disconnect, task)
    try:
        yield response
    finally:
        await response.close()
