"""`undolog serve` warns at start when PostgreSQL runs without autovacuum: the planner then
never gets statistics, and lookups planned while the tables were small stay slow as they grow
(docs/deploy.md, "PostgreSQL sizing"). The server's own setting decides which way the check
goes here; this machine's PostgreSQL runs with autovacuum off."""

from __future__ import annotations

from pathlib import Path

import asyncpg
from structlog.testing import capture_logs

from undolog.runtime import warn_without_autovacuum
from undolog.store import open_store
from undolog.store.postgres import PostgresStore


async def test_the_warning_follows_the_servers_autovacuum_setting(pg_url: str) -> None:
    conn = await asyncpg.connect(pg_url)
    try:
        setting = await conn.fetchval("SHOW autovacuum")
    finally:
        await conn.close()
    store = await open_store(pg_url)
    try:
        assert isinstance(store, PostgresStore)
        assert await store.autovacuum_on() is (setting == "on")
        with capture_logs() as logs:
            warned = await warn_without_autovacuum(store)
    finally:
        await store.close()
    assert warned is (setting == "off")
    events = [entry["event"] for entry in logs]
    assert events == (["postgres_autovacuum_off"] if setting == "off" else [])


async def test_sqlite_has_nothing_to_warn_about(tmp_path: Path) -> None:
    store = await open_store(f"sqlite:///{tmp_path / 'u.db'}")
    try:
        with capture_logs() as logs:
            assert await warn_without_autovacuum(store) is False
    finally:
        await store.close()
    assert logs == []
