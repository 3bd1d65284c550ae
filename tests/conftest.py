"""Fixtures shared by the whole suite: the two stores, a PostgreSQL database per run, orgs.

PostgreSQL comes from `UNDOLOG_TEST_POSTGRES_URL` (default: the CI machine's
postgresql://postgres@127.0.0.1:5432/test). Each test run creates its own database there and
drops it at the end; tests isolate from each other by using fresh org ids, since every row
is org-scoped. Without a reachable PostgreSQL the Postgres tests skip with a clear message,
except under CI (`CI` set), where they fail: CI must run them.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import uuid
from collections.abc import AsyncIterator, Iterator

import asyncpg
import pytest

from undolog.store import Store, open_store

# The fault suite's per-case report, also under pytest-xdist (whose controller loads only this
# conftest, not tests/faults/conftest.py).
pytest_plugins = ["tests.faults.report"]

DEFAULT_PG_ADMIN_URL = "postgresql://postgres@127.0.0.1:5432/test"


def _pg_admin_url() -> str:
    return os.environ.get("UNDOLOG_TEST_POSTGRES_URL", DEFAULT_PG_ADMIN_URL)


async def _create_database(admin_url: str, name: str) -> None:
    conn = await asyncpg.connect(admin_url, timeout=5)
    try:
        await conn.execute(f'CREATE DATABASE "{name}"')
    finally:
        await conn.close()


async def _drop_database(admin_url: str, name: str) -> None:
    conn = await asyncpg.connect(admin_url, timeout=5)
    try:
        await conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        await conn.close()


@contextlib.contextmanager
def fresh_pg_database(label: str = "test") -> Iterator[str]:
    """A new, migrated PostgreSQL database, dropped on exit (skips, or fails under CI, when
    PostgreSQL is not reachable)."""
    admin = _pg_admin_url()
    name = f"undolog_{label}_{os.getpid()}_{uuid.uuid4().hex[:8]}"
    try:
        asyncio.run(_create_database(admin, name))
    except (TimeoutError, OSError, asyncpg.PostgresError) as exc:
        message = f"PostgreSQL not reachable at {admin}: {exc}"
        if os.environ.get("CI"):
            pytest.fail(message + " (CI must run the Postgres tests)")
        pytest.skip(message)
    url = admin.rsplit("/", 1)[0] + "/" + name

    async def migrate() -> None:
        store = await open_store(url)
        try:
            await store.migrate()
        finally:
            await store.close()

    try:
        asyncio.run(migrate())
        yield url
    finally:
        asyncio.run(_drop_database(admin, name))


@pytest.fixture(scope="session")
def pg_url() -> Iterator[str]:
    """A fresh, migrated PostgreSQL database for this test run.

    Shared by the run's tests, which keep apart by org. A proxy's sweepers (approvals, leases)
    work across orgs, though, so a proxy that outlives its test must not use this database:
    it would sweep later tests' approvals and run them on its own upstream. Such proxies get a
    database of their own (`fresh_pg_database`; the fault suite's long-lived cluster does).
    """
    with fresh_pg_database() as url:
        yield url


@pytest.fixture(params=["sqlite", "postgres"])
def store_url(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> str:
    """The URL of each store in turn (SQLite: a file of its own per test)."""
    if request.param == "postgres":
        return str(request.getfixturevalue("pg_url"))
    path = tmp_path_factory.mktemp("sqlite") / "undolog.db"
    return f"sqlite:///{path}"


@pytest.fixture
async def store(store_url: str) -> AsyncIterator[Store]:
    opened = await open_store(store_url)
    await opened.migrate()
    try:
        yield opened
    finally:
        await opened.close()


@pytest.fixture
def org_id() -> str:
    return f"org-{uuid.uuid4().hex[:12]}"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--faults-seeds",
        type=int,
        default=None,
        help="how many trials of each case tests/faults runs, one seed each (default: 1, for CI)",
    )
    parser.addoption(
        "--faults-report",
        default=None,
        help="write the fault suite's counts per case and store to this file, as JSON",
    )
