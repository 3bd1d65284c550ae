"""The store contract: what a store is, proved on SQLite and on PostgreSQL alike.

Every test here takes the parametrised `store` fixture, so each runs once per dialect. Tests
isolate from each other by fresh org ids (the PostgreSQL database is shared by the run).
"""

from __future__ import annotations

import sqlite3
import uuid
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from undolog.store import (
    ApprovalRecord,
    EffectRecord,
    OrgRecord,
    Store,
    ToolRecord,
    UndoEntryRecord,
    open_store,
)
from undolog.store.base import load_migrations
from undolog.store.records import KeyRecord
from undolog_sdk.errors import Database

NOW = 1_700_000_000_000_000


def new_org() -> str:
    return f"org-{uuid.uuid4().hex[:12]}"


def new_session() -> str:
    return str(uuid.uuid4())


def new_signature() -> str:
    return uuid.uuid4().hex + uuid.uuid4().hex


EFFECT = EffectRecord(
    effect_id="",
    org_id="",
    session_id="",
    step_index=1,
    tool_name="send_email",
    tool_version="1.0.0",
    tier="compensable",
    call_signature="",
    args_json='{"to":"a@example.com"}',
    state="executing",
    mode="proxy",
    attempts=1,
    result_json=None,
    error=None,
    lease_expires_us=NOW + 60_000_000,
    executed_us=NOW + 1,
    finished_us=None,
    created_us=NOW,
    updated_us=NOW,
)


def make_effect(org_id: str, **changes: Any) -> EffectRecord:
    """An effect with fresh ids (its own session and signature unless given)."""
    fresh = {"session_id": new_session(), "call_signature": new_signature()}
    return replace(EFFECT, effect_id=str(uuid.uuid4()), org_id=org_id, **(fresh | changes))


def make_undo(effect: EffectRecord) -> UndoEntryRecord:
    return UndoEntryRecord(
        seq=0,  # assigned by the store
        entry_id=str(uuid.uuid4()),
        org_id=effect.org_id,
        session_id=effect.session_id,
        effect_id=effect.effect_id,
        fn_name="undo_send_email",
        fn_version="1.0.0",
        args_json='{"to":"a@example.com"}',
        max_retries=3,
        retry_backoff_ms=1000,
        registered_us=NOW,
        state="pending",
        attempts=0,
        last_error=None,
        updated_us=NOW,
    )


def make_approval(effect: EffectRecord, *, created_us: int = NOW, **changes: Any) -> ApprovalRecord:
    approval = ApprovalRecord(
        approval_id=str(uuid.uuid4()),
        org_id=effect.org_id,
        effect_id=effect.effect_id,
        session_id=effect.session_id,
        tool_name=effect.tool_name,
        args_json=effect.args_json,
        status="pending",
        created_us=created_us,
        timeout_us=created_us + 3_600_000_000,
        decided_us=None,
        decided_by=None,
        reason=None,
    )
    return replace(approval, **changes)


def make_tool(org_id: str, name: str, *, tier: str = "compensable") -> ToolRecord:
    compensation = '{"fn_name":"undo"}' if tier == "compensable" else None
    return ToolRecord(org_id, name, tier, "1.0.0", compensation, False, None, NOW)


async def add_org(store: Store, org_id: str, *, timeout_s: int = 3600) -> None:
    async with store.transaction() as q:
        await q.upsert_org(org_id, f"name of {org_id}", timeout_s, False, NOW)


async def add_effect(store: Store, effect: EffectRecord) -> None:
    async with store.transaction() as q:
        assert await q.insert_effect(effect)


# -- schema ---------------------------------------------------------------------------------


LATEST = max(version for version, _ in load_migrations("sqlite"))


def test_both_dialects_ship_the_same_migration_versions() -> None:
    versions = {d: [v for v, _ in load_migrations(d)] for d in ("sqlite", "postgres")}
    assert versions["sqlite"] == versions["postgres"]
    # Increasing from 1; numbers are assigned per branch of work, so a gap can exist until
    # every branch is merged.
    assert versions["sqlite"][0] == 1
    assert versions["sqlite"] == sorted(set(versions["sqlite"]))


async def test_migrate_is_idempotent_and_reports_the_latest_version(store: Store) -> None:
    assert await store.migrate() == LATEST
    assert await store.migrate() == LATEST
    assert await store.schema_version() == LATEST


async def test_a_fresh_sqlite_file_has_schema_version_0_until_migrated(tmp_path: Path) -> None:
    fresh = await open_store(f"sqlite:///{tmp_path / 'fresh.db'}")
    try:
        assert await fresh.schema_version() == 0
        assert await fresh.migrate() == LATEST
        assert await fresh.schema_version() == LATEST
    finally:
        await fresh.close()


# -- orgs and keys ----------------------------------------------------------------------------


def key_record(key_hash: str, org_id: str, *, name: str = "ci", role: str = "agent",
               source: str = "config") -> KeyRecord:  # fmt: skip
    return KeyRecord(f"key_{uuid.uuid4().hex[:12]}", key_hash, org_id, name, role, source,
                     NOW, None, None)  # fmt: skip


async def test_a_key_listed_again_moves_to_its_new_org_and_role_and_keeps_its_id(
    store: Store,
) -> None:
    org_a, org_b = new_org(), new_org()
    key_a, key_b = uuid.uuid4().hex * 2, uuid.uuid4().hex * 2
    for org in (org_a, org_b):
        await add_org(store, org)
    async with store.transaction() as q:
        first = await q.put_api_key(key_record(key_a, org_a))
        await q.put_api_key(key_record(key_b, org_b, role="approver"))
        moved = await q.put_api_key(key_record(key_a, org_b, name="alice", role="admin"))
    assert moved.key_id == first.key_id
    async with store.reader() as q:
        a, b = await q.live_key(key_a), await q.live_key(key_b)
        assert a is not None and b is not None
        assert (a.org_id, a.name, a.role) == (org_b, "alice", "admin")
        assert (b.org_id, b.role) == (org_b, "approver")
        assert await q.live_key(uuid.uuid4().hex * 2) is None


async def test_revoking_unlisted_keys_spares_the_listed_ones_and_other_sources(
    store: Store,
) -> None:
    org = new_org()
    await add_org(store, org)
    kept, dropped, cli = (uuid.uuid4().hex * 2 for _ in range(3))
    async with store.transaction() as q:
        await q.put_api_key(key_record(kept, org))
        gone = await q.put_api_key(key_record(dropped, org))
        await q.put_api_key(key_record(cli, org, source="cli"))
        await q.insert_ui_session("s" * 64, gone.key_id, org, NOW, NOW + 10**9)
        revoked = await q.revoke_unlisted_keys("config", {kept}, NOW + 1, org)
    assert revoked == 1
    async with store.reader() as q:
        assert await q.live_key(kept) is not None
        assert await q.live_key(cli) is not None
        assert await q.live_key(dropped) is None
        assert await q.ui_session_key("s" * 64, NOW + 2) is None  # its session ended with it
        listed = {k.key_hash: k for k in await q.list_keys(org)}
    assert listed[dropped].revoked_us == NOW + 1
    assert listed[kept].revoked_us is None


async def test_a_dashboard_session_lives_until_it_ends_or_expires(store: Store) -> None:
    org = new_org()
    await add_org(store, org)
    async with store.transaction() as q:
        key = await q.put_api_key(key_record(uuid.uuid4().hex * 2, org, role="approver"))
        await q.insert_ui_session("a" * 64, key.key_id, org, NOW, NOW + 100)
    async with store.reader() as q:
        found = await q.ui_session_key("a" * 64, NOW + 1)
        assert found is not None and found.key_id == key.key_id
        assert await q.ui_session_key("a" * 64, NOW + 100) is None  # expired
    async with store.autocommit() as q:
        await q.end_ui_session("a" * 64, NOW + 2)
    async with store.reader() as q:
        assert await q.ui_session_key("a" * 64, NOW + 3) is None


async def test_upsert_org_stores_then_replaces_the_approval_policy(store: Store) -> None:
    org = new_org()
    await add_org(store, org, timeout_s=120)
    async with store.transaction() as q:
        await q.upsert_org(org, "renamed", 30, True, NOW + 5)
    async with store.reader() as q:
        record = await q.get_org(org)
        assert await q.get_org(new_org()) is None
    assert record == OrgRecord(org, "renamed", 30, True, NOW)  # created_us is kept


# -- tools ----------------------------------------------------------------------------------


async def test_tools_are_upserted_read_back_and_listed_by_name_per_org(store: Store) -> None:
    org, other = new_org(), new_org()
    await add_org(store, org)
    await add_org(store, other)
    async with store.transaction() as q:
        await q.upsert_tool(make_tool(org, "send_email"))
        await q.upsert_tool(make_tool(org, "delete_database", tier="irreversible"))
        await q.upsert_tool(make_tool(other, "search_web", tier="safe"))
    replaced = ToolRecord(
        org, "send_email", "irreversible", "2.0.0", None, True, "billing", NOW + 1
    )
    async with store.transaction() as q:
        await q.upsert_tool(replaced)
    async with store.reader() as q:
        assert await q.get_tool(org, "send_email") == replaced
        assert await q.get_tool(org, "search_web") is None
        names = [t.name for t in await q.list_tools(org)]
    assert names == ["delete_database", "send_email"]


# -- sessions -------------------------------------------------------------------------------


async def test_touch_session_creates_an_active_session_and_only_raises_last_step(
    store: Store,
) -> None:
    org, session = new_org(), new_session()
    async with store.transaction() as q:
        created = await q.touch_session(org, session, 3, NOW)
        lowered = await q.touch_session(org, session, 1, NOW + 1)
        raised = await q.touch_session(org, session, 7, NOW + 2)
    assert (created.state, created.last_step, created.created_us) == ("active", 3, NOW)
    assert lowered.last_step == 3
    assert (raised.last_step, raised.created_us, raised.updated_us) == (7, NOW, NOW + 2)


async def test_update_session_sets_the_state_and_never_lowers_last_step(store: Store) -> None:
    org, session = new_org(), new_session()
    async with store.transaction() as q:
        await q.touch_session(org, session, 5, NOW)
        await q.update_session(org, session, NOW + 1, state="completed", last_step=2)
        after_lower = await q.get_session(org, session)
        await q.update_session(org, session, NOW + 2, last_step=9)
        after_raise = await q.get_session(org, session)
    assert after_lower is not None and after_raise is not None
    assert (after_lower.state, after_lower.last_step) == ("completed", 5)
    assert (after_raise.state, after_raise.last_step) == ("completed", 9)


async def test_step_indexes_up_to_u32_max_are_stored(store: Store) -> None:
    org, session = new_org(), new_session()
    top = 0xFFFFFFFF
    effect = make_effect(org, session_id=session, step_index=top)
    async with store.transaction() as q:
        await q.touch_session(org, session, top - 1, NOW)
        await q.update_session(org, session, NOW, last_step=top)
        assert await q.insert_effect(effect)
    async with store.reader() as q:
        stored = await q.get_session(org, session)
        assert stored is not None and stored.last_step == top
        assert await q.get_effect(org, effect.effect_id) == effect


# -- effects --------------------------------------------------------------------------------


async def test_an_effect_is_stored_and_read_back_by_id_and_by_signature(store: Store) -> None:
    org = new_org()
    effect = make_effect(org)
    await add_effect(store, effect)
    async with store.reader() as q:
        assert await q.get_effect(org, effect.effect_id) == effect
        assert await q.get_effect_by_signature(org, effect.call_signature) == effect
        assert await q.get_effect_by_signature(org, new_signature()) is None


async def test_a_second_insert_of_a_signature_in_the_same_org_is_refused(store: Store) -> None:
    org = new_org()
    first = make_effect(org)
    second = make_effect(org, call_signature=first.call_signature, session_id=first.session_id)
    async with store.transaction() as q:
        assert await q.insert_effect(first) is True
        assert await q.insert_effect(second) is False
    async with store.reader() as q:
        assert await q.get_effect_by_signature(org, first.call_signature) == first
        assert await q.get_effect(org, second.effect_id) is None


async def test_the_same_signature_in_another_org_is_a_separate_effect(store: Store) -> None:
    first = make_effect(new_org())
    other = make_effect(new_org(), call_signature=first.call_signature)
    async with store.transaction() as q:
        assert await q.insert_effect(first)
        assert await q.insert_effect(other)
    async with store.reader() as q:
        found = await q.get_effect_by_signature(other.org_id, first.call_signature)
    assert found == other


async def test_update_effect_with_expect_state_changes_nothing_when_the_state_differs(
    store: Store,
) -> None:
    org = new_org()
    effect = make_effect(org)
    await add_effect(store, effect)
    async with store.transaction() as q:
        missed = await q.update_effect(
            org, effect.effect_id, expect_state="in_doubt", state="committed"
        )
        unchanged = await q.get_effect(org, effect.effect_id)
        hit = await q.update_effect(
            org,
            effect.effect_id,
            expect_state="executing",
            state="committed",
            result='{"ok":true}',
            lease_expires_us=None,
            finished_us=NOW + 9,
        )
        changed = await q.get_effect(org, effect.effect_id)
    assert (missed, unchanged) == (False, effect)
    assert hit is True
    assert changed == replace(
        effect,
        state="committed",
        result_json='{"ok":true}',
        lease_expires_us=None,
        finished_us=NOW + 9,
    )


async def test_update_effect_refuses_columns_that_are_not_updatable(store: Store) -> None:
    org = new_org()
    effect = make_effect(org)
    await add_effect(store, effect)
    with pytest.raises(ValueError):
        async with store.transaction() as q:
            await q.update_effect(org, effect.effect_id, call_signature="forged")
    async with store.reader() as q:
        assert await q.get_effect(org, effect.effect_id) == effect


async def test_find_unfinished_call_returns_the_latest_matching_effect_in_the_given_states(
    store: Store,
) -> None:
    org, session = new_org(), new_session()
    args = EFFECT.args_json

    def call(step: int, **changes: Any) -> EffectRecord:
        return make_effect(org, session_id=session, step_index=step, **changes)

    older, latest = call(1), call(2, state="awaiting_approval")
    committed = call(3, state="committed")
    other_args = call(4, args_json='{"to":"b@example.com"}')
    other_tool = call(5, tool_name="create_record")
    other_session = make_effect(org, step_index=6)
    async with store.transaction() as q:
        for effect in (older, latest, committed, other_args, other_tool, other_session):
            assert await q.insert_effect(effect)
    unfinished = ("executing", "awaiting_approval", "in_doubt")
    async with store.reader() as q:
        found = await q.find_unfinished_call(org, session, "send_email", args, unfinished)
        executing = await q.find_unfinished_call(org, session, "send_email", args, ["executing"])
        none = await q.find_unfinished_call(org, session, "send_email", args, ["failed"])
        elsewhere = await q.find_unfinished_call(new_org(), session, "send_email", args, unfinished)
    assert found == latest
    assert executing == older
    assert none is None
    assert elsewhere is None


async def test_mark_delivered_ends_the_owed_answer_of_effects_in_the_given_states_of_its_org(
    store: Store,
) -> None:
    org, other_org, session = new_org(), new_org(), new_session()
    args = EFFECT.args_json
    answered, running = ("committed", "failed"), ("executing",)

    def call(org_id: str, step: int, **changes: Any) -> EffectRecord:
        return make_effect(org_id, session_id=session, step_index=step, **changes)

    committed = call(org, 1, state="committed")
    failed = call(org, 2, state="failed", tool_name="create_record")
    executing = call(org, 3, args_json='{"to":"b@example.com"}')
    theirs = call(other_org, 1, state="committed")
    async with store.transaction() as q:
        for effect in (committed, failed, executing, theirs):
            assert await q.insert_effect(effect)

    async def owed(org_id: str, tool: str = "send_email", args_json: str = args) -> Any:
        async with store.reader() as q:
            return await q.find_unfinished_call(org_id, session, tool, args_json, running, answered)

    assert await owed(org) == committed  # undelivered: its answer is still owed
    assert await owed(org, "create_record") == failed
    async with store.transaction() as q:
        # Another org's effect, a state not listed, and the wrong org are all left alone.
        assert await q.mark_delivered(org, [theirs.effect_id], answered, NOW) == 0
        assert await q.mark_delivered(other_org, [committed.effect_id], answered, NOW) == 0
        assert await q.mark_delivered(org, [committed.effect_id], ["failed"], NOW) == 0
        assert await q.mark_delivered(org, [executing.effect_id], answered, NOW) == 0
        assert await q.mark_delivered(org, [], answered, NOW) == 0
    assert await owed(org) == committed
    assert await owed(other_org) == theirs

    ids = [committed.effect_id, failed.effect_id, executing.effect_id]
    async with store.transaction() as q:
        assert await q.mark_delivered(org, ids, answered, NOW) == 2
        assert await q.mark_delivered(org, ids, answered, NOW + 1) == 0  # marked once
        # The running one (passed over above) finishes later: its answer is owed again.
        assert await q.update_effect(org, executing.effect_id, state="committed")
    assert await owed(org) is None
    assert await owed(org, "create_record") is None
    assert await owed(org, args_json=executing.args_json) == replace(executing, state="committed")
    assert await owed(other_org) == theirs
    async with store.reader() as q:  # a state in `states` matches whether delivered or not
        again = await q.find_unfinished_call(org, session, "send_email", args, ["committed"])
    assert again == committed


async def test_list_effects_returns_a_sessions_effects_in_step_order(store: Store) -> None:
    org, session = new_org(), new_session()
    effects = [make_effect(org, session_id=session, step_index=s) for s in (3, 1, 2)]
    async with store.transaction() as q:
        for effect in effects:
            await q.insert_effect(effect)
        await q.insert_effect(make_effect(org, step_index=1))
    async with store.reader() as q:
        listed = await q.list_effects(org, session)
    assert [e.step_index for e in listed] == [1, 2, 3]


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
