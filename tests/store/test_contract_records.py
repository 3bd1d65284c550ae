"""The store contract, continued: undo entries, approvals, events, transactions, org
isolation, how failures surface, and leases — on SQLite and on PostgreSQL alike.

Every test here takes the parametrised `store` fixture, so each runs once per dialect. Tests
isolate from each other by fresh org ids (the PostgreSQL database is shared by the run).
"""

from __future__ import annotations

import sqlite3
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from tests.store.contract_helpers import (
    LATEST,
    NOW,
    add_effect,
    add_org,
    make_approval,
    make_effect,
    make_tool,
    make_undo,
    new_org,
    new_session,
)
from undolog.store import (
    Store,
    open_store,
)
from undolog_sdk.errors import Database

# -- undo entries ---------------------------------------------------------------------------


async def test_undo_entries_get_increasing_seq_and_list_newest_first(store: Store) -> None:
    org, session = new_org(), new_session()
    effects = [make_effect(org, session_id=session, step_index=s) for s in (1, 2, 3)]
    seqs = []
    async with store.transaction() as q:
        for effect in effects:
            await q.insert_effect(effect)
            seqs.append(await q.insert_undo_entry(make_undo(effect)))
    assert seqs == sorted(seqs) and len(set(seqs)) == 3
    async with store.reader() as q:
        stack = await q.list_undo_entries(org, session)
        top = await q.get_undo_entry(org, stack[0].entry_id)
    assert [entry.seq for entry in stack] == seqs[::-1]
    assert [entry.effect_id for entry in stack] == [e.effect_id for e in reversed(effects)]
    assert top == stack[0]


async def test_update_undo_entry_with_expect_state_changes_nothing_when_the_state_differs(
    store: Store,
) -> None:
    org = new_org()
    effect = make_effect(org)
    entry = make_undo(effect)
    async with store.transaction() as q:
        await q.insert_effect(effect)
        await q.insert_undo_entry(entry)
        missed = await q.update_undo_entry(
            org, entry.entry_id, expect_state="running", state="compensated"
        )
        hit = await q.update_undo_entry(
            org, entry.entry_id, expect_state="pending", state="running", attempts=1
        )
        stored = await q.get_undo_entry(org, entry.entry_id)
    assert (missed, hit) == (False, True)
    assert stored is not None and (stored.state, stored.attempts) == ("running", 1)


# -- approvals ------------------------------------------------------------------------------


async def test_approvals_are_listed_by_status_newest_first_and_per_session_oldest_first(
    store: Store,
) -> None:
    org, session = new_org(), new_session()
    effects = [make_effect(org, session_id=session, step_index=n) for n in range(4)]
    approvals = [
        make_approval(effects[0], created_us=NOW + 1),
        make_approval(effects[1], created_us=NOW + 3),
        make_approval(effects[2], created_us=NOW + 2, status="approved"),
        make_approval(effects[3], created_us=NOW + 4),
    ]
    async with store.transaction() as q:
        for effect, approval in zip(effects, approvals, strict=True):
            await q.insert_effect(effect)
            await q.insert_approval(approval)
    async with store.reader() as q:
        pending = await q.list_approvals(org, "pending")
        every = await q.list_approvals(org)
        newest = await q.list_approvals(org, limit=1)
        by_id = await q.get_approval(org, approvals[1].approval_id)
        by_effect = await q.get_approval_for_effect(org, effects[2].effect_id)
        of_session = await q.list_session_approvals(org, session)
    assert [a.approval_id for a in pending] == [approvals[i].approval_id for i in (3, 1, 0)]
    assert [a.approval_id for a in every] == [approvals[i].approval_id for i in (3, 1, 2, 0)]
    assert newest == [approvals[3]]
    assert (by_id, by_effect) == (approvals[1], approvals[2])
    assert of_session == [approvals[i] for i in (0, 2, 1, 3)]


async def test_update_approval_with_expect_status_decides_only_once(store: Store) -> None:
    org = new_org()
    effect = make_effect(org, state="awaiting_approval")
    approval = make_approval(effect)
    async with store.transaction() as q:
        await q.insert_effect(effect)
        await q.insert_approval(approval)
    decide: dict[str, Any] = {
        "status": "approved",
        "decided_us": NOW + 1,
        "decided_by": "ana",
        "reason": "ok",
    }
    async with store.transaction() as q:
        first = await q.update_approval(
            org, approval.approval_id, expect_status="pending", **decide
        )
        second = await q.update_approval(
            org, approval.approval_id, expect_status="pending", status="rejected"
        )
    async with store.reader() as q:
        stored = await q.get_approval(org, approval.approval_id)
    assert (first, second) == (True, False)
    assert stored == replace(approval, **decide)


# -- events ---------------------------------------------------------------------------------


async def insert_events(store: Store, org_id: str, count: int, session_id: str | None) -> list[int]:
    ids = []
    for n in range(count):
        async with store.transaction() as q:
            ids.append(
                await q.insert_event(
                    org_id, "effect_intercepted", session_id, None, f'{{"n":{n}}}', NOW
                )
            )
    return ids


async def test_events_get_increasing_ids_and_resume_after_an_id_without_gaps_or_duplicates(
    store: Store,
) -> None:
    org = new_org()
    ids = await insert_events(store, org, 10, new_session())
    assert ids == sorted(ids) and len(set(ids)) == 10
    seen: list[int] = []
    last = 0
    async with store.reader() as q:
        while page := await q.list_events(org, after_id=last, limit=3):
            assert len(page) <= 3
            seen.extend(e.event_id for e in page)
            last = page[-1].event_id
        tail = await q.list_events(org, after_id=ids[6])
    assert seen == ids
    assert [e.payload_json for e in tail] == ['{"n":7}', '{"n":8}', '{"n":9}']


async def test_events_are_scoped_to_their_org_and_can_be_filtered_by_session(store: Store) -> None:
    org, other, session = new_org(), new_org(), new_session()
    mine = await insert_events(store, org, 2, session)
    await insert_events(store, other, 3, session)
    mine += await insert_events(store, org, 1, None)
    async with store.reader() as q:
        listed = await q.list_events(org)
        of_session = await q.list_events(org, session_id=session)
    assert [e.event_id for e in listed] == mine
    assert {e.org_id for e in listed} == {org}
    assert [e.event_id for e in of_session] == mine[:2]


# -- transactions, scoping and failures -------------------------------------------------------


async def test_a_transaction_that_raises_is_rolled_back(store: Store) -> None:
    org = new_org()
    effect = make_effect(org)
    boom = RuntimeError("boom")
    with pytest.raises(RuntimeError) as caught:
        async with store.transaction(lock_key=effect.call_signature) as q:
            await q.upsert_org(org, "x", 60, False, NOW)
            await q.insert_effect(effect)
            await q.insert_undo_entry(make_undo(effect))
            await q.insert_event(org, "effect_intercepted", None, None, "{}", NOW)
            raise boom
    assert caught.value is boom
    async with store.reader() as q:
        assert await q.get_org(org) is None
        assert await q.get_effect(org, effect.effect_id) is None
        assert await q.list_undo_entries(org, effect.session_id) == []
        assert await q.list_events(org) == []
    async with store.transaction(lock_key=effect.call_signature) as q:
        assert await q.insert_effect(effect)  # the store, and the lock, are usable again


async def test_reads_never_cross_orgs(store: Store) -> None:
    org, intruder = new_org(), new_org()
    await add_org(store, org)
    effect = make_effect(org)
    entry = make_undo(effect)
    approval = make_approval(effect)
    async with store.transaction() as q:
        await q.upsert_tool(make_tool(org, effect.tool_name))
        await q.touch_session(org, effect.session_id, 1, NOW)
        await q.insert_effect(effect)
        await q.insert_undo_entry(entry)
        await q.insert_approval(approval)
        await q.insert_event(org, "effect_intercepted", effect.session_id, None, "{}", NOW)
    sid, eid = effect.session_id, effect.effect_id
    async with store.reader() as q:
        assert await q.get_org(intruder) is None
        assert await q.get_tool(intruder, effect.tool_name) is None
        assert await q.list_tools(intruder) == []
        assert await q.get_session(intruder, sid) is None
        assert await q.list_sessions(intruder) == []
        assert await q.get_effect(intruder, eid) is None
        assert await q.get_effect_by_signature(intruder, effect.call_signature) is None
        assert await q.list_effects(intruder, sid) == []
        unfinished = ["executing"]
        assert not await q.find_unfinished_call(intruder, sid, "send_email", "{}", unfinished)
        assert await q.get_undo_entry(intruder, entry.entry_id) is None
        assert await q.list_undo_entries(intruder, sid) == []
        assert await q.get_approval(intruder, approval.approval_id) is None
        assert await q.get_approval_for_effect(intruder, eid) is None
        assert await q.list_approvals(intruder) == []
        assert await q.list_session_approvals(intruder, sid) == []
        assert await q.list_events(intruder) == []
    async with store.transaction() as q:
        assert not await q.update_effect(intruder, eid, state="committed")
        assert not await q.update_undo_entry(intruder, entry.entry_id, state="running")
        assert not await q.update_approval(intruder, approval.approval_id, status="approved")
    async with store.reader() as q:
        assert await q.get_effect(org, eid) == effect
        assert await q.get_undo_entry(org, entry.entry_id) is not None
        assert await q.get_approval(org, approval.approval_id) == approval


async def test_a_constraint_violation_in_a_transaction_surfaces_as_database(store: Store) -> None:
    org = new_org()
    effect = make_effect(org)
    approval = make_approval(effect)
    await add_effect(store, effect)
    async with store.transaction() as q:
        await q.insert_approval(approval)
    with pytest.raises(Database) as caught:
        async with store.transaction() as q:
            await q.insert_approval(approval)
    assert caught.value.code == "database_error"
    async with store.transaction() as q:  # the store recovered
        assert await q.get_approval(org, approval.approval_id) == approval


async def test_a_bad_statement_surfaces_as_database_in_reader_and_autocommit(store: Store) -> None:
    with pytest.raises(Database):
        async with store.reader() as q:
            await q._fetch("SELECT nope FROM no_such_table")
    with pytest.raises(Database):
        async with store.autocommit() as q:
            await q._execute("UPDATE no_such_table SET x = 1")
    async with store.autocommit() as q:
        await q.insert_event(new_org(), "effect_replayed", None, None, "{}", NOW)


async def test_a_closed_store_raises_database(store_url: str) -> None:
    closed = await open_store(store_url)
    await closed.close()
    with pytest.raises(Database):
        async with closed.transaction() as q:
            await q.get_org(new_org())
    with pytest.raises(Database):
        async with closed.reader() as q:
            await q.get_org(new_org())


async def test_opening_postgresql_on_a_closed_port_raises_database() -> None:
    with pytest.raises(Database):
        await open_store("postgresql://postgres@127.0.0.1:1/test")


async def test_opening_sqlite_where_no_file_can_be_created_raises_database(
    tmp_path: Path,
) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    with pytest.raises(Database):
        await open_store(f"sqlite:///{blocker / 'undolog.db'}")


async def test_an_unsupported_url_scheme_raises_value_error() -> None:
    with pytest.raises(ValueError):
        await open_store("mysql://localhost/undolog")


# -- SQLite: a database another process holds or broke ------------------------------------------


async def test_sqlite_busy_beyond_the_busy_timeout_surfaces_as_database(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("undolog.store.sqlite.BUSY_TIMEOUT_MS", 20)
    path = tmp_path / "busy.db"
    sqlite_store = await open_store(f"sqlite:///{path}")
    other_process = sqlite3.connect(path, isolation_level=None)
    try:
        other_process.execute("BEGIN IMMEDIATE")  # holds the write lock
        with pytest.raises(Database):
            await sqlite_store.migrate()
        with pytest.raises(Database):
            async with sqlite_store.transaction() as q:
                await q.get_org(new_org())
        other_process.execute("ROLLBACK")
        assert await sqlite_store.migrate() == LATEST  # and it recovers once the lock is gone
    finally:
        other_process.close()
        await sqlite_store.close()


async def test_a_sqlite_migration_that_cannot_apply_surfaces_as_database_and_applies_nothing(
    tmp_path: Path,
) -> None:
    path = tmp_path / "clash.db"
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE events (x INTEGER)")  # clashes with the schema
    conn.close()
    clashing = await open_store(f"sqlite:///{path}")
    try:
        with pytest.raises(Database):
            await clashing.migrate()
        assert await clashing.schema_version() == 0
    finally:
        await clashing.close()


# -- leases: renewal and the sweeper's claim ----------------------------------------------------


async def test_renew_lease_extends_only_the_same_running_attempt(store: Store) -> None:
    org = new_org()
    await add_org(store, org)
    effect = make_effect(org)
    await add_effect(store, effect)
    async with store.autocommit() as q:
        assert await q.renew_lease(org, effect.effect_id, 1, NOW + 99)
        assert not await q.renew_lease(org, effect.effect_id, 2, NOW + 98)  # another attempt
        assert (await q.get_effect(org, effect.effect_id)).lease_expires_us == NOW + 99  # type: ignore[union-attr]
        await q.update_effect(org, effect.effect_id, state="in_doubt")
        assert not await q.renew_lease(org, effect.effect_id, 1, NOW + 97)  # no longer running


async def test_claim_expired_effects_finds_executing_effects_whose_lease_ran_out(
    store: Store,
) -> None:
    org = new_org()
    await add_org(store, org)
    expired = make_effect(org, lease_expires_us=NOW - 1)
    alive = make_effect(org, lease_expires_us=NOW + 10)
    settled = make_effect(org, lease_expires_us=NOW - 1, state="in_doubt")
    for effect in (expired, alive, settled):
        await add_effect(store, effect)
    async with store.transaction() as q:
        found = await q.claim_expired_effects(NOW, limit=1000)
    assert expired.effect_id in {e.effect_id for e in found}
    assert not {alive.effect_id, settled.effect_id} & {e.effect_id for e in found}
