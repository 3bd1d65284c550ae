"""Slow and keyless clients cannot shut out the ones with a key (issue 22), against
`undolog serve` run as a real process.

The attack: thousands of connections that send complete headers and then one body byte now
and then held every slot of `--max-connections` (the head deadline ended with the headers,
and the key was checked only once the body was in), so a valid admin key got `503
too_many_connections`. Now the key is checked from the headers and a bad one is answered at
once; a body has a deadline and a minimum rate; each client address may hold only so many
connections without a valid key; and connections that have not shown a valid key are shed,
oldest first, to keep a slice of `--max-connections` for those that have.

The flood comes from other loopback addresses (127.0.0.2 and up: Linux routes all of
127/8 to the loopback interface), the admin and `/health` from 127.0.0.1.
"""

from __future__ import annotations

import contextlib
import secrets
import select
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import orjson
import pytest

from tests.proxy.conftest import write_org_config
from tests.support.servers import ProcessServer, free_port, undolog_command, wait_until

pytestmark = pytest.mark.security

ADMIN_KEY = "ul_test_admin_" + secrets.token_hex(8)
BOUND_SECONDS = 5.0  # the generous bound on an answer during the flood (the issue: none came)


@contextlib.contextmanager
def _serve(tmp_path: Path, **env: str) -> Iterator[ProcessServer]:
    port = free_port()
    config = write_org_config(tmp_path / "undolog.toml", "acme", ADMIN_KEY)
    settings = {
        "UNDOLOG_DATABASE_URL": f"sqlite:///{tmp_path / 'undolog.db'}",
        "UNDOLOG_CONFIG": str(config),
        "UNDOLOG_PORT": str(port),
        "UNDOLOG_LOG_LEVEL": "warning",
        "UNDOLOG_SPOOL_DIR": str(tmp_path / "spool"),
        **{f"UNDOLOG_{key.upper()}": value for key, value in env.items()},
    }
    log = str(tmp_path / "serve.log")
    server = ProcessServer(undolog_command("serve"), settings, port, log_path=log).start()
    try:
        yield server
    finally:
        server.stop()


def _connect(port: int, source: str = "127.0.0.1") -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=5, source_address=(source, 0))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def _head(path: str, length: int, **headers: str) -> bytes:
    lines = [f"POST {path} HTTP/1.1", "Host: 127.0.0.1", "Content-Type: application/json"]
    lines += [f"Content-Length: {length}"] + [f"{k}: {v}" for k, v in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


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


def _closed_by_peer(sock: socket.socket) -> bool:
    """Whether the server has closed `sock` (EOF or reset); reads and drops what it sent."""
    try:
        while True:
            if not sock.recv(65536, socket.MSG_DONTWAIT):
                return True
    except BlockingIOError:
        return False
    except OSError:
        return True


def _code(answer: bytes) -> str:
    code: str = orjson.loads(answer.partition(b"\r\n\r\n")[2])["code"]
    return code


# -- the key before the body -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("headers", "status", "code"),
    [({"X-Api-Key": "ul_wrong"}, 403, "auth_failed"), ({}, 401, "auth_failed")],
    ids=["bad key", "no key"],
)
def test_a_request_without_a_valid_key_is_answered_before_its_body_and_closed(
    tmp_path: Path, headers: dict[str, str], status: int, code: str
) -> None:
    with _serve(tmp_path) as server:
        sock = _connect(server.port)
        try:
            # A large body is announced and never sent: the answer must not wait for it.
            sock.sendall(_head("/mcp/tool_call", 1_000_000, **headers))
            answer, closed = _read_to_eof(sock, within=BOUND_SECONDS)
        finally:
            sock.close()
    assert answer.startswith(f"HTTP/1.1 {status} ".encode()), answer[:200]
    assert _code(answer) == code
    assert closed  # and the connection is not kept for the body


# -- the body deadline -----------------------------------------------------------------------


def test_a_body_trickled_below_the_minimum_rate_is_cut_with_408(tmp_path: Path) -> None:
    with _serve(tmp_path, body_timeout_seconds="1", min_body_bytes_per_second="100") as server:
        sock = _connect(server.port)
        try:
            sock.sendall(_head("/tools/x", 1000, **{"X-Api-Key": ADMIN_KEY}) + b"{")
            started = time.monotonic()

            def trickled_and_closed() -> bool:
                with contextlib.suppress(OSError):
                    sock.sendall(b" ")  # a byte per poll (~50/s): under 100 bytes/s
                readable, _, _ = select.select([sock], [], [], 0)
                return bool(readable)

            wait_until(trickled_and_closed, timeout=15, what="the slow body to be answered")
            cut_after = time.monotonic() - started
            answer, closed = _read_to_eof(sock, within=BOUND_SECONDS)
        finally:
            sock.close()
    assert answer.startswith(b"HTTP/1.1 408 "), answer[:200]
    assert _code(answer) == "request_timeout"
    assert closed
    # 1 s plus what ~50 bytes earn at 100 bytes/s: cut near 2 s, long before the 1000 bytes.
    assert cut_after < 10, cut_after


# -- the per-address cap ---------------------------------------------------------------------


def test_an_address_holds_at_most_its_cap_of_keyless_connections_oldest_shed_first(
    tmp_path: Path,
) -> None:
    cap, opened = 8, 20
    with _serve(tmp_path, max_connections_per_client=str(cap)) as server:
        held = []
        try:
            for _ in range(opened):
                sock = _connect(server.port, "127.0.0.2")
                sock.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Partial: ")
                held.append(sock)
            oldest, newest = held[: opened - cap], held[opened - cap :]
            wait_until(
                lambda: all(_closed_by_peer(sock) for sock in oldest),
                what="the oldest connections of 127.0.0.2 to be shed",
            )
            for sock in newest:  # the newest are still being served
                sock.sendall(b"1\r\n\r\n")
                assert sock.recv(65536).startswith(b"HTTP/1.1 200 ")
            # Another address is not affected by 127.0.0.2's cap.
            assert httpx.get(server.url + "/health", timeout=BOUND_SECONDS).status_code == 200
        finally:
            for sock in held:
                sock.close()


# -- the flood -------------------------------------------------------------------------------

FLOOD_ADDRESSES = [f"127.0.0.{n}" for n in range(2, 10)]
PER_ADDRESS = 24  # 8 x 24 = 192 connections kept open, against --max-connections 64
KINDS = (
    _head("/mcp/tool_call", 1000) + b"{",  # no key, then a body byte now and then
    _head("/ui/login", 1000, **{"X-Requested-With": "undolog-ui"}) + b"{",  # a public route
    b"POST /mcp/tool_call HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ",  # a head never finished
)


class _Flood(threading.Thread):
    """Keeps PER_ADDRESS connections open from each flood address, each sending its opening
    and then one byte a second; a connection the server closes is opened again at once."""

    def __init__(self, port: int, addresses: list[str]) -> None:
        super().__init__(daemon=True)
        self.port = port
        self.slots = [(a, KINDS[n % len(KINDS)]) for a in addresses for n in range(PER_ADDRESS)]
        self.socks: list[socket.socket | None] = [None] * len(self.slots)
        self.stop = threading.Event()
        self.opened = 0
        self.cut = 0  # closed by the server

    def run(self) -> None:
        next_byte = time.monotonic() + 1.0
        try:
            while not self.stop.is_set():
                for i, (address, opening) in enumerate(self.slots):
                    if self.socks[i] is None:
                        with contextlib.suppress(OSError):
                            sock = _connect(self.port, address)
                            self.socks[i] = sock
                            self.opened += 1
                            sock.sendall(opening)
                poll = select.poll()
                by_fd = {}
                for i, sock in enumerate(self.socks):
                    if sock is not None:
                        poll.register(sock, select.POLLIN)
                        by_fd[sock.fileno()] = i
                for fd, _ in poll.poll(200):
                    i = by_fd[fd]
                    sock = self.socks[i]
                    if sock is not None and _closed_by_peer(sock):
                        sock.close()
                        self.socks[i] = None
                        self.cut += 1
                if time.monotonic() >= next_byte:
                    next_byte += 1.0
                    for sock in self.socks:
                        if sock is not None:
                            with contextlib.suppress(OSError):
                                sock.sendall(b" ")
        finally:
            for sock in self.socks:
                if sock is not None:
                    sock.close()


def test_health_and_an_admin_key_are_answered_through_a_slow_keyless_flood(
    tmp_path: Path,
) -> None:
    # From other addresses than the admin's: from its own, a flood that reconnects thousands
    # of times a second can still shed the admin's connection before its request is read
    # (about 1 request in 100 here; docs/deploy.md).
    addresses = FLOOD_ADDRESSES
    limits = {"max_connections": "64", "max_connections_per_client": "16"}
    with _serve(tmp_path, **limits) as server:
        flood = _Flood(server.port, addresses)
        flood.start()
        latencies: dict[str, list[float]] = {"health": [], "admin": [], "admin kept alive": []}
        statuses: list[int] = []
        try:
            # The server has had to shed: the flood holds more than it allows.
            wait_until(lambda: flood.cut >= 64, timeout=30, what="the flood to fill the server")
            kept = httpx.Client(base_url=server.url, headers={"X-Api-Key": ADMIN_KEY})
            end = time.monotonic() + 5.0
            with kept:
                while time.monotonic() < end:
                    for name in latencies:
                        started = time.monotonic()
                        if name == "health":
                            r = httpx.get(server.url + "/health", timeout=BOUND_SECONDS * 2)
                        elif name == "admin":
                            r = httpx.get(
                                server.url + "/tools",
                                headers={"X-Api-Key": ADMIN_KEY},
                                timeout=BOUND_SECONDS * 2,
                            )
                        else:
                            r = kept.get("/tools", timeout=BOUND_SECONDS * 2)
                        latencies[name].append(time.monotonic() - started)
                        statuses.append(r.status_code)
        finally:
            flood.stop.set()
            flood.join(timeout=30)
    worst = {name: max(values) for name, values in latencies.items()}
    print(  # the figures for the report (pytest -s)
        f"\nflood: {len(flood.slots)} connections kept open from {len(set(addresses))} "
        f"addresses, {flood.opened} opened, {flood.cut} shed by the server; answered "
        f"{statuses.count(200)}/{len(statuses)}; worst "
        + ", ".join(f"{name} {value * 1000:.0f} ms" for name, value in worst.items())
    )
    assert statuses and set(statuses) == {200}, statuses
    assert max(worst.values()) < BOUND_SECONDS, worst
