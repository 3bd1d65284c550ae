"""The store contract: what a store is, proved on SQLite and on PostgreSQL alike.

Every test here takes the parametrised `store` fixture, so each runs once per dialect. Tests
isolate from each other by fresh org ids (the PostgreSQL database is shared by the run).
"""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from undolog.store import (
    ApprovalRecord,
    EffectRecord,
    Store,
    ToolRecord,
    UndoEntryRecord,
    open_store,
)
from undolog_sdk.errors import Database

NOW = 1_700_000_000_000_000


def new_org() -> str:
    return f"org-{uuid.uuid4().hex[:12]}"


def new_session() -> str:
    return str(uuid.uuid4())


def new_signature() -> str:
    return uuid.uuid4().hex + uuid.uuid4().hex


def make_effect(
    org_id: str,
    *,
    session_id: str | None = None,
    signature: str | None = None,
    step: int = 1,
    tool: str = "send_email",
    args_json: str = '{"to":"a@example.com"}',
    state: str = "executing",
    created_us: int = NOW,
) -> EffectRecord:
    return EffectRecord(
        effect_id=str(uuid.uuid4()),
        org_id=org_id,
        session_id=session_id or new_session(),
        step_index=step,
        tool_name=tool,
        tool_version="1.0.0",
        tier="compensable",
        call_signature=signature or new_signature(),
        args_json=args_json,
        state=state,
        mode="proxy",
        attempts=1,
        result_json=None,
        error=None,
        lease_expires_us=created_us + 60_000_000,
        executed_us=created_us + 1,
        finished_us=None,
        created_us=created_us,
        updated_us=created_us,
    )


def make_undo(effect: EffectRecord, *, registered_us: int = NOW) -> UndoEntryRecord:
    return UndoEntryRecord(
        seq=0,
        entry_id=str(uuid.uuid4()),
        org_id=effect.org_id,
        session_id=effect.session_id,
        effect_id=effect.effect_id,
        fn_name="undo_send_email",
        fn_version="1.0.0",
        args_json='{"to":"a@example.com"}',
        max_retries=3,
        retry_backoff_ms=1000,
        registered_us=registered_us,
        state="pending",
        attempts=0,
        last_error=None,
        updated_us=registered_us,
    )


def make_approval(
    effect: EffectRecord, *, created_us: int = NOW, status: str = "pending"
) -> ApprovalRecord:
    return ApprovalRecord(
        approval_id=str(uuid.uuid4()),
        org_id=effect.org_id,
        effect_id=effect.effect_id,
        session_id=effect.session_id,
        tool_name=effect.tool_name,
        args_json=effect.args_json,
        status=status,
        created_us=created_us,
        timeout_us=created_us + 3_600_000_000,
        decided_us=None,
        decided_by=None,
        reason=None,
    )


def make_tool(org_id: str, name: str, *, tier: str = "compensable") -> ToolRecord:
    return ToolRecord(
        org_id=org_id,
        name=name,
        tier=tier,
        version="1.0.0",
        compensation_json='{"fn_name":"undo"}' if tier == "compensable" else None,
        idempotent_upstream=False,
        upstream_url=None,
        updated_us=NOW,
    )


async def add_org(store: Store, org_id: str, *, timeout_s: int = 3600) -> None:
    async with store.transaction() as q:
        await q.upsert_org(org_id, f"name of {org_id}", timeout_s, False, NOW)


async def add_effect(store: Store, effect: EffectRecord) -> None:
    async with store.transaction() as q:
        assert await q.insert_effect(effect)


# -- schema ---------------------------------------------------------------------------------


async def test_migrate_is_idempotent_and_reports_version_1(store: Store) -> None:
    assert await store.migrate() == 1
    assert await store.migrate() == 1
    assert await store.schema_version() == 1


async def test_a_fresh_sqlite_file_has_schema_version_0_until_migrated(tmp_path: Path) -> None:
    fresh = await open_store(f"sqlite:///{tmp_path / 'fresh.db'}")
    try:
        assert await fresh.schema_version() == 0
        assert await fresh.migrate() == 1
        assert await fresh.schema_version() == 1
    finally:
        await fresh.close()


# -- orgs and keys ----------------------------------------------------------------------------


async def test_an_api_key_hash_maps_to_its_org_and_an_unknown_hash_to_none(store: Store) -> None:
    org_a, org_b = new_org(), new_org()
    key_a, key_b = uuid.uuid4().hex * 2, uuid.uuid4().hex * 2
    for org, key in ((org_a, key_a), (org_b, key_b)):
        await add_org(store, org)
        async with store.transaction() as q:
            await q.add_api_key(key, org, "ci", NOW)
    async with store.reader() as q:
        assert await q.org_for_key_hash(key_a) == org_a
        assert await q.org_for_key_hash(key_b) == org_b
        assert await q.org_for_key_hash(uuid.uuid4().hex * 2) is None


async def test_a_key_already_stored_keeps_its_org(store: Store) -> None:
    org_a, org_b = new_org(), new_org()
    key = uuid.uuid4().hex * 2
    await add_org(store, org_a)
    await add_org(store, org_b)
    async with store.transaction() as q:
        await q.add_api_key(key, org_a, None, NOW)
        await q.add_api_key(key, org_b, None, NOW)
    async with store.reader() as q:
        assert await q.org_for_key_hash(key) == org_a


async def test_upsert_org_stores_then_replaces_the_approval_policy(store: Store) -> None:
    org = new_org()
    await add_org(store, org, timeout_s=120)
    async with store.transaction() as q:
        await q.upsert_org(org, "renamed", 30, True, NOW + 5)
    async with store.reader() as q:
        record = await q.get_org(org)
        assert await q.get_org(new_org()) is None
    assert record is not None
    assert (record.name, record.approval_timeout_s, record.auto_approve_on_timeout) == (
        "renamed",
        30,
        True,
    )
    assert record.created_us == NOW  # an update keeps the creation time


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
        org, "send_email", "irreversible", "2.0.0", None, True, "http://x", NOW + 1
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
    effect = make_effect(org, session_id=session, step=top)
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
    second = make_effect(org, signature=first.call_signature, session_id=first.session_id)
    async with store.transaction() as q:
        assert await q.insert_effect(first) is True
        assert await q.insert_effect(second) is False
    async with store.reader() as q:
        assert await q.get_effect_by_signature(org, first.call_signature) == first
        assert await q.get_effect(org, second.effect_id) is None


async def test_the_same_signature_in_another_org_is_a_separate_effect(store: Store) -> None:
    first = make_effect(new_org())
    other = make_effect(new_org(), signature=first.call_signature)
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
    assert changed is not None
    assert (changed.state, changed.result_json, changed.lease_expires_us, changed.finished_us) == (
        "committed",
        '{"ok":true}',
        None,
        NOW + 9,
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
    args = '{"to":"a@example.com"}'
    older = make_effect(org, session_id=session, step=1, args_json=args)
    latest = make_effect(org, session_id=session, step=2, args_json=args, state="awaiting_approval")
    committed = make_effect(org, session_id=session, step=3, args_json=args, state="committed")
    other_args = make_effect(org, session_id=session, step=4, args_json='{"to":"b@example.com"}')
    other_tool = make_effect(org, session_id=session, step=5, args_json=args, tool="create_record")
    other_session = make_effect(org, step=6, args_json=args)
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


async def test_list_effects_returns_a_sessions_effects_in_step_order(store: Store) -> None:
    org, session = new_org(), new_session()
    effects = [make_effect(org, session_id=session, step=s) for s in (3, 1, 2)]
    async with store.transaction() as q:
        for effect in effects:
            await q.insert_effect(effect)
        await q.insert_effect(make_effect(org, step=1))
    async with store.reader() as q:
        listed = await q.list_effects(org, session)
    assert [e.step_index for e in listed] == [1, 2, 3]


# -- undo entries ---------------------------------------------------------------------------


async def test_undo_entries_get_increasing_seq_and_list_newest_first(store: Store) -> None:
    org, session = new_org(), new_session()
    effects = [make_effect(org, session_id=session, step=s) for s in (1, 2, 3)]
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


async def test_approvals_are_listed_by_status_newest_first(store: Store) -> None:
    org = new_org()
    effects = [make_effect(org, state="awaiting_approval") for _ in range(4)]
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
    assert [a.approval_id for a in pending] == [approvals[i].approval_id for i in (3, 1, 0)]
    assert [a.approval_id for a in every] == [approvals[i].approval_id for i in (3, 1, 2, 0)]
    assert newest == [approvals[3]]
    assert (by_id, by_effect) == (approvals[1], approvals[2])


async def test_update_approval_with_expect_status_decides_only_once(store: Store) -> None:
    org = new_org()
    effect = make_effect(org, state="awaiting_approval")
    approval = make_approval(effect)
    async with store.transaction() as q:
        await q.insert_effect(effect)
        await q.insert_approval(approval)
    decide = {"status": "approved", "decided_us": NOW + 1, "decided_by": "ana", "reason": "ok"}
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
    assert stored is not None
    assert (stored.status, stored.decided_us, stored.decided_by, stored.reason) == (
        "approved",
        NOW + 1,
        "ana",
        "ok",
    )


async def test_list_session_approvals_returns_oldest_first(store: Store) -> None:
    org, session = new_org(), new_session()
    effects = [make_effect(org, session_id=session, step=s) for s in (1, 2)]
    approvals = [make_approval(effects[0], created_us=NOW + 5), make_approval(effects[1])]
    async with store.transaction() as q:
        for effect, approval in zip(effects, approvals, strict=True):
            await q.insert_effect(effect)
            await q.insert_approval(approval)
    async with store.reader() as q:
        listed = await q.list_session_approvals(org, session)
    assert listed == [approvals[1], approvals[0]]


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


async def test_events_get_increasing_ids(store: Store) -> None:
    ids = await insert_events(store, new_org(), 5, None)
    assert ids == sorted(ids) and len(set(ids)) == 5


async def test_list_events_after_an_id_resumes_without_gaps_or_duplicates(store: Store) -> None:
    org = new_org()
    ids = await insert_events(store, org, 10, new_session())
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
        assert (
            await q.find_unfinished_call(
                intruder, sid, effect.tool_name, effect.args_json, ["executing"]
            )
            is None
        )
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


async def test_a_postgres_connection_dropped_by_the_server_surfaces_as_database(
    pg_url: str,
) -> None:
    pg = await open_store(pg_url)
    try:
        with pytest.raises(Database):
            async with pg.reader() as q:
                row = await q._fetchrow("SELECT pg_backend_pid()")
                assert row is not None
                async with pg.autocommit() as other:  # a second pooled connection
                    await other._fetch("SELECT pg_terminate_backend(?)", row[0])
                await q._fetch("SELECT 1")
        async with pg.reader() as q:  # the pool replaces the dead connection
            assert await q._fetchrow("SELECT 1") == (1,)
    finally:
        await pg.close()
