"""Migration 6 on both stores: a tool stored with a tenant's URL keeps nothing of it.

The store is migrated to version 4 first (the schema that held `upstream_url`), an old row is
written as an old proxy would have, then the store is migrated to the latest version.
"""

from __future__ import annotations

import sqlite3
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import asyncpg
import pytest

import undolog.store.postgres
import undolog.store.sqlite
from tests.conftest import _create_database, _drop_database, _pg_admin_url
from undolog.store import open_store
from undolog.store.base import load_migrations

OLD_VERSION = 4
EVIL_URL = "http://127.0.0.1:9090/metrics?"


@pytest.fixture(params=["sqlite", "postgres"])
async def fresh_url(
    request: pytest.FixtureRequest, tmp_path: Path, pg_url: str
) -> AsyncIterator[str]:
    """An empty database of each kind (PostgreSQL: one of its own, dropped afterwards)."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'old.db'}"
        return
    admin = _pg_admin_url()
    name = f"undolog_mig_{uuid.uuid4().hex[:12]}"
    await _create_database(admin, name)
    try:
        yield admin.rsplit("/", 1)[0] + "/" + name
    finally:
        await _drop_database(admin, name)


async def _migrate_to(url: str, version: int | None, monkeypatch: pytest.MonkeyPatch) -> None:
    def upto(dialect: str) -> list[tuple[int, str]]:
        return [m for m in load_migrations(dialect) if version is None or m[0] <= version]

    with monkeypatch.context() as patch:
        patch.setattr(undolog.store.sqlite, "load_migrations", upto)
        patch.setattr(undolog.store.postgres, "load_migrations", upto)
        store = await open_store(url)
        try:
            await store.migrate()
        finally:
            await store.close()


async def _sql(url: str, statement: str, *params: Any) -> list[Any]:
    if url.startswith("sqlite"):
        with sqlite3.connect(url.removeprefix("sqlite:///")) as conn:
            rows = conn.execute(statement.replace("$1", "?").replace("$2", "?"), params)
            return list(rows.fetchall())
    conn = await asyncpg.connect(url)
    try:
        return list(await conn.fetch(statement, *params))
    finally:
        await conn.close()


async def test_a_stored_upstream_url_becomes_the_default_upstream(
    fresh_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    await _migrate_to(fresh_url, OLD_VERSION, monkeypatch)
    await _sql(
        fresh_url,
        "INSERT INTO orgs (org_id, name, approval_timeout_s, auto_approve_on_timeout, "
        "created_us) VALUES ($1, $2, 60, false, 1)",
        "acme",
        "Acme",
    )
    await _sql(
        fresh_url,
        "INSERT INTO tools (org_id, name, tier, version, upstream_url, updated_us) "
        "VALUES ($1, 'wipe', 'safe', '1', $2, 1)",
        "acme",
        EVIL_URL,
    )
    await _migrate_to(fresh_url, None, monkeypatch)
    store = await open_store(fresh_url)
    try:
        async with store.reader() as q:
            tool = await q.get_tool("acme", "wipe")
    finally:
        await store.close()
    assert tool is not None
    assert tool.upstream is None  # None: the operator's `default` upstream
    rows = await _sql(fresh_url, "SELECT * FROM tools")
    assert EVIL_URL not in repr(rows)
