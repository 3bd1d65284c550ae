"""The HTTP server around the proxy: uvicorn, with the connection caps uvicorn lacks.

One unauthenticated client must not be able to freeze the proxy. uvicorn's httptools protocol
buffers a request head for as long as the client sends it (httptools has no header size cap,
and grows the pending header by concatenation), and nothing bounds how long a head may take or
how many connections may sit open. `BoundedHttpToolsProtocol` adds, per connection:

- a cap on the bytes of a request head (request line + headers): over it, `431` and close;
- a head-read deadline, from the connection's opening and from the first byte of each later
  request until its headers are complete: then the connection is closed;
- a body deadline with a minimum rate (`body_timeout_seconds` from the first chunk that leaves
  a body incomplete, plus a second per `min_body_bytes_per_second` received): then `408`;
- an answer sent before its request's body was in (the edge refuses a missing or wrong key
  from the headers alone) ends the connection: the rest of the body is not waited for;
- seats (`Seats`): caps on open connections, per client address and overall, for connections
  that have not shown a valid key, which are shed (a canned `503`) to seat newer ones, so that
  a slow or keyless flood cannot shut out clients with a key.

uvicorn's own `timeout_keep_alive` bounds the idle time between requests. The hot path costs
one integer addition per received chunk, a clock read per request and one per body still
incomplete after a chunk: the deadlines are times on the connection, checked by one timer per
connection that re-arms itself for the deadline it finds, rather than a timer armed and
cancelled per request (uvicorn already arms one per request for keep-alive). A connection
costs two dictionary entries until it shows a valid key. `build_server` builds the
`uvicorn.Server` from `Settings`; the CLI and the test harness both use it, so tests exercise
the same protection.
"""

from __future__ import annotations

import asyncio
import dataclasses
import ipaddress
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
REQUEST_TIMEOUT = "request_timeout"
# The ASGI scope extension through which the edge reports a request's valid credentials: a
# callable, present only while the connection has shown none (`Edge` calls it).
CONNECTION_VERIFIED = "undolog.connection_verified"
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
    body_timeout_seconds: float = 10.0
    min_body_bytes_per_second: int = 1024
    max_connections_per_client: int = 256
    reserved_connections: int = 0
    forwarded_allow_ips: str = ""  # trusted reverse proxies: no per-address cap for them

    @classmethod
    def from_settings(cls, settings: Settings) -> ConnectionLimits:
        return cls(
            max_header_bytes=settings.max_header_bytes,
            header_timeout_seconds=settings.header_timeout_seconds,
            keep_alive_timeout_seconds=settings.keep_alive_timeout_seconds,
            max_connections=settings.max_connections,
            body_timeout_seconds=settings.body_timeout_seconds,
            min_body_bytes_per_second=settings.min_body_bytes_per_second,
            max_connections_per_client=settings.max_connections_per_client,
            reserved_connections=settings.reserved_connections,
            forwarded_allow_ips=settings.forwarded_allow_ips,
        )

    @property
    def unverified_cap(self) -> int:
        """Connections that may be open at once without a valid key (the rest is reserved)."""
        reserve = min(self.reserved_connections, self.max_connections // 4)
        return max(1, self.max_connections - reserve)


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


def _too_many() -> bytes:
    return _refusal(
        503, "Service Unavailable", TOO_MANY_CONNECTIONS, "too many open connections; retry later"
    )


class _Trusted:
    """The addresses of `forwarded_allow_ips`: reverse proxies, exempt from the per-address
    cap (all their clients share their address)."""

    def __init__(self, setting: str) -> None:
        entries = [e.strip() for e in setting.split(",") if e.strip()]
        self.everyone = "*" in entries
        self.networks = [ipaddress.ip_network(e, strict=False) for e in entries if e != "*"]

    def __contains__(self, host: str) -> bool:
        if self.everyone:
            return True
        if not self.networks:
            return False
        try:
            address = ipaddress.ip_address(host)
        except ValueError:
            return False
        return any(address in network for network in self.networks)


class Seats:
    """The connections of one server, by whether they have shown a valid key yet.

    Every connection starts unverified; the edge marks it verified at its first request with
    valid credentials, and a verified connection is never shed. Unverified connections are
    kept in order of arrival, per client address. When an address holds more than
    `max_connections_per_client` of them (reverse proxies named in `forwarded_allow_ips`
    excepted), its oldest is shed. When all unverified ones together exceed `unverified_cap`
    (the rest of `max_connections` is reserved for verified ones), or the server exceeds
    `max_connections`, one is shed to seat the newcomer, fairly: the oldest of the newcomer's
    own address if that address holds more than its share, else the oldest of the address
    holding the most, else the oldest of all. A flood from some addresses thus cycles
    through its own seats and cannot shed the connections of an address that holds fewer;
    only when no other connection can be shed is the newcomer refused (503).
    """

    def __init__(self, limits: ConnectionLimits) -> None:
        self.limits = limits
        self.open = 0
        self.unverified: dict[BoundedHttpToolsProtocol, None] = {}  # oldest first
        self.by_client: dict[str, dict[BoundedHttpToolsProtocol, None]] = {}  # unverified
        self.trusted = _Trusted(limits.forwarded_allow_ips)

    def seat(self, conn: BoundedHttpToolsProtocol) -> bool:
        """Count `conn` in, shedding older unverified ones as needed; False: refuse it."""
        limits = self.limits
        self.open += 1
        self.unverified[conn] = None
        own = self.by_client.setdefault(conn.host, {})
        own[conn] = None
        if len(own) > limits.max_connections_per_client and conn.host not in self.trusted:
            _sheddable(own).shed()  # never `conn`, the newest, as the cap is at least 1
        if len(self.unverified) > limits.unverified_cap or self.open > limits.max_connections:
            victim = self._victim(conn, own)
            if victim is None:
                return False
            victim.shed()
        return True

    def _victim(
        self, conn: BoundedHttpToolsProtocol, own: dict[BoundedHttpToolsProtocol, None]
    ) -> BoundedHttpToolsProtocol | None:
        oldest_own = _sheddable(own)
        if oldest_own is not conn and len(own) * len(self.by_client) > self.limits.unverified_cap:
            return oldest_own  # its address holds more than its share
        heaviest = max(self.by_client.values(), key=len)  # only when a light address comes
        if len(heaviest) > len(own):
            return _sheddable(heaviest)
        oldest = _sheddable(self.unverified)
        return None if oldest is conn else oldest

    def verified(self, conn: BoundedHttpToolsProtocol) -> None:
        if self.unverified.pop(conn, 0) is None:
            same = self.by_client[conn.host]
            del same[conn]
            if not same:
                del self.by_client[conn.host]

    def leave(self, conn: BoundedHttpToolsProtocol) -> None:
        self.open -= 1
        self.verified(conn)


_SHED_SCAN = 64  # how many of the oldest a victim is looked for among


def _sheddable(conns: dict[BoundedHttpToolsProtocol, None]) -> BoundedHttpToolsProtocol:
    """The oldest of `conns` that is not being answered (a whole request is in: a `/health`
    or a request whose key is being checked, from the same address as a flood), among the
    oldest few; else the oldest."""
    first = None
    for n, conn in enumerate(conns):
        if first is None:
            first = conn
        if not conn.answering:
            return conn
        if n >= _SHED_SCAN:
            break
    assert first is not None
    return first


class BoundedHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with head and body deadlines and connection seats.

    The limits are class attributes, set on a subclass by `bounded_protocol`, because uvicorn
    builds one protocol object per connection from a class.
    """

    limits: ClassVar[ConnectionLimits]
    seats: ClassVar[Seats]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.host = ""
        self._reading_head = True  # between requests or inside a head: bytes count
        self._head_bytes = 0
        # When the head being read must be complete (None: no head in progress).
        self._head_deadline: float | None = None
        # The body being read: whether one is, when it began (None: not yet clocked: only a
        # body still incomplete after a chunk is), and its bytes so far.
        self._in_body = False
        self._body_started: float | None = None
        self._body_bytes = 0
        # The one timer that checks both deadlines: it fires, finds the current deadline, and
        # closes the connection or re-arms for a later one (a request that began since).
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = 0.0
        self._seated = False
        self._verified = False
        self._extensions: dict[str, Any] | None = None
        self._discarding = False  # refused: what still arrives is read and dropped

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self.host = self.client[0] if self.client else ""
        self._seated = True
        if not self.seats.seat(self):
            # Refused before anything is read or parsed: as cheap as answering gets.
            self._leave()
            self._discarding = True
            transport.write(_too_many())
            transport.close()
            return
        self._arm_head_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_timer()
        self._leave()
        super().connection_lost(exc)

    def _leave(self) -> None:
        if self._seated:
            self._seated = False
            self.seats.leave(self)

    @property
    def answering(self) -> bool:
        """A whole request is in and its answer is being made: shed last."""
        return self._reading_head and self.cycle is not None and not self.cycle.response_complete

    def mark_verified(self) -> None:
        """The edge found valid credentials on this connection: it is never shed."""
        if not self._verified:
            self._verified = True
            self._extensions = None
            if self._seated:
                self.seats.verified(self)

    def shed(self) -> None:
        """Close this (unverified) connection to seat a newer one."""
        self._leave()
        self._cut(_too_many(), linger=False)

    def data_received(self, data: bytes) -> None:
        if self._discarding:
            return
        if self._reading_head:
            if self._head_deadline is None:
                self._arm_head_timer()  # the first byte of a request after keep-alive
            self._head_bytes += len(data)
            super().data_received(data)
            # Checked after parsing: a chunk that completes the head (with some body) is fine.
            if self._reading_head and self._head_bytes > self.limits.max_header_bytes:
                self._refuse_head()
        else:
            self._body_bytes += len(data)
            super().data_received(data)
        if self._in_body and self._body_started is None and not self._discarding:
            self._start_body_clock()

    def on_message_begin(self) -> None:
        super().on_message_begin()
        if not self._verified:
            if self._extensions is None:
                self._extensions = {CONNECTION_VERIFIED: self.mark_verified}
            self.scope["extensions"] = self._extensions

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
        self._in_body = True
        self._body_bytes = 0
        super().on_headers_complete()

    def on_body(self, body: bytes) -> None:
        if not self._discarding:
            super().on_body(body)

    def on_message_complete(self) -> None:
        if self._discarding:
            return
        super().on_message_complete()
        self._in_body = False
        self._body_started = None
        self._reading_head = True
        self._head_bytes = 0

    def on_response_complete(self) -> None:
        if self._in_body and not self.pipeline and not self._discarding:
            # Answered before its body was in (a bad key, a body too large): the rest of the
            # body is not waited for, and the connection is not kept for another request.
            self._cut(None, linger=True)
        super().on_response_complete()

    def send_400_response(self, msg: str) -> None:
        if not self._discarding:  # already answered 431
            super().send_400_response(msg)

    def _head_size(self) -> int:
        return len(self.url) + sum(len(name) + len(value) + 4 for name, value in self.headers)

    def _refuse_head(self) -> None:
        """Answer 431, then close after a short linger."""
        if self.cycle is not None and not self.cycle.response_complete:
            # A pipelined head behind a response still being written: no room for a 431.
            self._cut(None, linger=False)
            return
        limit = self.limits.max_header_bytes
        answer = _refusal(
            431,
            "Request Header Fields Too Large",
            HEADERS_TOO_LARGE,
            f"request headers exceed the limit of {limit} bytes",
        )
        self._cut(answer, linger=True)

    def _cut(self, answer: bytes | None, *, linger: bool) -> None:
        """End this connection: the request in progress sees a disconnect, `answer` (if
        any, and if no response has started) is sent, and the connection closes.

        Closing at once with the client's bytes unread makes the kernel send a reset, which
        can destroy the answer before the client reads it. So with `linger`: send it,
        half-close, drop what still arrives, and close for good after `LINGER_SECONDS` (or
        when the client closes first).
        """
        transport = self.transport
        if self._discarding:  # cut already (lingering, half-closed): now for good
            transport.close()
            return
        self._reading_head = False
        self._in_body = False
        self._discarding = True
        self._cancel_timer()
        cycle = self.cycle
        started = False
        if cycle is not None and not cycle.response_complete:
            started = cycle.response_started
            cycle.disconnected = True  # the app's receive() returns http.disconnect
            cycle.message_event.set()
        if transport.is_closing():
            return
        if answer is not None and not started:
            transport.write(answer)
        if linger and transport.can_write_eof():
            transport.write_eof()
            self.loop.call_later(LINGER_SECONDS, transport.close)
        else:
            transport.close()

    # -- deadlines ---------------------------------------------------------------------------

    def _arm_head_timer(self) -> None:
        """A head starts now: it must be complete within `header_timeout_seconds`."""
        deadline = self.loop.time() + self.limits.header_timeout_seconds
        self._head_deadline = deadline
        if self._timer is None:  # else the pending one re-arms itself for this deadline
            self._arm(deadline)

    def _start_body_clock(self) -> None:
        """A body is still incomplete after a chunk: its deadline counts from now."""
        now = self.loop.time()
        self._body_started = now
        deadline = now + self.limits.body_timeout_seconds
        if self._timer is None or self._timer_at > deadline:
            self._arm(deadline)

    def _arm(self, when: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer_at = when
        self._timer = self.loop.call_at(when, self._check_deadlines)

    def _cancel_timer(self) -> None:
        self._head_deadline = None
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _body_deadline(self) -> float | None:
        """When the body in progress must be in: `body_timeout_seconds` from its start, plus
        a second per `min_body_bytes_per_second` bytes received (a client below that average
        rate falls behind its deadline)."""
        if not self._in_body or self._body_started is None:
            return None
        limits = self.limits
        earned = self._body_bytes / limits.min_body_bytes_per_second
        return self._body_started + limits.body_timeout_seconds + earned

    def _check_deadlines(self) -> None:
        self._timer = None
        if self._discarding:
            return
        head = self._head_deadline if self._reading_head else None
        body = self._body_deadline()
        deadline = head if head is not None else body
        if deadline is None:
            return  # nothing being read: the next head or body arms a timer again
        if self.loop.time() + _TIMER_SLACK < deadline:
            self._arm(deadline)  # a later request's head, or a body that earned more time
            return
        if head is not None:
            self._head_deadline = None
            self._cut(None, linger=False)
            return
        limits = self.limits
        answer = _refusal(
            408,
            "Request Timeout",
            REQUEST_TIMEOUT,
            f"the request body did not arrive in time: {limits.body_timeout_seconds:g} s, then "
            f"at least {limits.min_body_bytes_per_second} bytes per second",
        )
        self._cut(answer, linger=True)


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
    """A protocol class carrying `limits`, and the seats of the server it is used by."""
    attributes = {"limits": limits, "seats": Seats(limits)}
    return type("BoundedHttpToolsProtocol", (BoundedHttpToolsProtocol,), attributes)


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
        limits = dataclasses.replace(limits, max_connections=ceiling)
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
        ssl_certfile=settings.ssl_certfile,
        ssl_keyfile=settings.ssl_keyfile,
    )


def build_server(app: Any, settings: Settings, **overrides: Any) -> uvicorn.Server:
    """A `uvicorn.Server` for `app`, bounded as `build_config` says."""
    return uvicorn.Server(build_config(app, settings, **overrides))
