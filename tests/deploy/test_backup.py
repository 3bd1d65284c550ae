"""Backups as docs/deploy.md gives them, run for real: SQLite's online backup
(`sqlite3 DB ".backup FILE"`) of a database a store holds open, and `pg_dump -Fc` /
`pg_restore` of a PostgreSQL one; each copy is served and knows the key made before it."""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import uuid
from pathlib import Path

import httpx
import pytest

from tests.conftest import _create_database, _drop_database, _pg_admin_url
from tests.support.servers import serve_in_thread
from undolog.config import load_settings
from undolog.engine.keys import Keys
from undolog.proxy import create_app
from undolog.store import Store, open_store


def _tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.skip(f"{name} is not installed")
    return path


def _serves_with(url: str, key: str, spool: Path) -> int:
    """Serve the database at `url` without migrating; the status of a keyed read."""
    settings = load_settings({"database_url": url, "spool_dir": str(spool), "migrate": False}, {})
    with serve_in_thread(create_app(settings), settings) as server:
        assert httpx.get(f"{server.url}/ready", timeout=10).status_code == 200
        return httpx.get(
            f"{server.url}/sessions", headers={"X-Api-Key": key}, timeout=10
        ).status_code


async def _open_with_a_key(url: str) -> tuple[Store, str]:
    store = await open_store(url)
    await store.migrate()
    key, _ = await Keys(store).create(f"org-{uuid.uuid4().hex[:8]}", "backup-check", "agent")
    return store, key


def test_sqlite_online_backup_of_a_live_database_restores_and_serves(tmp_path: Path) -> None:
    sqlite3 = _tool("sqlite3")
    live, copy = tmp_path / "undolog.db", tmp_path / "backup" / "undolog.db"
    copy.parent.mkdir()

    async def back_up_while_open() -> str:
        store, key = await _open_with_a_key(f"sqlite:///{live}")
        try:  # the store holds the database open (WAL) while the backup reads it
            command = [sqlite3, str(live), f".backup {copy}"]
            await asyncio.to_thread(subprocess.run, command, check=True, timeout=60)
        finally:
            await store.close()
        return key

    key = asyncio.run(back_up_while_open())
    live.unlink()  # the restore is the copy alone
    assert _serves_with(f"sqlite:///{copy}", key, tmp_path / "spool") == 200


def test_pg_dump_and_pg_restore_restore_a_database_that_serves(pg_url: str, tmp_path: Path) -> None:
    pg_dump, pg_restore = _tool("pg_dump"), _tool("pg_restore")
    admin = _pg_admin_url()
    names = [f"undolog_backup_{os.getpid()}_{uuid.uuid4().hex[:8]}" for _ in range(2)]
    source, target = (admin.rsplit("/", 1)[0] + "/" + name for name in names)
    for name in names:
        asyncio.run(_create_database(admin, name))
    try:

        async def make_key() -> str:
            store, key = await _open_with_a_key(source)
            await store.close()
            return key

        key = asyncio.run(make_key())
        dump = tmp_path / "undolog.dump"
        subprocess.run([pg_dump, "-Fc", "-f", str(dump), source], check=True, timeout=120)
        subprocess.run([pg_restore, "--no-owner", "-d", target, str(dump)], check=True, timeout=120)
        assert _serves_with(target, key, tmp_path / "spool") == 200
    finally:
        for name in names:
            asyncio.run(_drop_database(admin, name))
