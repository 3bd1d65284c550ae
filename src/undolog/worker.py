"""One worker of `undolog serve --workers N` (`undolog.supervisor`): a whole proxy serving the
socket its supervisor bound, on a store its supervisor prepared.

It tells the supervisor once it serves (a pipe), so that a worker dying during its start can
be told from one dying later; and it shuts down by itself when the supervisor is gone (the
parent's sentinel becomes readable), so that a supervisor killed -9 leaves no worker behind.
"""

from __future__ import annotations

import asyncio
import dataclasses
import multiprocessing
import os
import socket
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import structlog
import uvicorn

from undolog.config import Settings
from undolog.loop import run_on_uvloop

__all__ = ["WORKER_HEADER", "worker_main"]

WORKER_HEADER = b"x-undolog-worker"

_log = structlog.get_logger("undolog.worker")


class _WorkerServer(uvicorn.Server):
    """uvicorn, telling the supervisor once it serves, and stopping if the supervisor dies."""

    def __init__(self, config: uvicorn.Config, ready: Connection) -> None:
        super().__init__(config)
        self._ready_pipe = ready

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        if self.started and not self.should_exit:
            self._ready_pipe.send_bytes(b"serving")
        parent = multiprocessing.parent_process()
        if parent is not None:
            asyncio.get_running_loop().add_reader(parent.sentinel, self._orphaned, parent.sentinel)

    def _orphaned(self, sentinel: int) -> None:
        asyncio.get_running_loop().remove_reader(sentinel)
        _log.warning("supervisor_gone", pid=os.getpid())
        self.should_exit = True


class _WorkerHeader:
    """Test-only ASGI wrapper (`WORKER_HEADER_ENV`): names the worker in every response."""

    def __init__(self, app: Any, value: str) -> None:
        self.app = app
        self.value = value.encode("ascii")

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def named(message: Any) -> None:
            if message["type"] == "http.response.start":
                headers = [*message.get("headers", ()), (WORKER_HEADER, self.value)]
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, named)


def worker_main(
    settings: Settings, index: int, sock: socket.socket, ready: Connection, header: bool
) -> None:
    """A worker's life: the proxy app (the store already prepared) served on `sock`."""
    from undolog.logs import configure_logging
    from undolog.proxy import create_app
    from undolog.proxy.server import build_config
    from undolog.telemetry import exporting_spans

    configure_logging(settings.log_level)
    # Each worker keeps its own spool of held results, found again by its index on restart.
    settings = dataclasses.replace(
        settings, spool_dir=str(Path(settings.spool_dir) / f"worker-{index}")
    )
    app: Any = create_app(settings, prepared=True)
    if header:
        app = _WorkerHeader(app, f"{index}/{os.getpid()}")
    server = _WorkerServer(build_config(app, settings), ready)
    with exporting_spans():  # OTEL_EXPORTER_OTLP_*: this worker's spans, flushed at its stop
        run_on_uvloop(server.serve(sockets=[sock]))
