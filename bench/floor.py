"""The floor of a Python proxy: a forwarder that keeps nothing, measured beside UndoLog.

`bench/run.py`'s `forward` scenario sends the `direct` call's request to this process, which
sends it on to the upstream and hands back the upstream's answer, on the same stack as the
proxy (uvicorn with httptools on uvloop, no access log; aiohttp to the upstream with the
proxy's connector settings). No auth, no JSON parsed, no store: what one HTTP hop in and one
out cost in Python on this machine, and so a bound on any Python proxy's calls/s. UndoLog's
new call is that plus its own work (auth, the signature, the store's two durable writes).

Run: `python bench/floor.py --port P --upstream http://127.0.0.1:U`; `GET /health` answers 200.
"""

from __future__ import annotations

import argparse
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

import aiohttp
import uvicorn

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]

__all__ = ["Forwarder"]


class Forwarder:
    """A raw ASGI app: POST <path> goes to the upstream's <path>; its status and body return."""

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream.rstrip("/")
        self.session: aiohttp.ClientSession | None = None

    async def __call__(
        self,
        scope: Scope,
        receive: Callable[[], Awaitable[Message]],
        send: Callable[[Message], Awaitable[None]],
    ) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
            return
        if scope["path"] == "/health":
            await _answer(send, 200, b'{"status":"ok"}')
            return
        body = b""
        more = True
        while more:
            message = await receive()
            body += message.get("body", b"")
            more = message.get("more_body", False)
        assert self.session is not None
        async with self.session.post(
            self.upstream + scope["path"],
            data=body,
            headers={"Content-Type": "application/json"},
        ) as response:
            answer = await response.read()
            status = response.status
        await _answer(send, status, answer)

    async def _lifespan(
        self, receive: Callable[[], Awaitable[Message]], send: Callable[[Message], Awaitable[None]]
    ) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=30, ttl_dns_cache=300)
                timeout = aiohttp.ClientTimeout(total=30)
                self.session = aiohttp.ClientSession(connector=connector, timeout=timeout)
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                if self.session is not None:
                    await self.session.close()
                await send({"type": "lifespan.shutdown.complete"})
                return


async def _answer(send: Callable[[Message], Awaitable[None]], status: int, body: bytes) -> None:
    headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--upstream", required=True)
    args = parser.parse_args()
    uvicorn.run(
        Forwarder(args.upstream),
        host="127.0.0.1",
        port=args.port,
        http="httptools",
        loop="uvloop",
        access_log=False,
        log_level="warning",
        lifespan="on",
    )


if __name__ == "__main__":
    main()
