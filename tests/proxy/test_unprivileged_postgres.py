"""A managed PostgreSQL gives no superuser: UndoLog runs as a role that only owns its database.

The role below is `NOSUPERUSER NOCREATEDB NOCREATEROLE`, as on a managed service; its
database is its own. The proxy migrates the schema as that role (tables, indexes, PL/pgSQL
functions: no extension), then serves calls (the advisory-locked `undolog_execute_new`), an
approval, a rollback and the event broker's LISTEN/NOTIFY (docs/deploy.md).
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator

import asyncpg
import httpx
import pytest

from tests.conftest import _pg_admin_url
from tests.proxy.conftest import make_settings, new_key, role_keys
from tests.support.servers import ThreadServer, serve_in_thread
from tests.support.sse import EventStream
from undolog.config import OrgConfig
from undolog.demo.catalog import DEMO_TOOLS
from undolog.proxy import create_app

pytestmark = pytest.mark.postgres


async def _admin(*statements: str) -> None:
    conn = await asyncpg.connect(_pg_admin_url(), timeout=5)
    try:
        for statement in statements:
            await conn.execute(statement)
    finally:
        await conn.close()


@pytest.fixture
def role_database() -> Iterator[str]:
    """A database owned by a fresh role without any special privilege; its URL as that role."""
    name = f"undolog_role_{uuid.uuid4().hex[:10]}"
    try:
        asyncio.run(
            _admin(
                f'CREATE ROLE "{name}" LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE',
                f'CREATE DATABASE "{name}" OWNER "{name}"',
            )
        )
    except (OSError, asyncpg.PostgresError) as exc:
        pytest.skip(f"cannot create a role and a database on {_pg_admin_url()}: {exc}")
    base = _pg_admin_url().split("://", 1)[1].split("@", 1)[1].rsplit("/", 1)[0]
    try:
        yield f"postgresql://{name}@{base}/{name}"
    finally:
        asyncio.run(_admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)',
                           f'DROP ROLE IF EXISTS "{name}"'))  # fmt: skip


async def test_a_role_that_only_owns_its_database_runs_everything(
    role_database: str, demo_upstream: ThreadServer
) -> None:
    org_id, key = f"org-{uuid.uuid4().hex[:12]}", new_key()
    settings = make_settings(
        role_database, demo_upstream.url, (OrgConfig(org_id=org_id, keys=role_keys(key)),)
    )
    with serve_in_thread(create_app(settings), settings) as server:
        async with httpx.AsyncClient(
            base_url=server.url, headers={"X-Api-Key": key}, timeout=30
        ) as c:
            for name, spec in DEMO_TOOLS.items():
                (await c.put(f"/tools/{name}", json=spec)).raise_for_status()
            session = str(uuid.uuid4())
            async with EventStream(c) as stream:  # LISTEN, as this role
                sent = await c.post("/mcp/tool_call", json={
                    "session_id": session, "tool_name": "send_email", "step_index": 1,
                    "args": {"to": "ada@example.com", "subject": "hi"}})  # fmt: skip
                assert sent.json()["status"] == "executed", sent.text
                asked = await c.post("/mcp/tool_call", json={
                    "session_id": session, "tool_name": "delete_database", "step_index": 2,
                    "args": {"db_name": "x"}})  # fmt: skip
                assert asked.status_code == 202, asked.text
                decided = await c.post(f"/approvals/{asked.json()['approval_id']}/approve")
                assert decided.json()["execution"] == "committed", decided.text
                await stream.until("approval_approved", within=15)
            rolled = await c.post(f"/sessions/{session}/rollback")
            assert rolled.json()["outcome"] == "compensated", rolled.text
    conn = await asyncpg.connect(role_database, timeout=5)
    try:
        privileged = await conn.fetchval("SELECT rolsuper OR rolcreatedb FROM pg_roles "
                                         "WHERE rolname = current_user")  # fmt: skip
        version = await conn.fetchval("SELECT MAX(version) FROM undolog_schema_version")
    finally:
        await conn.close()
    assert privileged is False
    assert version >= 10
