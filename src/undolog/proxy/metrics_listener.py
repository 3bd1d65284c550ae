"""A second listener that serves only `/metrics`, without auth, for a private interface.

`/metrics` names every org, so the main port serves it only to the configured bearer token.
A Prometheus scraper on a private network can instead be pointed at `metrics_host:
metrics_port` (default host 127.0.0.1): bind that to an interface only the scraper reaches.
It runs in the proxy's own event loop, started and stopped with the app; its socket is bound
before the app reports ready, so a port already in use stops the start with a clear error.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import Awaitable, Callable, Iterator, MutableMapping
from typing import Any

import orjson
import uvicorn

from undolog.logs import uvicorn_log_config
from undolog.services.metrics import ProxyMetrics

__all__ = ["MetricsListener", "metrics_app"]

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]


def metrics_app(metrics: ProxyMetrics) -> Callable[[Scope, Receive, Send], Awaitable[None]]:
    """ASGI app: `GET /metrics` is the exposition; anything else is 404."""

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":  # lifespan and websockets: nothing to do
            return
        if scope["path"] == "/metrics" and scope["method"] in ("GET", "HEAD"):
            status, content_type = 200, b"text/plain; version=0.0.4; charset=utf-8"
            body = metrics.render()
        else:
            status, content_type = 404, b"application/json"
            body = orjson.dumps({"code": "not_found", "message": "this listener serves /metrics"})
        headers = [(b"content-type", content_type), (b"content-length", str(len(body)).encode())]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    return app


class _Server(uvicorn.Server):
    """uvicorn without its signal handlers: the main server owns SIGINT/SIGTERM."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


class MetricsListener:
    """Serve `metrics_app` on (host, port) inside the running loop."""

    def __init__(self, metrics: ProxyMetrics, host: str, port: int) -> None:
        self.host = host
        self.port = port
        self._config = uvicorn.Config(
            metrics_app(metrics), host=host, port=port, lifespan="off", log_level="warning",
            access_log=False, log_config=uvicorn_log_config(),
        )  # fmt: skip
        self._server = _Server(self._config)
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Bind (raising OSError if the address is taken) and serve in the background."""
        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((self.host, self.port))
            sock.listen(128)
            sock.setblocking(False)
        except OSError:
            sock.close()
            raise
        self._task = asyncio.create_task(self._server.serve(sockets=[sock]))

    async def stop(self) -> None:
        if self._task is None:
            return
        self._server.should_exit = True
        with contextlib.suppress(asyncio.CancelledError, SystemExit):
            await self._task
        self._task = None
