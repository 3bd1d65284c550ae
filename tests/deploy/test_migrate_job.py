"""Migrations as their own step: `undolog migrate` (a Kubernetes Job, a compose service) and
`undolog serve --no-migrate` (`UNDOLOG_MIGRATE=false`), which only checks the schema.

A server that does not migrate refuses a schema older than its own, so a pod started before its
Job finished crash-loops until it has; it serves a newer one (a later release's Job ran during a
rolling upgrade: docs/deploy.md, "Upgrades").
"""

from __future__ import annotations

import asyncio
import os
import sqlite3
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import asyncpg
import httpx
import pytest

from tests.conftest import _create_database, _drop_database, _pg_admin_url
from tests.support.servers import ProcessServer, free_port, undolog_command
from undolog.runtime import ensure_schema
from undolog.store import Store, open_store
from undolog.store.base import load_migrations

LATEST = max(version for version, _ in load_migrations("sqlite"))


@pytest.fixture(params=["sqlite", "postgres"])
def blank_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A database no migration has touched, of each store in turn."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'blank.db'}"
        return
    request.getfixturevalue("pg_url")  # skips (or fails under CI) without PostgreSQL
    admin = _pg_admin_url()
    name = f"undolog_blank_{os.getpid()}_{uuid.uuid4().hex[:8]}"
    asyncio.run(_create_database(admin, name))
    try:
        yield admin.rsplit("/", 1)[0] + "/" + name
    finally:
        asyncio.run(_drop_database(admin, name))


async def _record_a_later_release(url: str) -> int:
    """What a later release's `undolog migrate` leaves: one more version in the table."""
    sql = "INSERT INTO undolog_schema_version (version, applied_us) VALUES ($1, 0)"
    if url.startswith("sqlite"):
        with sqlite3.connect(url.removeprefix("sqlite:///")) as db:
            db.execute(sql.replace("$1", "?"), (LATEST + 1,))
    else:
        conn = await asyncpg.connect(url)
        try:
            await conn.execute(sql, LATEST + 1)
        finally:
            await conn.close()
    return LATEST + 1


async def _with_store(url: str, *steps: str) -> list[object]:
    """Open the store at `url` and run each step: `check` (ensure_schema without migrating),
    `migrate`, `ahead` (a later release's migration recorded); what each returned or raised."""
    store: Store = await open_store(url)
    seen: list[object] = []
    try:
        for step in steps:
            try:
                if step == "ahead":
                    seen.append(await _record_a_later_release(url))
                else:
                    seen.append(await ensure_schema(store, migrate=step == "migrate"))
            except ValueError as exc:
                seen.append(str(exc))
    finally:
        await store.close()
    return seen


def test_without_migrating_an_older_schema_is_refused_and_a_newer_one_served(
    blank_url: str,
) -> None:
    refused, migrated, again, checked, ahead, newer, migrate_newer = asyncio.run(
        _with_store(blank_url, "check", "migrate", "migrate", "check", "ahead", "check", "migrate")
    )
    assert isinstance(refused, str)
    assert f"schema is at version 0, this release needs {LATEST}" in refused
    assert "undolog migrate" in refused
    assert migrated == again == checked == LATEST  # migrate is idempotent
    assert newer == migrate_newer == ahead == LATEST + 1  # never downgraded, never refused


def _run(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("UNDOLOG_")}
    return subprocess.run(
        undolog_command(*args), env={**base, **env}, capture_output=True, text=True, timeout=60
    )


def _tables(path: Path) -> list[str]:
    with sqlite3.connect(path) as db:
        return [row[0] for row in db.execute("SELECT name FROM sqlite_master WHERE type='table'")]


def test_serve_no_migrate_waits_for_the_migrate_command(tmp_path: Path) -> None:
    """The order a Job gives: serve refuses (exit non-zero, one line, nothing created), then
    `undolog migrate` runs (exit 0, and 0 again when current), then serve starts and is ready."""
    database = tmp_path / "undolog.db"
    env = {
        "UNDOLOG_DATABASE_URL": f"sqlite:///{database}",
        "UNDOLOG_MIGRATE": "false",
        "UNDOLOG_SPOOL_DIR": str(tmp_path / "spool"),
    }
    port = free_port()
    refused = _run("serve", "--port", str(port), env=env)
    assert refused.returncode != 0
    assert "undolog migrate" in refused.stderr
    assert "Traceback" not in refused.stderr
    assert not database.exists() or _tables(database) == []

    first = _run("migrate", env=env)
    second = _run("migrate", env=env)
    assert (first.returncode, second.returncode) == (0, 0), first.stderr + second.stderr
    assert first.stdout == second.stdout == f"schema at version {LATEST} (sqlite)\n"

    server = ProcessServer(undolog_command("serve", "--port", str(port)), env, port).start()
    try:
        assert httpx.get(f"{server.url}/ready", timeout=10).status_code == 200
    finally:
        server.stop()
