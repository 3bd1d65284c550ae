"""PostgreSQL's stored functions are declared once (store/functions/postgres.sql) and applied by
every migrate, after the numbered migrations: a release that changes a function needs no
migration that re-pastes it, and a database at the latest version gets the current bodies."""

from __future__ import annotations

import asyncpg
import pytest

from undolog.store import open_store
from undolog.store.base import load_functions, load_migrations

pytestmark = pytest.mark.postgres

FUNCTIONS = ("undolog_execute_new", "undolog_finish_effect")


async def _bodies(url: str) -> dict[str, list[str]]:
    conn = await asyncpg.connect(url)
    try:
        rows = await conn.fetch(
            "SELECT proname, prosrc FROM pg_proc WHERE proname = ANY($1::text[])", list(FUNCTIONS)
        )
    finally:
        await conn.close()
    found: dict[str, list[str]] = {}
    for row in rows:
        found.setdefault(row["proname"], []).append(row["prosrc"])
    return found


def test_no_migration_defines_a_function_the_functions_file_holds() -> None:
    functions = load_functions("postgres")
    for name in FUNCTIONS:
        assert functions.count(f"FUNCTION {name}(") == 1
        for version, sql in load_migrations("postgres"):
            assert f"CREATE OR REPLACE FUNCTION {name}(" not in sql, version
            assert f"CREATE FUNCTION {name}(" not in sql, version


async def test_migrate_applies_the_current_bodies_once_each(pg_url: str) -> None:
    bodies = await _bodies(pg_url)
    assert sorted(bodies) == sorted(FUNCTIONS)
    assert all(len(found) == 1 for found in bodies.values())  # no overload lingers
    for name, [body] in bodies.items():
        assert body.strip() in load_functions("postgres"), name


async def test_a_function_changed_in_the_database_is_restored_by_migrate(pg_url: str) -> None:
    """What a release with a changed body does to a database already at the latest version:
    `migrate` (no new version) puts the body of this release in place."""
    conn = await asyncpg.connect(pg_url)
    try:
        stale = await conn.fetchval(
            "SELECT pg_get_functiondef(oid) FROM pg_proc WHERE proname = 'undolog_finish_effect'"
        )
        await conn.execute(stale.replace("BEGIN", "BEGIN\n    -- an older release's body", 1))
    finally:
        await conn.close()
    assert "an older release" in (await _bodies(pg_url))["undolog_finish_effect"][0]
    store = await open_store(pg_url)
    try:
        await store.migrate()
    finally:
        await store.close()
    [body] = (await _bodies(pg_url))["undolog_finish_effect"]
    assert "an older release" not in body
    assert body.strip() in load_functions("postgres")
