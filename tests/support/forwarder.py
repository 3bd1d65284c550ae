"""A loopback TCP forwarder that a test can cut and restore: a network outage on demand.

Placed between a proxy and PostgreSQL, `cut()` drops every open connection (both sides see the
socket close, as when a database host goes away) and refuses new ones by closing them as soon as
they are accepted; `restore()` forwards again. It runs on its own asyncio loop in a daemon
thread, so synchronous and asynchronous tests drive it the same way.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable, Coroutine, Iterator
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Forwarder", "forwarding"]

_CHUNK = 65536


@dataclass
class Forwarder:
    """Forwards 127.0.0.1:`port` to `target_host`:`target_port` until stopped."""

    target_host: str
    target_port: int
    port: int = 0
    accepted: int = 0
    refused: int = 0
    _cut: bool = False
    _muted: bool = False
    _mute_marker: bytes | None = None
    _loop: asyncio.AbstractEventLoop | None = None
    _thread: threading.Thread | None = None
    _server: asyncio.Server | None = None
    _pipes: set[asyncio.Task[Any]] = field(default_factory=set)

    def start(self) -> Forwarder:
        ready = threading.Event()
        self._loop = asyncio.new_event_loop()

        def run() -> None:
            assert self._loop is not None
            asyncio.set_event_loop(self._loop)
            self._server = self._loop.run_until_complete(
                asyncio.start_server(self._accept, "127.0.0.1", self.port)
            )
            self.port = self._server.sockets[0].getsockname()[1]
            ready.set()
            self._loop.run_forever()

        self._thread = threading.Thread(target=run, name="forwarder", daemon=True)
        self._thread.start()
        if not ready.wait(10):
            raise TimeoutError("the forwarder did not start listening")
        return self

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def _on_loop(self, coro: Coroutine[Any, Any, None]) -> None:
        assert self._loop is not None
        asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout=10)

    def cut(self) -> None:
        """Drop every open connection and refuse new ones until `restore()`."""
        self._on_loop(self._drop_all())

    def restore(self) -> None:
        """Forward new connections again (and the answers, if muted)."""
        self._on_loop(self._set_cut(False))

    def mute(self) -> None:
        """Drop what the target answers, on every connection, until `cut()` or `restore()`:
        requests still arrive (and may commit) but their answers never do."""
        self._on_loop(self._set_muted(True))

    def mute_after(self, marker: bytes) -> None:
        """`mute()` as soon as a request carrying `marker` has been forwarded (for example a
        statement's bound parameter): that request reaches the target, its answer does not."""
        self._mute_marker = marker

    @property
    def open_connections(self) -> int:
        return len(self._pipes)

    def stop(self) -> None:
        if self._loop is None:
            return
        self._on_loop(self._shutdown())
        self._loop.call_soon_threadsafe(self._loop.stop)
        if self._thread is not None:
            self._thread.join(timeout=10)
        self._loop.close()
        self._loop = None

    async def _set_cut(self, value: bool) -> None:
        self._cut = value
        self._muted = False
        self._mute_marker = None

    async def _set_muted(self, value: bool) -> None:
        self._muted = value

    def _sent(self, data: bytes) -> None:
        if self._mute_marker is not None and self._mute_marker in data:
            self._muted = True

    async def _drop_all(self) -> None:
        self._cut = True
        for task in list(self._pipes):
            task.cancel()
        await asyncio.gather(*self._pipes, return_exceptions=True)

    async def _shutdown(self) -> None:
        await self._drop_all()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self._cut:
            self.refused += 1
            _abort(writer)
            return
        self.accepted += 1
        task = asyncio.current_task()
        assert task is not None
        self._pipes.add(task)
        upstream: asyncio.StreamWriter | None = None
        try:
            up_reader, upstream = await asyncio.open_connection(self.target_host, self.target_port)
            await asyncio.gather(
                _pump(reader, upstream, sent=self._sent),
                _pump(up_reader, writer, muted=lambda: self._muted),
            )
        except (OSError, asyncio.CancelledError):
            pass
        finally:
            self._pipes.discard(task)
            _abort(writer)
            if upstream is not None:
                _abort(upstream)


async def _pump(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    *,
    muted: Callable[[], bool] = lambda: False,
    sent: Callable[[bytes], None] = lambda data: None,
) -> None:
    """Copy one direction until EOF (dropping what is read while `muted()`, telling `sent`
    what was forwarded); then close the other side's writing half."""
    while data := await reader.read(_CHUNK):
        if muted():
            continue
        writer.write(data)
        await writer.drain()
        sent(data)
    with contextlib.suppress(OSError):
        writer.write_eof()


def _abort(writer: asyncio.StreamWriter) -> None:
    """Close at once (RST, no lingering): what a vanished peer looks like."""
    transport = writer.transport
    if not transport.is_closing():
        transport.abort()


@contextlib.contextmanager
def forwarding(target_host: str, target_port: int) -> Iterator[Forwarder]:
    forwarder = Forwarder(target_host, target_port).start()
    try:
        yield forwarder
    finally:
        forwarder.stop()
