"""The head-read deadline of `BoundedHttpToolsProtocol`, on a clock the test moves.

One timer per connection checks the deadline of whatever head is being read when it fires,
instead of a timer per request: these tests drive the protocol with a fake loop (no sockets,
no sleeps) and check that every head still gets its own full deadline, and no more.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable
from typing import Any

import uvicorn
from uvicorn.server import ServerState

from undolog.proxy.server import BoundedHttpToolsProtocol, ConnectionLimits, bounded_protocol

TIMEOUT = 10.0
HEAD = b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n"
END = b"\r\n"


class _Handle:
    def __init__(self, when: float, callback: Callable[[], None]) -> None:
        self.when = when
        self.callback = callback
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


class _Task:
    def add_done_callback(self, callback: Callable[[Any], None]) -> None:
        pass


class FakeLoop:
    """Just what the protocol asks of a loop: a clock, timers, and tasks never run."""

    def __init__(self) -> None:
        self.now = 0.0
        self.timers: list[tuple[float, int, _Handle]] = []
        self.armed = 0  # timers made, in all
        self._order = itertools.count()

    def time(self) -> float:
        return self.now

    def call_at(self, when: float, callback: Callable[[], None]) -> _Handle:
        handle = _Handle(when, callback)
        heapq.heappush(self.timers, (when, next(self._order), handle))
        self.armed += 1
        return handle

    def call_later(self, delay: float, callback: Callable[[], None]) -> _Handle:
        return self.call_at(self.now + delay, callback)

    def create_task(self, coro: Any, **_: Any) -> _Task:
        coro.close()  # the app is not what these tests are about
        return _Task()

    def pending(self) -> list[_Handle]:
        return [h for _, _, h in self.timers if not h.cancelled]

    def advance_to(self, moment: float) -> None:
        while self.timers and self.timers[0][0] <= moment:
            when, _, handle = heapq.heappop(self.timers)
            self.now = max(self.now, when)
            if not handle.cancelled:
                handle.callback()
        self.now = moment


class FakeTransport:
    def __init__(self) -> None:
        self.closed = False
        self.written = b""

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"peername": ("127.0.0.1", 50000), "sockname": ("127.0.0.1", 8080)}.get(
            name, default
        )

    def write(self, data: bytes) -> None:
        self.written += data

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


async def _app(scope: Any, receive: Any, send: Any) -> None:  # pragma: no cover - never run
    pass


def _connection() -> tuple[BoundedHttpToolsProtocol, FakeLoop, FakeTransport]:
    limits = ConnectionLimits(
        max_header_bytes=8192,
        header_timeout_seconds=TIMEOUT,
        keep_alive_timeout_seconds=300.0,
        max_connections=100,
    )
    config = uvicorn.Config(
        _app, http=bounded_protocol(limits), lifespan="off", timeout_keep_alive=300
    )
    loop = FakeLoop()
    protocol = bounded_protocol(limits)(config, ServerState(), {}, _loop=loop)  # type: ignore[arg-type]
    transport = FakeTransport()
    protocol.connection_made(transport)  # type: ignore[arg-type]
    return protocol, loop, transport


def _answered(protocol: BoundedHttpToolsProtocol) -> None:
    """The app has answered the request in progress (what the real cycle would set)."""
    protocol.cycle.response_complete = True
    protocol.on_response_complete()


def test_a_connection_that_sends_nothing_is_closed_at_the_deadline() -> None:
    _, loop, transport = _connection()
    loop.advance_to(TIMEOUT - 0.01)
    assert not transport.closed
    loop.advance_to(TIMEOUT)
    assert transport.closed


def test_a_later_heads_deadline_counts_from_its_own_first_byte() -> None:
    protocol, loop, transport = _connection()
    protocol.data_received(HEAD + END)  # request 1, whole, at t=0
    _answered(protocol)
    loop.advance_to(8.0)
    protocol.data_received(HEAD)  # request 2 starts at t=8 and never ends its head
    loop.advance_to(TIMEOUT + 1)  # the connection's timer fires at 10: not due yet
    assert not transport.closed
    loop.advance_to(8.0 + TIMEOUT - 0.01)
    assert not transport.closed
    loop.advance_to(8.0 + TIMEOUT)
    assert transport.closed


def test_a_head_completed_in_time_is_not_closed_and_the_timer_lapses() -> None:
    protocol, loop, transport = _connection()
    protocol.data_received(HEAD + END)
    _answered(protocol)
    loop.advance_to(8.0)
    protocol.data_received(HEAD)
    loop.advance_to(12.0)
    protocol.data_received(END)  # complete at t=12, before its deadline of 18
    _answered(protocol)
    loop.advance_to(100.0)
    assert not transport.closed
    assert not [h for h in loop.pending() if h.callback == protocol._check_head_deadline]


def test_a_head_that_starts_after_the_timer_lapsed_gets_a_timer_again() -> None:
    protocol, loop, transport = _connection()
    protocol.data_received(HEAD + END)
    _answered(protocol)
    loop.advance_to(50.0)  # the first timer fired at 10, found no head, and lapsed
    protocol.data_received(HEAD)
    loop.advance_to(50.0 + TIMEOUT - 0.01)
    assert not transport.closed
    loop.advance_to(50.0 + TIMEOUT)
    assert transport.closed


def test_many_quick_requests_arm_one_head_timer_not_one_each() -> None:
    protocol, loop, transport = _connection()
    armed_before = loop.armed
    for i in range(100):
        loop.advance_to(i * 0.001)
        protocol.data_received(HEAD + END)
        _answered(protocol)
    head_timers = [h for h in loop.pending() if h.callback == protocol._check_head_deadline]
    assert len(head_timers) == 1
    # Besides it, only uvicorn's own keep-alive timer per answered request.
    assert loop.armed - armed_before == 100
    assert not transport.closed


def test_a_closed_connection_leaves_no_head_timer() -> None:
    protocol, loop, _ = _connection()
    protocol.data_received(HEAD)
    protocol.connection_lost(None)
    assert not [h for h in loop.pending() if h.callback == protocol._check_head_deadline]
