"""A round-robin HTTP load balancer for tests: each request goes to the next backend.

No sticky sessions, as the harshest load balancer would have it: one client's keep-alive
connection does not pin it to a process, because the balancer forwards request by request
(an L7 balancer with a pool of connections to its backends, like nginx or a cloud LB).
It is an ASGI app (run it with `serve_in_thread`) that forwards each request with aiohttp and
streams the answer back as it arrives, so an SSE stream flows through it, and ends the
upstream request when its client leaves. Every answer names its backend in `X-Backend`
(the index in `backends`), and `served` counts the requests each backend got.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from typing import Any

import aiohttp

__all__ = ["BACKEND_HEADER", "RoundRobin"]

BACKEND_HEADER = "x-backend"
# Hop-by-hop headers (RFC 9110 7.6.1) and those aiohttp sets itself.
_DROPPED = frozenset(
    {b"host", b"connection", b"keep-alive", b"transfer-encoding", b"content-length", b"te",
     b"upgrade", b"proxy-connection"}
)  # fmt: skip
_DROPPED_BACK = frozenset({b"connection", b"keep-alive", b"transfer-encoding"})


class RoundRobin:
    """Forwards request N to `backends[N % len(backends)]`."""

    def __init__(self, backends: list[str]) -> None:
        self.backends = backends
        self.served: Counter[int] = Counter()
        self._turns = 0
        self._session: aiohttp.ClientSession | None = None

    @property
    def upcoming(self) -> int:
        """The backend the next request goes to."""
        return self._turns % len(self.backends)

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
            return
        if scope["type"] != "http":  # pragma: no cover - the tests speak HTTP only
            return
        index = self.upcoming
        self._turns += 1
        self.served[index] += 1
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        forward = asyncio.create_task(self._forward(index, scope, body, send))
        left = asyncio.create_task(_disconnected(receive))
        await asyncio.wait({forward, left}, return_when=asyncio.FIRST_COMPLETED)
        for task in (forward, left):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, aiohttp.ClientError, OSError):
                await task

    async def _forward(self, index: int, scope: Any, body: bytes, send: Any) -> None:
        if self._session is None:
            self._session = aiohttp.ClientSession(
                auto_decompress=False, timeout=aiohttp.ClientTimeout(total=None, connect=10)
            )
        url = self.backends[index] + scope["raw_path"].decode("latin-1")
        if scope.get("query_string"):
            url += "?" + scope["query_string"].decode("latin-1")
        headers = [
            (k.decode("latin-1"), v.decode("latin-1"))
            for k, v in scope["headers"]
            if k.lower() not in _DROPPED
        ]
        try:
            async with self._session.request(
                scope["method"], url, headers=headers, data=body, allow_redirects=False
            ) as answer:
                back = [(k, v) for k, v in answer.raw_headers if k.lower() not in _DROPPED_BACK]
                back.append((BACKEND_HEADER.encode(), str(index).encode()))
                await send({"type": "http.response.start", "status": answer.status,
                            "headers": back})  # fmt: skip
                async for chunk in answer.content.iter_any():
                    await send({"type": "http.response.body", "body": chunk, "more_body": True})
        except (aiohttp.ClientConnectionError, TimeoutError):
            # The backend went away: what a balancer says then (or the stream just ends).
            with contextlib.suppress(RuntimeError):
                await send({"type": "http.response.start", "status": 502, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    async def _lifespan(self, receive: Any, send: Any) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                if self._session is not None:
                    await self._session.close()
                await send({"type": "lifespan.shutdown.complete"})
                return


async def _disconnected(receive: Any) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass
