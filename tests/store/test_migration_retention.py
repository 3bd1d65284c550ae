"""Migration 12 on both stores: a database with data from version 10 keeps every row, each
org keeps everything (no `retention_days`) until its config says otherwise, and the rows
are then pruned like new ones. Migration 11 is not assumed: whatever lies between 10 and
the latest version is applied as `undolog migrate` would.
"""

from __future__ import annotations

import pytest

from tests.store.test_migration_upstream import _migrate_to, _sql, fresh_url
from undolog.engine.retention import DAY_US, PruneCounts, Retention
from undolog.store import open_store

__all__ = ["fresh_url"]  # the fixture, shared with the upstream-URL migration's test

OLD_VERSION = 10
T = 1_700_000_000_000_000  # when the old rows were written

OLD_ROWS = (
    "INSERT INTO orgs (org_id, name, approval_timeout_s, auto_approve_on_timeout, created_us) "
    f"VALUES ('acme', 'Acme', 60, false, {T})",
    "INSERT INTO sessions (org_id, session_id, state, last_step, created_us, updated_us, "
    f"owner_key_id) VALUES ('acme', 's-done', 'completed', 1, {T}, {T}, 'key_1')",
    "INSERT INTO sessions (org_id, session_id, state, last_step, created_us, updated_us) "
    f"VALUES ('acme', 's-open', 'active', 1, {T}, {T})",
    "INSERT INTO effects (effect_id, org_id, session_id, step_index, tool_name, tool_version, "
    "tier, call_signature, args, state, mode, attempts, result, created_us, updated_us) VALUES "
    "('e-done', 'acme', 's-done', 1, 'send_email', '1', 'compensable', 'sig-1', '{}', "
    f"'committed', 'proxy', 1, '{{\"ok\":true}}', {T}, {T})",
    "INSERT INTO effects (effect_id, org_id, session_id, step_index, tool_name, tool_version, "
    "tier, call_signature, args, state, mode, attempts, created_us, updated_us) VALUES "
    "('e-open', 'acme', 's-open', 1, 'delete_database', '1', 'irreversible', 'sig-2', '{}', "
    f"'awaiting_approval', 'proxy', 1, {T}, {T})",
    "INSERT INTO undo_entries (entry_id, org_id, session_id, effect_id, fn_name, fn_version, "
    "args, max_retries, retry_backoff_ms, registered_us, state, attempts, updated_us) VALUES "
    f"('u-done', 'acme', 's-done', 'e-done', 'undo_send_email', '1', '{{}}', 3, 100, {T}, "
    f"'pending', 0, {T})",
    "INSERT INTO approvals (approval_id, org_id, effect_id, session_id, tool_name, args, "
    "status, created_us, timeout_us) VALUES ('a-open', 'acme', 'e-open', 's-open', "
    f"'delete_database', '{{}}', 'pending', {T}, {T + 60_000_000})",
    "INSERT INTO events (org_id, type, session_id, effect_id, payload, created_us) VALUES "
    f"('acme', 'effect_committed', 's-done', 'e-done', '{{}}', {T})",
    "INSERT INTO events (org_id, type, session_id, effect_id, payload, created_us) VALUES "
    f"('acme', 'approval_required', 's-open', 'e-open', '{{}}', {T})",
)
TABLES = ("orgs", "sessions", "effects", "undo_entries", "approvals", "events")


async def counts(url: str) -> dict[str, int]:
    return {t: int((await _sql(url, f"SELECT COUNT(*) FROM {t}"))[0][0]) for t in TABLES}


async def test_version_10_data_survives_and_is_pruned_once_a_retention_is_set(
    fresh_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    await _migrate_to(fresh_url, OLD_VERSION, monkeypatch)
    for statement in OLD_ROWS:
        await _sql(fresh_url, statement)
    before = await counts(fresh_url)
    assert before == {
        "orgs": 1, "sessions": 2, "effects": 2, "undo_entries": 1, "approvals": 1, "events": 2,
    }  # fmt: skip

    await _migrate_to(fresh_url, None, monkeypatch)

    assert await counts(fresh_url) == before
    store = await open_store(fresh_url)
    try:
        async with store.reader() as q:
            org = await q.get_org("acme")
            effect = await q.get_effect("acme", "e-done")
        assert org is not None and org.retention_days is None  # keeps everything
        assert effect is not None and effect.result_json == '{"ok":true}'
        later = Retention(store, clock_us=lambda: T + 8 * DAY_US)
        assert await later.prune() == {}

        async with store.transaction() as q:  # the config sets a week (as a start would)
            await q.upsert_org("acme", "Acme", 60, False, T, 7)
        report = await later.prune("acme")
    finally:
        await store.close()
    # The finished session goes with its rows; the open one, its pending approval and its
    # event stay.
    assert report == {
        "acme": PruneCounts(sessions=1, effects=1, undo_entries=1, approvals=0, events=1)
    }
    assert await counts(fresh_url) == {
        "orgs": 1, "sessions": 1, "effects": 1, "undo_entries": 0, "approvals": 1, "events": 1,
    }  # fmt: skip
