"""`undolog serve --workers N`: N processes on one port, started, kept and stopped by one.

Each test runs `python -m undolog serve --workers N` as a real process tree on PostgreSQL.
Workers are told apart by the test-only `X-UndoLog-Worker: <index>/<pid>` header
(`UNDOLOG_TEST_WORKER_HEADER=1`); each probe is a new connection, which the kernel hands to
whichever worker accepts it first, so a test polls (with a deadline) until it has seen the
workers it needs.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.conftest import fresh_pg_database
from tests.proxy.conftest import write_org_config
from tests.support.forwarder import forwarding
from tests.support.servers import ProcessServer, free_port, undolog_command, wait_until
from undolog.config import Settings
from undolog.store import open_store
from undolog.store.postgres import PostgresStore
from undolog.supervisor import (
    MAX_WORKERS,
    SQLITE_ONE_PROCESS,
    WORKER_HEADER_ENV,
    _worker_settings,
    worker_count,
)

DEADLINE = 90.0  # a worker's start imports the whole server: 10-20 s on a loaded 2-core box


@pytest.fixture(scope="module")
def database() -> Iterator[str]:
    """A database of this module's own: the workers' sweepers never touch other tests' rows."""
    with fresh_pg_database("workers") as url:
        yield url


def serve_workers(
    tmp_path: Path, database_url: str, *args: str, new_session: bool = False, **env: str
) -> tuple[ProcessServer, str]:
    """`undolog serve ARGS` with the worker header on; returns the server and its admin key."""
    org_id, key = f"org-{uuid.uuid4().hex[:12]}", f"ul_test_{uuid.uuid4().hex}"
    config = write_org_config(tmp_path / "undolog.toml", org_id, key)
    port = free_port()
    server = ProcessServer(
        undolog_command("serve", *args),
        env={
            "UNDOLOG_DATABASE_URL": database_url,
            "UNDOLOG_CONFIG": str(config),
            "UNDOLOG_PORT": str(port),
            "UNDOLOG_LOG_LEVEL": "info",
            "UNDOLOG_SPOOL_DIR": str(tmp_path / "spool"),
            WORKER_HEADER_ENV: "1",
            **env,
        },
        port=port,
        log_path=str(tmp_path / "serve.log"),
        new_session=new_session,
    )
    return server.start(timeout=DEADLINE), key


def worker_of(url: str, key: str | None = None) -> tuple[int, int]:
    """(index, pid) of the worker that answers a request on a new connection."""
    headers = {"X-Api-Key": key} if key else {}
    response = httpx.get(url + ("/tools" if key else "/health"), headers=headers, timeout=10)
    assert response.status_code == 200, response.text
    index, pid = response.headers["x-undolog-worker"].split("/")
    return int(index), int(pid)


def see_workers(url: str, count: int, key: str | None = None) -> dict[int, int]:
    """Probe until every index below `count` has answered; index → pid."""
    seen: dict[int, int] = {}

    def all_seen() -> bool:
        index, pid = worker_of(url, key)
        seen[index] = pid
        return len(seen) == count

    wait_until(all_seen, timeout=DEADLINE, what=f"all {count} workers to answer")
    return seen


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def log_lines(tmp_path: Path) -> str:
    return (tmp_path / "serve.log").read_text(encoding="utf-8", errors="replace")


# --- how many ---------------------------------------------------------------------------------


def test_the_default_is_one_worker_per_core_on_postgresql_and_one_on_sqlite() -> None:
    assert worker_count(Settings(database_url="postgresql://h/db"), cores=4) == 4
    assert worker_count(Settings(database_url="sqlite:///x.db"), cores=4) == 1
    assert worker_count(Settings(database_url="postgresql://h/db", workers=3), cores=1) == 3
    assert worker_count(Settings(database_url="postgresql://h/db"), cores=500) == MAX_WORKERS


def test_each_worker_gets_its_own_metrics_port_above_the_first() -> None:
    settings = Settings(database_url="postgresql://h/db", metrics_port=9100)
    ports = [_worker_settings(settings, i).metrics_port for i in range(3)]
    assert ports == [9100, 9101, 9102]
    assert _worker_settings(Settings(), 2).metrics_port is None


@pytest.mark.postgres
async def test_the_pool_size_bounds_a_processs_postgresql_connections(database: str) -> None:
    store = await open_store(database, pool_size=3)
    try:
        assert isinstance(store, PostgresStore)
        assert store._pool.get_max_size() == 3
        assert store._pool.get_min_size() == 2
    finally:
        await store.close()


@pytest.mark.parametrize(
    ("args", "env", "says"),
    [
        (["--workers", "2"], {}, SQLITE_ONE_PROCESS),
        ([], {"UNDOLOG_WORKERS": "3"}, SQLITE_ONE_PROCESS),
        (["--workers", "0"], {}, "setting 'workers' must be between 1 and"),
        (["--workers", str(MAX_WORKERS + 1)], {}, "setting 'workers' must be between 1 and"),
    ],
    ids=["sqlite-flag", "sqlite-env", "zero", "too-many"],
)
def test_workers_that_cannot_be_are_refused_before_anything_starts(
    tmp_path: Path, args: list[str], env: dict[str, str], says: str
) -> None:
    database = tmp_path / "undolog.db"
    done = subprocess.run(
        undolog_command("serve", "--database-url", f"sqlite:///{database}", *args),
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=DEADLINE,
    )
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip() == f"error: {says}" or says in done.stderr, done.stderr
    assert not database.exists()  # refused before the store was touched


# --- one port, many processes -----------------------------------------------------------------


@pytest.mark.postgres
@pytest.mark.slow
@pytest.mark.parametrize("stop", ["sigterm", "ctrl-c"])
def test_three_workers_share_one_port_a_killed_one_is_replaced_and_a_stop_stops_all(
    tmp_path: Path, database: str, stop: str
) -> None:
    # Ctrl-C in a shell sends SIGINT to the whole foreground process group: the supervisor
    # and every worker at once (then the supervisor's SIGTERM too).
    ctrl_c = stop == "ctrl-c"
    server, key = serve_workers(tmp_path, database, "--workers", "3", new_session=ctrl_c)
    try:
        pids = see_workers(server.url, 3, key)  # the config's key works on every worker
        assert len(set(pids.values())) == 3
        assert server.proc is not None
        assert server.proc.pid not in pids.values()

        os.kill(pids[1], signal.SIGKILL)
        wait_until(lambda: gone(pids[1]), timeout=DEADLINE, what="the killed worker to be reaped")
        worker_of(server.url)  # the port keeps answering; then a new worker 1 serves
        replaced = see_workers(server.url, 3)
        assert replaced[1] != pids[1]
        assert (replaced[0], replaced[2]) == (pids[0], pids[2])
        assert '"event": "worker_died"' in log_lines(tmp_path)

        if ctrl_c:
            os.killpg(server.proc.pid, signal.SIGINT)
        else:
            server.proc.send_signal(signal.SIGTERM)
        assert server.proc.wait(timeout=DEADLINE) == 0
        for pid in replaced.values():
            wait_until(lambda pid=pid: gone(pid), timeout=DEADLINE, what=f"worker {pid} to exit")
    finally:
        server.stop()
    # Migrations, keys and tools were prepared once, by the supervisor.
    log = log_lines(tmp_path)
    assert log.count('"event": "serving"') == 1
    assert log.count('"event": "worker_serving"') == 4


@pytest.mark.postgres
@pytest.mark.slow
def test_the_demo_keys_are_made_once_and_a_dashboard_sign_in_holds_on_every_worker(
    tmp_path: Path, database: str
) -> None:
    demo_port = free_port()
    server, _ = serve_workers(
        tmp_path, database, "--workers", "2", "--demo", "--demo-tools-port", str(demo_port)
    )
    try:
        printed = log_lines(tmp_path)
        assert printed.count("UndoLog demo") == 1
        agent = re.search(r"agent key:\s+(\S+)", printed)
        approver = re.search(r"approver key:\s+(\S+)", printed)
        assert agent and approver
        workers = see_workers(server.url, 2, agent.group(1))  # the printed key, everywhere

        with httpx.Client(base_url=server.url, headers={"Origin": server.url}) as c:
            signed_in = c.post("/ui/login", json={"api_key": approver.group(1)})
            assert signed_in.status_code == 200, signed_in.text
            cookies = dict(signed_in.cookies)
        answered: set[int] = set()

        def cookie_holds_everywhere() -> bool:
            with httpx.Client(base_url=server.url, cookies=cookies) as fresh:
                response = fresh.get("/approvals")
            assert response.status_code == 200, response.text
            answered.add(int(response.headers["x-undolog-worker"].split("/")[0]))
            return answered == {0, 1}

        wait_until(cookie_holds_everywhere, timeout=DEADLINE, what="both workers to answer")

        assert server.proc is not None
        server.proc.kill()  # the supervisor dies without a word: its workers stop by themselves
        server.proc.wait(timeout=DEADLINE)
        for pid in workers.values():
            wait_until(lambda pid=pid: gone(pid), timeout=DEADLINE, what=f"orphan {pid} to exit")
    finally:
        server.stop()


@pytest.mark.postgres
@pytest.mark.slow
def test_a_worker_that_cannot_start_again_stops_the_supervisor_with_exit_1(
    tmp_path: Path, database: str
) -> None:
    host, _, rest = database.removeprefix("postgresql://").partition("@")[2].partition(":")
    port, _, name = rest.partition("/")
    with forwarding(host, int(port)) as db:
        via = f"postgresql://postgres@{db.address}/{name}"
        server, _ = serve_workers(tmp_path, via, "--workers", "2")
        try:
            pids = see_workers(server.url, 2)
            db.cut()  # PostgreSQL is gone: a worker started now cannot open its store
            os.kill(pids[0], signal.SIGKILL)
            assert server.proc is not None
            assert server.proc.wait(timeout=DEADLINE) == 1
            wait_until(lambda: gone(pids[1]), timeout=DEADLINE, what="the other worker to stop")
        finally:
            server.stop()
    log = log_lines(tmp_path)
    assert '"event": "worker_failed_to_start"' in log
