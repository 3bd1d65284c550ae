"""Migration 24 on both stores: the events a database already holds are numbered per org in
event order, and new events go on from there (docs/audit.md)."""

from __future__ import annotations

import pytest

from tests.store.test_migration_upstream import _migrate_to, _sql, fresh_url
from undolog.store import open_store

__all__ = ["fresh_url"]

T = 1_700_000_000_000_000


def _event(org: str, n: int) -> str:
    return (
        "INSERT INTO events (org_id, type, session_id, effect_id, payload, created_us) VALUES "
        f"('{org}', 'effect_committed', NULL, NULL, '{{\"n\": {n}}}', {T + n})"
    )


async def test_existing_events_are_numbered_per_org_and_new_ones_follow(
    fresh_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    await _migrate_to(fresh_url, 23, monkeypatch)
    for n, org in enumerate(["acme", "globex", "acme", "acme", "globex"]):
        await _sql(fresh_url, _event(org, n))
    store = await open_store(fresh_url)
    try:
        await store.migrate()
        async with store.transaction() as q:
            await q.insert_event("acme", "effect_failed", None, None, "{}", T + 9)
        async with store.reader() as q:
            acme = await q.list_audit_events("acme", 0, 99, 99)
            globex = await q.list_audit_events("globex", 0, 99, 99)
            assert [(seq, e.payload_json) for seq, e in acme] == [
                (1, '{"n": 0}'), (2, '{"n": 2}'), (3, '{"n": 3}'), (4, "{}"),
            ]  # fmt: skip
            assert [seq for seq, _ in globex] == [1, 2]
            assert (await q.last_audit_seq("acme"), await q.last_audit_seq("globex")) == (4, 2)
    finally:
        await store.close()
