"""Rows for the retention tests, written as the engine would leave them, at chosen times.

`seed` writes one session with its rows through the store; `bulk_seed` writes many finished
sessions fast, straight into the database (one `executemany` per table), for the tests that
need a large log.
"""

from __future__ import annotations

import sqlite3
import uuid
from dataclasses import dataclass, field, replace

import asyncpg

from tests.store.contract_helpers import NOW, make_approval, make_effect, make_undo
from undolog.store import Store

__all__ = ["Seeded", "add_org", "bulk_seed", "seed", "still_there"]


@dataclass
class Seeded:
    session_id: str
    effect_ids: list[str] = field(default_factory=list)
    entry_ids: list[str] = field(default_factory=list)
    approval_ids: list[str] = field(default_factory=list)


async def seed(
    store: Store,
    org_id: str,
    *,
    state: str = "completed",
    at: int = NOW,
    effects: tuple[str, ...] = ("committed",),
    undo: tuple[str, ...] = (),
    approval: str | None = None,
    effect_updated: int | None = None,
    session_id: str | None = None,
) -> Seeded:
    """A session in `state` last updated `at`, with an effect per state in `effects` (the
    first ones with an undo entry per state in `undo`), an approval on the first effect
    (if `approval`), and one event per effect. `session_id`: a chosen id (clients choose
    them, so two orgs may use the same one)."""
    session_id = session_id or str(uuid.uuid4())
    seeded = Seeded(session_id)
    async with store.transaction() as q:
        await q.touch_session(org_id, session_id, 1, at)
        for step, effect_state in enumerate(effects, start=1):
            effect = make_effect(
                org_id,
                session_id=session_id,
                step_index=step,
                state=effect_state,
                created_us=at,
                updated_us=effect_updated or at,
            )
            assert await q.insert_effect(effect)
            seeded.effect_ids.append(effect.effect_id)
            await q.insert_event(
                org_id, "effect_intercepted", session_id, effect.effect_id, "{}", at
            )
            if step <= len(undo):
                entry = replace(make_undo(effect), state=undo[step - 1], updated_us=at)
                await q.insert_undo_entry(entry)
                seeded.entry_ids.append(entry.entry_id)
            if step == 1 and approval is not None:
                record = make_approval(effect, created_us=at, status=approval)
                await q.insert_approval(record)
                seeded.approval_ids.append(record.approval_id)
        await q.update_session(org_id, session_id, at, state=state)
    return seeded


async def still_there(store: Store, org_id: str, seeded: Seeded) -> bool:
    """Whether the session and every row seeded with it are still stored."""
    async with store.reader() as q:
        session = await q.get_session(org_id, seeded.session_id)
        effects = [await q.get_effect(org_id, e) for e in seeded.effect_ids]
        entries = [await q.get_undo_entry(org_id, e) for e in seeded.entry_ids]
        approvals = [await q.get_approval(org_id, a) for a in seeded.approval_ids]
        events = await q.list_events(org_id, session_id=seeded.session_id)
    rows = [session, *effects, *entries, *approvals]
    present = [row is not None for row in rows] + [len(events) == len(seeded.effect_ids)]
    assert all(present) or not any(present), f"partly pruned: {present}"
    return all(present)


async def add_org(store: Store, org_id: str, retention_days: int | None) -> None:
    async with store.transaction() as q:
        await q.upsert_org(org_id, org_id, 3600, False, NOW, retention_days)


async def bulk_seed(url: str, org_id: str, sessions: int, effects: int, at: int = NOW) -> int:
    """`sessions` completed sessions of `org_id`, each with `effects` committed effects and
    one event per effect, all last updated `at`, written in one transaction. Returns the
    number of rows written."""
    session_rows, effect_rows, event_rows = [], [], []
    for _ in range(sessions):
        session_id = str(uuid.uuid4())
        session_rows.append((org_id, session_id, "completed", effects, at, at))
        for step in range(1, effects + 1):
            effect_id = str(uuid.uuid4())
            signature = uuid.uuid4().hex + uuid.uuid4().hex
            effect_rows.append(
                (effect_id, org_id, session_id, step, "echo", "compensable", signature, "{}",
                 "committed", "proxy", 1, '{"success":true}', at, at)
            )  # fmt: skip
            event_rows.append((org_id, "effect_committed", session_id, effect_id, "{}", at))
    statements = (
        ("INSERT INTO sessions (org_id, session_id, state, last_step, created_us, updated_us) "
         "VALUES ($1, $2, $3, $4, $5, $6)", session_rows),
        ("INSERT INTO effects (effect_id, org_id, session_id, step_index, tool_name, tier, "
         "call_signature, args, state, mode, attempts, result, created_us, updated_us) "
         "VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14)", effect_rows),
        ("INSERT INTO events (org_id, type, session_id, effect_id, payload, created_us) "
         "VALUES ($1, $2, $3, $4, $5, $6)", event_rows),
    )  # fmt: skip
    if url.startswith("sqlite"):
        with sqlite3.connect(url.removeprefix("sqlite:///"), timeout=30) as conn:
            for sql, rows in statements:
                conn.executemany(_qmarks(sql), rows)
    else:
        conn = await asyncpg.connect(url)
        try:
            async with conn.transaction():
                for sql, rows in statements:
                    await conn.executemany(sql, rows)
        finally:
            await conn.close()
    return len(session_rows) + len(effect_rows) + len(event_rows)


def _qmarks(sql: str) -> str:
    """`$1, $2` → `?, ?` (SQLite)."""
    for n in range(20, 0, -1):
        sql = sql.replace(f"${n}", "?")
    return sql
