"""The store's MCP task rows (migration 19): written once, read within their org only, and
deleted a bounded batch at a time once expired — on both stores."""

from __future__ import annotations

import uuid
from dataclasses import replace

from tests.store.contract_helpers import NOW, new_org
from undolog.store import Store
from undolog.store.records import McpTaskRecord

TASK = McpTaskRecord(
    task_id="",
    org_id="",
    owner_key_id="key-1",
    session_id=None,
    effect_id=None,
    approval_id=None,
    tool_name="time.get_current_time",
    result_json='{"content": []}',
    created_us=NOW,
    ttl_ms=60_000,
    expires_us=NOW + 60_000_000,
)


def _task(org_id: str, **changes: object) -> McpTaskRecord:
    return replace(TASK, task_id=str(uuid.uuid4()), org_id=org_id, **changes)  # type: ignore[arg-type]


async def test_a_task_is_read_back_within_its_org_only(store: Store) -> None:
    org_id, other = new_org(), new_org()
    task = _task(org_id, session_id="s", effect_id="e", approval_id="a", result_json=None)
    async with store.transaction() as q:
        await q.insert_mcp_task(task)
    async with store.reader() as q:
        assert await q.get_mcp_task(org_id, task.task_id) == task
        assert await q.get_mcp_task(other, task.task_id) is None
        assert await q.get_mcp_task(org_id, str(uuid.uuid4())) is None


async def test_expired_tasks_are_deleted_in_bounded_batches(store: Store) -> None:
    org_id, other = new_org(), new_org()
    expired = [_task(org_id, expires_us=NOW + i) for i in range(3)]
    alive = _task(org_id, expires_us=NOW + 10_000)
    elsewhere = _task(other, expires_us=NOW)
    async with store.transaction() as q:
        for task in (*expired, alive, elsewhere):
            await q.insert_mcp_task(task)
    async with store.transaction() as q:
        assert await q.delete_expired_mcp_tasks(org_id, NOW + 100, 2) == 2
    async with store.transaction() as q:
        assert await q.delete_expired_mcp_tasks(org_id, NOW + 100, 2) == 1
    async with store.reader() as q:
        assert await q.get_mcp_task(org_id, alive.task_id) == alive
        assert await q.get_mcp_task(other, elsewhere.task_id) == elsewhere


async def test_the_sweep_deletes_every_orgs_expired_tasks_in_bounded_batches(store: Store) -> None:
    orgs = [new_org() for _ in range(2)]
    expired = [_task(org, expires_us=NOW + i) for org in orgs for i in range(2)]
    alive = [_task(org, expires_us=NOW + 10_000) for org in orgs]
    async with store.transaction() as q:
        for task in (*expired, *alive):
            await q.insert_mcp_task(task)
    async with store.transaction() as q:
        assert await q.delete_expired_mcp_tasks(None, NOW + 100, 1) == 1  # bounded
    async with store.transaction() as q:
        await q.delete_expired_mcp_tasks(None, NOW + 100, 1_000)
    async with store.reader() as q:
        for task in expired:
            assert await q.get_mcp_task(task.org_id, task.task_id) is None
        for task in alive:
            assert await q.get_mcp_task(task.org_id, task.task_id) == task
