"""Connection caps, against `undolog serve` run as a real process.

One unauthenticated client must not freeze the proxy: an endless header is refused with 431,
idle partial connections are closed after the head-read deadline, connections above the cap
get a canned 503, and `/health` keeps answering within a second through all of it.
"""

from __future__ import annotations

import contextlib
import resource
import select
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import orjson
import pytest

from tests.support.servers import ProcessServer, free_port, undolog_command, wait_until
from undolog.config import DEFAULT_MAX_HEADER_BYTES
from undolog.proxy.server import raise_open_files_limit

pytestmark = pytest.mark.security

IDLE_CONNECTIONS = 2_000
PARTIAL_HEAD = b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Partial: "


def _serve(tmp_path: Path, name: str, **env: str) -> ProcessServer:
    port = free_port()
    settings = {
        "UNDOLOG_DATABASE_URL": f"sqlite:///{tmp_path / (name + '.db')}",
        "UNDOLOG_PORT": str(port),
        "UNDOLOG_LOG_LEVEL": "warning",
        **{f"UNDOLOG_{key.upper()}": value for key, value in env.items()},
    }
    log = str(tmp_path / f"{name}.log")
    return ProcessServer(undolog_command("serve"), settings, port, log_path=log).start()


@pytest.fixture
def server(tmp_path: Path) -> Iterator[ProcessServer]:
    """A proxy with the default caps."""
    running = _serve(tmp_path, "defaults")
    try:
        yield running
    finally:
        running.stop()


@pytest.fixture
def short_server(tmp_path: Path) -> Iterator[ProcessServer]:
    """A proxy with short deadlines and a small connection cap."""
    running = _serve(
        tmp_path,
        "short",
        header_timeout_seconds="1",
        keep_alive_timeout_seconds="0.5",
        max_connections="40",
    )
    try:
        yield running
    finally:
        running.stop()


def _health_within_a_second(url: str) -> None:
    # The requirement itself: a fresh connection's /health answers within 1 s.
    with httpx.Client(timeout=1.0) as client:
        response = client.get(url + "/health")
    assert response.status_code == 200


def _connect(port: int, source: str = "127.0.0.1") -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=5, source_address=(source, 0))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def _closed_by_peer(sock: socket.socket) -> bool:
    """Whether the server has closed `sock` (EOF or reset); reads and drops what it sent."""
    readable, _, _ = select.select([sock], [], [], 0)
    if not readable:
        return False
    try:
        while True:
            data = sock.recv(65536, socket.MSG_DONTWAIT)
            if not data:
                return True
    except BlockingIOError:
        return False
    except OSError:
        return True


def _read_all(sock: socket.socket) -> bytes:
    chunks = []
    with contextlib.suppress(OSError):
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


class _EndlessHeader(threading.Thread):
    """Streams `X-Big: aaaa...` without end, reconnecting each time it is refused.

    Bounded: it stops when told, after `max_connections` refusals, or after `max_bytes` on one
    connection (a server that never refuses fails the test, it does not hang it).
    """

    def __init__(self, port: int, *, max_connections: int = 500, max_bytes: int = 64 << 20):
        super().__init__(daemon=True)
        self.port = port
        self.max_connections = max_connections
        self.max_bytes = max_bytes
        self.stop = threading.Event()
        self.answers: list[bytes] = []
        self.most_bytes_accepted = 0

    def run(self) -> None:
        chunk = b"a" * 8192
        while not self.stop.is_set() and len(self.answers) < self.max_connections:
            sock = _connect(self.port)
            sent = 0
            try:
                sock.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: ")
                while sent < self.max_bytes and not self.stop.is_set():
                    readable, _, _ = select.select([sock], [], [], 0)
                    if readable:
                        break
                    sock.sendall(chunk)
                    sent += len(chunk)
                self.answers.append(_read_all(sock))
            except OSError:
                self.answers.append(b"")  # reset: refused without an answer we could read
            finally:
                self.most_bytes_accepted = max(self.most_bytes_accepted, sent)
                sock.close()


def test_health_answers_within_a_second_while_a_client_streams_an_endless_header(
    server: ProcessServer,
) -> None:
    streamer = _EndlessHeader(server.port)
    streamer.start()
    try:
        wait_until(lambda: len(streamer.answers) >= 3, what="the streamer to be refused thrice")
        for _ in range(20):
            _health_within_a_second(server.url)
    finally:
        streamer.stop.set()
        streamer.join(timeout=30)
    assert not streamer.is_alive()
    refused = [a for a in streamer.answers if a.startswith(b"HTTP/1.1 431 ")]
    assert refused, streamer.answers[:3]
    body = orjson.loads(refused[0].partition(b"\r\n\r\n")[2])
    assert body["code"] == "headers_too_large"
    # Refused near the cap, not after megabytes (socket buffers account for the slack).
    assert streamer.most_bytes_accepted < 16 << 20


def test_headers_under_the_cap_pass_and_over_it_answer_431(server: ProcessServer) -> None:
    with httpx.Client(base_url=server.url, timeout=5) as client:
        fits = client.get("/health", headers={"X-Big": "a" * (DEFAULT_MAX_HEADER_BYTES // 2)})
        assert fits.status_code == 200
        too_big = client.get("/health", headers={"X-Big": "a" * (DEFAULT_MAX_HEADER_BYTES + 1)})
    assert too_big.status_code == 431
    assert too_big.json()["code"] == "headers_too_large"
    assert too_big.headers["connection"] == "close"
    assert too_big.headers["x-request-id"] == too_big.json()["request_id"]


def test_health_answers_within_a_second_while_2000_partial_connections_sit_idle(
    server: ProcessServer,
) -> None:
    open_files = raise_open_files_limit()
    if open_files < IDLE_CONNECTIONS + 256:
        pytest.skip(
            f"this test needs {IDLE_CONNECTIONS + 256} open files, the limit is {open_files}"
        )
    idle: list[socket.socket] = []
    try:
        for n in range(IDLE_CONNECTIONS):
            # From 8 loopback addresses: each stays under the per-address cap (256).
            sock = _connect(server.port, f"127.0.0.{2 + n % 8}")
            sock.sendall(PARTIAL_HEAD)
            idle.append(sock)
        for _ in range(10):
            _health_within_a_second(server.url)
        # They sit: none was refused or closed (the default deadline is 10 s).
        assert not any(_closed_by_peer(sock) for sock in idle[:50])
    finally:
        for sock in idle:
            sock.close()


def test_idle_partial_connections_are_closed_after_the_header_timeout(
    short_server: ProcessServer,
) -> None:
    silent = [_connect(short_server.port) for _ in range(5)]
    partial = [_connect(short_server.port) for _ in range(5)]
    for sock in partial:
        sock.sendall(PARTIAL_HEAD)
    try:
        wait_until(
            lambda: all(_closed_by_peer(sock) for sock in silent + partial),
            timeout=15,
            what="the server to close the idle connections",
        )
        _health_within_a_second(short_server.url)
    finally:
        for sock in silent + partial:
            sock.close()


def test_a_slow_head_is_closed_although_it_keeps_sending(short_server: ProcessServer) -> None:
    sock = _connect(short_server.port)
    try:
        sock.sendall(PARTIAL_HEAD)

        def trickled_and_closed() -> bool:
            # One byte per poll: always "active", never done with its headers.
            with contextlib.suppress(OSError):
                sock.sendall(b"a")
            return _closed_by_peer(sock)

        wait_until(trickled_and_closed, timeout=15, what="the slow head to be closed")
    finally:
        sock.close()


def test_keep_alive_connections_are_closed_when_idle(short_server: ProcessServer) -> None:
    sock = _connect(short_server.port)
    try:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        answer, closed = _read_to_eof(sock, within=10)
    finally:
        sock.close()
    assert answer.startswith(b"HTTP/1.1 200 ")
    assert closed  # the idle keep-alive connection was closed by the server


def test_connections_above_the_cap_get_503_and_are_closed_oldest_keyless_first(
    short_server: ProcessServer,
) -> None:
    held: list[socket.socket] = []
    try:
        for _ in range(60):
            held.append(_connect(short_server.port))
        # The cap is 40 and none has shown a key: each one above it sheds the oldest, which
        # is answered 503 and closed (the newest 40 are kept).
        answers = [_read_to_eof(sock, within=10) for sock in held[:20]]
    finally:
        for sock in held:
            sock.close()
    refused = [
        answer for answer, closed in answers if closed and answer.startswith(b"HTTP/1.1 503 ")
    ]
    assert len(refused) >= 15, answers
    assert orjson.loads(refused[0].partition(b"\r\n\r\n")[2])["code"] == "too_many_connections"
    # Once they are gone, the server takes connections again.
    wait_until(lambda: _answers_health(short_server.url), what="/health after the flood")


def _read_to_eof(sock: socket.socket, *, within: float) -> tuple[bytes, bool]:
    """What the server sends until it closes (True), or until `within` seconds pass (False)."""
    sock.settimeout(within)
    chunks = []
    try:
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    except TimeoutError:
        return b"".join(chunks), False
    except OSError:
        pass  # reset: closed
    return b"".join(chunks), True


def _answers_health(url: str) -> bool:
    try:
        return httpx.get(url + "/health", timeout=1.0).status_code == 200
    except httpx.TransportError:
        return False


def test_the_open_files_limit_is_raised_to_the_hard_limit() -> None:
    soft = raise_open_files_limit()
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    assert resource.getrlimit(resource.RLIMIT_NOFILE)[0] == soft
    assert hard == resource.RLIM_INFINITY or soft == hard


def test_the_connection_cap_is_lowered_to_what_the_open_files_limit_allows() -> None:
    from undolog.config import Settings
    from undolog.proxy.server import RESERVED_FILES, _effective_limits

    assert _effective_limits(Settings(max_connections=100_000), 1024).max_connections == (
        1024 - RESERVED_FILES
    )
    assert _effective_limits(Settings(max_connections=50), 1024).max_connections == 50
