"""The HTTP server around the proxy: uvicorn, with the connection caps uvicorn lacks.

One unauthenticated client must not be able to freeze the proxy. uvicorn's httptools protocol
buffers a request head for as long as the client sends it (httptools has no header size cap,
and grows the pending header by concatenation), and nothing bounds how long a head may take or
how many connections may sit open. `BoundedHttpToolsProtocol` adds, per connection:

- a cap on the bytes of a request head (request line + headers): over it, `431` and close;
- a head-read deadline, from the connection's opening and from the first byte of each later
  request until its headers are complete: then the connection is closed;
- a cap on open connections: one above it is answered a canned `503` and closed at once.

uvicorn's own `timeout_keep_alive` bounds the idle time between requests. The hot path costs
one integer addition per received chunk while a head is being read, and a clock read per
request: the head deadline is a time on the connection, checked by one timer per connection
that re-arms itself for the deadline it finds, rather than a timer armed and cancelled per
request (uvicorn already arms one per request for keep-alive). `build_server` builds the
`uvicorn.Server` from `Settings`; the CLI and the test harness both use it, so tests exercise
the same protection.
"""

from __future__ import annotations

import asyncio
import logging
import resource
from dataclasses import dataclass
from typing import Any, ClassVar

import orjson
import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from undolog.config import Settings
from undolog.engine.model import new_id
from undolog.logs import uvicorn_log_config
from undolog.proxy.wire import error_body

__all__ = [
    "BoundedHttpToolsProtocol",
    "ConnectionLimits",
    "OneLineStartupErrors",
    "build_config",
    "build_server",
    "raise_open_files_limit",
]

HEADERS_TOO_LARGE = "headers_too_large"
TOO_MANY_CONNECTIONS = "too_many_connections"
# How long a refused connection's further bytes are read and dropped before it is closed.
LINGER_SECONDS = 2.0
# Descriptors kept out of the connection cap: store connections, upstream sockets, log files.
RESERVED_FILES = 128
# A timer may fire this much before its time (the loop's clock resolution): still due.
_TIMER_SLACK = 0.001

_log = logging.getLogger("undolog.server")


@dataclass(frozen=True)
class ConnectionLimits:
    """The per-connection caps, in the units uvicorn's protocol works in."""

    max_header_bytes: int
    header_timeout_seconds: float
    keep_alive_timeout_seconds: float
    max_connections: int

    @classmethod
    def from_settings(cls, settings: Settings) -> ConnectionLimits:
        return cls(
            max_header_bytes=settings.max_header_bytes,
            header_timeout_seconds=settings.header_timeout_seconds,
            keep_alive_timeout_seconds=settings.keep_alive_timeout_seconds,
            max_connections=settings.max_connections,
        )


def _refusal(status: int, reason: str, code: str, message: str) -> bytes:
    """A whole HTTP response with the error body and a fresh request id (built per refusal:
    refusals are rare and must not share a timestamp or an id)."""
    request_id = new_id()
    body = orjson.dumps(error_body(request_id, code, message))
    head = (
        f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\nx-request-id: {request_id}\r\n"
        "connection: close\r\n\r\n"
    )
    return head.encode("ascii") + body


class BoundedHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with a head size cap, a head deadline and a connection cap.

    The limits are class attributes, set on a subclass by `bounded_protocol`, because uvicorn
    builds one protocol object per connection from a class.
    """

    limits: ClassVar[ConnectionLimits]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._reading_head = True  # between requests or inside a head: bytes count
        self._head_bytes = 0
        # When the head being read must be complete (None: no head in progress), and the one
        # timer that checks it: it fires at a deadline, finds the current one, and closes the
        # connection or re-arms for a later deadline (a request that began since).
        self._head_deadline: float | None = None
        self._head_timer: asyncio.TimerHandle | None = None
        self._discarding = False  # refused: what still arrives is read and dropped

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if len(self.connections) > self.limits.max_connections:
            # Refused before anything is read or parsed: as cheap as answering gets.
            self._discarding = True
            transport.write(
                _refusal(
                    503,
                    "Service Unavailable",
                    TOO_MANY_CONNECTIONS,
                    "too many open connections; retry later",
                )
            )
            transport.close()
            return
        self._arm_head_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_head_timer()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._discarding:
            return
        if not self._reading_head:
            super().data_received(data)
            return
        if self._head_deadline is None:
            self._arm_head_timer()  # the first byte of a request after keep-alive
        self._head_bytes += len(data)
        super().data_received(data)
        # Checked after parsing: a chunk that completes the head (with some body) is fine.
        if self._reading_head and self._head_bytes > self.limits.max_header_bytes:
            self._refuse_head()

    def on_headers_complete(self) -> None:
        if self._discarding:
            return
        self._reading_head = False
        self._head_deadline = None  # the timer, if pending, finds no head and lapses
        if self._head_bytes > self.limits.max_header_bytes and self._head_size() > (
            self.limits.max_header_bytes
        ):
            # A whole head that came in one chunk: the count above held body bytes too, so
            # measure the head itself (only here, off the common path).
            self._refuse_head()
            return
        super().on_headers_complete()

    def on_body(self, body: bytes) -> None:
        if not self._discarding:
            super().on_body(body)

    def on_message_complete(self) -> None:
        if self._discarding:
            return
        super().on_message_complete()
        self._reading_head = True
        self._head_bytes = 0

    def send_400_response(self, msg: str) -> None:
        if not self._discarding:  # already answered 431
            super().send_400_response(msg)

    def _head_size(self) -> int:
        return len(self.url) + sum(len(name) + len(value) + 4 for name, value in self.headers)

    def _refuse_head(self) -> None:
        """Answer 431, then close after a short linger.

        Closing at once with the client's bytes unread makes the kernel send a reset, which
        can destroy the 431 before the client reads it. So: send it, half-close, drop what
        still arrives, and close for good after `LINGER_SECONDS`.
        """
        self._reading_head = False
        self._discarding = True
        self._cancel_head_timer()
        if self.transport.is_closing():
            return
        if self.cycle is not None and not self.cycle.response_complete:
            # A pipelined head behind a response still being written: no room for a 431.
            self.transport.close()
            return
        limit = self.limits.max_header_bytes
        self.transport.write(
            _refusal(
                431,
                "Request Header Fields Too Large",
                HEADERS_TOO_LARGE,
                f"request headers exceed the limit of {limit} bytes",
            )
        )
        if self.transport.can_write_eof():
            self.transport.write_eof()
            self.loop.call_later(LINGER_SECONDS, self.transport.close)
        else:  # pragma: no cover - TLS transports cannot half-close
            self.transport.close()

    def _arm_head_timer(self) -> None:
        """A head starts now: it must be complete within `header_timeout_seconds`."""
        deadline = self.loop.time() + self.limits.header_timeout_seconds
        self._head_deadline = deadline
        if self._head_timer is None:  # else the pending one re-arms itself for this deadline
            self._head_timer = self.loop.call_at(deadline, self._check_head_deadline)

    def _cancel_head_timer(self) -> None:
        self._head_deadline = None
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _check_head_deadline(self) -> None:
        self._head_timer = None
        deadline = self._head_deadline
        if deadline is None or not self._reading_head:
            return  # no head in progress: the next one arms a timer again
        if self.loop.time() + _TIMER_SLACK < deadline:
            # A later request's head: wait for its own deadline.
            self._head_timer = self.loop.call_at(deadline, self._check_head_deadline)
            return
        self._head_deadline = None
        if not self.transport.is_closing():
            self.transport.close()


class OneLineStartupErrors:
    """Shortens a failed start's log to one line that names the problem.

    Starlette hands uvicorn the whole traceback of a failed lifespan start-up, which uvicorn
    logs as the error. An operator needs its last line ("Database error: cannot open SQLite
    database ...: unable to open database file"); the traceback stays at debug level.
    """

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "lifespan":
            await self.app(scope, receive, send)
            return

        async def send_short(message: Any) -> None:
            if message.get("type") == "lifespan.startup.failed" and message.get("message"):
                _log.debug("start-up traceback:\n%s", message["message"])
                message = {**message, "message": "cannot start: " + _last_line(message["message"])}
            await send(message)

        await self.app(scope, receive, send_short)


def _last_line(traceback_text: str) -> str:
    """`pkg.errors.Database: Database error: x` → `Database error: x`."""
    lines = [line for line in traceback_text.strip().splitlines() if line.strip()]
    last = lines[-1].strip() if lines else "unknown error"
    kind, sep, text = last.partition(": ")
    return text if sep and " " not in kind and text else last


def bounded_protocol(limits: ConnectionLimits) -> type[BoundedHttpToolsProtocol]:
    """A protocol class carrying `limits`."""
    return type("BoundedHttpToolsProtocol", (BoundedHttpToolsProtocol,), {"limits": limits})


def raise_open_files_limit() -> int:
    """Raise this process's soft RLIMIT_NOFILE to its hard limit; return the soft limit now.

    Distributions start processes at a soft limit of 1024 descriptors although the hard limit
    allows far more: every open connection holds one.
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft == resource.RLIM_INFINITY:
        return soft if soft != resource.RLIM_INFINITY else 1 << 20
    if soft < hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        except (ValueError, OSError):  # pragma: no cover - a sandbox may refuse
            return soft
        soft = hard
    return soft


def _effective_limits(settings: Settings, open_files: int) -> ConnectionLimits:
    limits = ConnectionLimits.from_settings(settings)
    ceiling = max(1, open_files - RESERVED_FILES)
    if limits.max_connections > ceiling:
        # More connections than descriptors would fail in accept() instead of being refused.
        _log.warning(
            "max_connections %d lowered to %d: the open-files limit is %d",
            limits.max_connections,
            ceiling,
            open_files,
        )
        limits = ConnectionLimits(
            max_header_bytes=limits.max_header_bytes,
            header_timeout_seconds=limits.header_timeout_seconds,
            keep_alive_timeout_seconds=limits.keep_alive_timeout_seconds,
            max_connections=ceiling,
        )
    return limits


def build_config(
    app: Any,
    settings: Settings,
    *,
    host: str | None = None,
    port: int | None = None,
    log_level: str | None = None,
) -> uvicorn.Config:
    """The uvicorn config for `app` with the caps of `settings` (host, port, log level can be
    overridden)."""
    limits = _effective_limits(settings, raise_open_files_limit())
    return uvicorn.Config(
        OneLineStartupErrors(app),
        host=settings.host if host is None else host,
        port=settings.port if port is None else port,
        log_level=settings.log_level if log_level is None else log_level,
        access_log=False,
        log_config=uvicorn_log_config(),  # JSON lines, like the app's own logs
        lifespan="on",
        http=bounded_protocol(limits),
        # Typed int in uvicorn, but only handed to `loop.call_later`: a fraction works.
        timeout_keep_alive=limits.keep_alive_timeout_seconds,  # type: ignore[arg-type]
        # X-Forwarded-For / -Proto only from the reverse proxies the operator names. uvicorn
        # would trust them from 127.0.0.1 (or its own FORWARDED_ALLOW_IPS) by default: any
        # local client could then choose the address its failed key checks count against.
        # Without trusted proxies its middleware is not installed at all (no cost per request).
        proxy_headers=bool(settings.forwarded_allow_ips),
        forwarded_allow_ips=settings.forwarded_allow_ips,
    )


def build_server(app: Any, settings: Settings, **overrides: Any) -> uvicorn.Server:
    """A `uvicorn.Server` for `app`, bounded as `build_config` says."""
    return uvicorn.Server(build_config(app, settings, **overrides))
