"""`GET /ready` fails while the store is unreachable; `/health` (liveness) does not.

PostgreSQL is made unreachable by cutting a TCP forwarder between the proxy and it; SQLite by
another process holding the database's WAL locks (a stuck tool holding the file, say).
"""

from __future__ import annotations

import fcntl
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import httpx
import pytest

from tests.proxy.conftest import make_settings
from tests.support.forwarder import Forwarder, forwarding
from tests.support.servers import ThreadServer, wait_until
from undolog.proxy import create_app

READY_TIMEOUT = "0.5"
# Words of the database's own error texts: none may reach the client.
_DATABASE_WORDS = ("locking protocol", "connection", "asyncpg", "sqlite", "refused", "errno")

# Holds every WAL lock byte of the shared-memory index (offsets 120-127, SQLite's wal.c), so
# that neither readers nor writers of the database can start; prints "locked", then waits for
# its stdin to close.
_HOLD_WAL_LOCKS = f"""
import fcntl, os, sys
fd = os.open(sys.argv[1], os.O_RDWR)
fcntl.lockf(fd, {fcntl.LOCK_EX}, 8, 120, 0)
print("locked", flush=True)
sys.stdin.read()
"""


def _status(url: str, path: str) -> int:
    return httpx.get(url + path, timeout=5).status_code


def _assert_not_ready(url: str) -> None:
    response = httpx.get(url + "/ready", timeout=5)
    assert response.status_code == 503
    body = response.json()
    assert set(body) == {"request_id", "code", "message", "timestamp"}
    assert body["code"] == "store_unavailable"
    assert not any(word in body["message"].lower() for word in _DATABASE_WORDS), body
    assert response.headers["x-request-id"] == body["request_id"]


def _start(database_url: str) -> ThreadServer:
    settings = make_settings(
        database_url, "http://127.0.0.1:9", (), ready_timeout_seconds=float(READY_TIMEOUT)
    )
    return ThreadServer(create_app(settings), settings=settings).start()


@pytest.fixture
def pg_forwarder(pg_url: str) -> Iterator[tuple[Forwarder, str]]:
    """A forwarder to the test database, and the database's URL through it."""
    parts = urlsplit(pg_url)
    with forwarding(parts.hostname or "127.0.0.1", parts.port or 5432) as forwarder:
        netloc = f"{parts.username}@127.0.0.1:{forwarder.port}" if parts.username else None
        yield forwarder, urlunsplit(parts._replace(netloc=netloc or f"127.0.0.1:{forwarder.port}"))


def test_ready_answers_ok_when_the_store_answers(store_url: str) -> None:
    server = _start(store_url)
    try:
        response = httpx.get(server.url + "/ready", timeout=5)
    finally:
        server.stop()
    assert response.status_code == 200
    assert response.json()["status"] == "ok"


def test_ready_fails_and_health_holds_while_postgres_is_cut_off(
    pg_forwarder: tuple[Forwarder, str],
) -> None:
    forwarder, url = pg_forwarder
    server = _start(url)
    try:
        assert _status(server.url, "/ready") == 200
        forwarder.cut()
        _assert_not_ready(server.url)
        assert _status(server.url, "/health") == 200  # liveness: the process still serves
        forwarder.restore()
        wait_until(lambda: _status(server.url, "/ready") == 200, what="ready again")
    finally:
        forwarder.restore()  # so the store can close cleanly
        server.stop()


def test_ready_fails_while_another_process_holds_the_sqlite_database(tmp_path: Path) -> None:
    database = tmp_path / "undolog.db"
    server = _start(f"sqlite:///{database}")
    try:
        assert _status(server.url, "/ready") == 200
        with subprocess.Popen(
            [sys.executable, "-c", _HOLD_WAL_LOCKS, f"{database}-shm"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        ) as locker:
            assert locker.stdin is not None and locker.stdout is not None
            try:
                assert locker.stdout.readline() == "locked\n"
                _assert_not_ready(server.url)
                assert _status(server.url, "/health") == 200
            finally:
                locker.stdin.close()  # the locker exits, its locks go with it
                locker.wait(timeout=10)
        wait_until(lambda: _status(server.url, "/ready") == 200, what="ready again")
    finally:
        server.stop()


def test_ready_needs_no_api_key(store_url: str) -> None:
    server = _start(store_url)
    try:
        response = httpx.get(server.url + "/ready", headers={"X-Api-Key": "wrong"}, timeout=5)
    finally:
        server.stop()
    assert response.status_code == 200
