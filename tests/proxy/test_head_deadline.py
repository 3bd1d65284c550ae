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

from undolog.proxy.server import (
    BoundedHttpToolsProtocol,
    ConnectionLimits,
    Seats,
    bounded_protocol,
)

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

    def can_write_eof(self) -> bool:
        return False  # closed at once instead of after a linger

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
    assert not [h for h in loop.pending() if h.callback == protocol._check_deadlines]


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
    head_timers = [h for h in loop.pending() if h.callback == protocol._check_deadlines]
    assert len(head_timers) == 1
    # Besides it, only uvicorn's own keep-alive timer per answered request.
    assert loop.armed - armed_before == 100
    assert not transport.closed


def test_a_closed_connection_leaves_no_head_timer() -> None:
    protocol, loop, _ = _connection()
    protocol.data_received(HEAD)
    protocol.connection_lost(None)
    assert not [h for h in loop.pending() if h.callback == protocol._check_deadlines]


# -- the body deadline and the seats ----------------------------------------------------------


def _body_connection(
    body_timeout: float = 10.0, rate: int = 100
) -> tuple[BoundedHttpToolsProtocol, FakeLoop, FakeTransport]:
    limits = ConnectionLimits(
        max_header_bytes=8192,
        header_timeout_seconds=TIMEOUT,
        keep_alive_timeout_seconds=300.0,
        max_connections=100,
        body_timeout_seconds=body_timeout,
        min_body_bytes_per_second=rate,
    )
    config = uvicorn.Config(
        _app, http=bounded_protocol(limits), lifespan="off", timeout_keep_alive=300
    )
    loop = FakeLoop()
    protocol = bounded_protocol(limits)(config, ServerState(), {}, _loop=loop)  # type: ignore[arg-type]
    transport = FakeTransport()
    protocol.connection_made(transport)  # type: ignore[arg-type]
    return protocol, loop, transport


BODY_HEAD = b"POST /tools/x HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 100000\r\n\r\n"


def test_a_body_must_arrive_within_its_timeout_plus_what_its_bytes_earn() -> None:
    protocol, loop, transport = _body_connection(body_timeout=10.0, rate=100)
    protocol.data_received(BODY_HEAD)  # the body starts at t=0
    loop.advance_to(5.0)
    protocol.data_received(b"x" * 300)  # 300 bytes: 3 s more, the deadline is 13
    loop.advance_to(12.99)
    assert not transport.closed
    loop.advance_to(13.0)
    assert transport.written.startswith(b"HTTP/1.1 408 ")
    assert b'"request_timeout"' in transport.written


def test_a_body_at_the_minimum_rate_is_never_cut() -> None:
    protocol, loop, transport = _body_connection(body_timeout=1.0, rate=100)
    protocol.data_received(BODY_HEAD)
    for second in range(60):
        loop.advance_to(second + 0.5)
        protocol.data_received(b"x" * 100)  # a second's worth, each second
    assert not transport.closed and not transport.written


def test_a_whole_body_in_the_heads_chunk_reads_no_clock_and_arms_no_body_timer() -> None:
    protocol, loop, transport = _body_connection()
    armed = loop.armed
    protocol.data_received(
        b"POST /tools/x HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 2\r\n\r\n{}"
    )
    assert protocol._body_started is None
    assert loop.armed == armed
    assert not transport.closed


class _Conn:
    """What `Seats` asks of a connection: its address, whether its answer is being made, and
    to be shed."""

    def __init__(self, seats: Seats, host: str) -> None:
        self.host = host
        self.seats = seats
        self.shed_count = 0
        self.answering = False

    def shed(self) -> None:
        self.shed_count += 1
        self.seats.leave(self)  # type: ignore[arg-type]


def _seats(**limits: Any) -> Seats:
    values: dict[str, Any] = {
        "max_header_bytes": 8192,
        "header_timeout_seconds": 10.0,
        "keep_alive_timeout_seconds": 5.0,
        "max_connections": 16,
        "max_connections_per_client": 8,
        "reserved_connections": 4,
    }
    values.update(limits)
    return Seats(ConnectionLimits(**values))


def _arrive(seats: Seats, host: str) -> tuple[_Conn, bool]:
    conn = _Conn(seats, host)
    return conn, seats.seat(conn)  # type: ignore[arg-type]


def test_an_address_over_its_cap_sheds_its_own_oldest() -> None:
    seats = _seats()
    flood = [_arrive(seats, "10.0.0.9")[0] for _ in range(10)]
    assert [c.shed_count for c in flood] == [1, 1] + [0] * 8
    _, seated = _arrive(seats, "10.0.0.1")
    assert seated and all(c.shed_count <= 1 for c in flood)


def test_a_light_address_sheds_the_heaviest_addresses_oldest_never_its_peers() -> None:
    seats = _seats(max_connections_per_client=16)  # unverified cap: 16 - 4 = 12
    light = [_arrive(seats, "10.0.0.1")[0] for _ in range(2)]
    flood = [_arrive(seats, f"10.0.1.{n % 3}")[0] for n in range(60)]
    assert not any(c.shed_count for c in light)  # the flood cycled through its own seats
    _, seated = _arrive(seats, "10.0.0.1")
    assert seated and not any(c.shed_count for c in light)
    assert len(seats.unverified) == 12
    assert sum(c.shed_count for c in flood) == 60 - 12 + 3


def test_verified_connections_are_never_shed_and_past_them_a_newcomer_is_refused() -> None:
    seats = _seats(max_connections=4, reserved_connections=0)
    verified = [_arrive(seats, "10.0.0.1")[0] for _ in range(4)]
    for conn in verified:
        seats.verified(conn)  # type: ignore[arg-type]
    _, seated = _arrive(seats, "10.0.0.2")
    assert not seated
    assert not any(c.shed_count for c in verified)


def test_a_connection_being_answered_is_shed_after_the_others_of_its_address() -> None:
    """From one address, the oldest connection whose request is already in (a `/health`, a
    key being checked) is passed over for the next oldest that is still sending."""
    seats = _seats(max_connections_per_client=2)
    answered, sending = _Conn(seats, "10.0.0.1"), _Conn(seats, "10.0.0.1")
    answered.answering = True
    for conn in (answered, sending):
        assert seats.seat(conn)  # type: ignore[arg-type]
    assert seats.seat(_Conn(seats, "10.0.0.1"))  # type: ignore[arg-type]
    assert (answered.shed_count, sending.shed_count) == (0, 1)
