"""Shared SQL, part 4: MCP tasks (migration 19, docs/mcp.md "MCP Tasks").

A task is read by its id within an org; who may see it (its owner key) is the caller's rule.
Expired rows go a bounded batch at a time: an org's as it creates a task, every org's in
the retention sweep.
"""

from __future__ import annotations

import abc
from collections.abc import Sequence
from typing import Any

from undolog.store._columns import columns
from undolog.store.records import McpTaskRecord

TASK = columns(McpTaskRecord)


class TaskSql(abc.ABC):
    """Statements on `mcp_tasks`."""

    @abc.abstractmethod
    async def _fetchrow(self, sql: str, *args: Any) -> Sequence[Any] | None: ...

    @abc.abstractmethod
    async def _execute(self, sql: str, *args: Any) -> int: ...

    async def insert_mcp_task(self, task: McpTaskRecord) -> None:
        await self._execute(TASK.insert("mcp_tasks"), *TASK.values(task))

    async def get_mcp_task(self, org_id: str, task_id: str) -> McpTaskRecord | None:
        row = await self._fetchrow(
            f"SELECT {TASK.select()} FROM mcp_tasks WHERE org_id = ? AND task_id = ?",
            org_id,
            task_id,
        )
        return TASK.row(row) if row else None

    async def end_mcp_task(
        self, org_id: str, task_id: str, result_json: str, ended_us: int, answers_effect: bool
    ) -> bool:
        """Keep the answer of a task that has ended; False when it already had one (another
        read, in this process or another, ended it first: that answer stands)."""
        changed = await self._execute(
            "UPDATE mcp_tasks SET result = ?, ended_us = ?, answers_effect = ? "
            "WHERE org_id = ? AND task_id = ? AND result IS NULL",
            result_json,
            ended_us,
            answers_effect,
            org_id,
            task_id,
        )
        return changed > 0

    async def delete_expired_mcp_tasks(self, org_id: str | None, now_us: int, limit: int) -> int:
        """Delete up to `limit` of the org's tasks (None: any org's) whose `expires_us` has
        passed."""
        if org_id is None:  # the retention sweep: no index, but the table holds live tasks only
            return await self._execute(
                "DELETE FROM mcp_tasks WHERE task_id IN (SELECT task_id FROM mcp_tasks "
                "WHERE expires_us <= ? LIMIT ?)",
                now_us,
                limit,
            )
        return await self._execute(
            "DELETE FROM mcp_tasks WHERE task_id IN (SELECT task_id FROM mcp_tasks "
            "WHERE org_id = ? AND expires_us <= ? LIMIT ?)",
            org_id,
            now_us,
            limit,
        )
