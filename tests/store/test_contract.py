"""The store contract: what a store is, proved on SQLite and on PostgreSQL alike — schema,
keys, orgs, tools, sessions and effects (undo entries, approvals, events, transactions, failures
and leases are in test_contract_records.py).

Every test here takes the parametrised `store` fixture, so each runs once per dialect. Tests
isolate from each other by fresh org ids (the PostgreSQL database is shared by the run).
"""

from __future__ import annotations

import uuid
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from tests.store.contract_helpers import (
    EFFECT,
    LATEST,
    NOW,
    add_effect,
    add_org,
    make_effect,
    make_tool,
    new_org,
    new_session,
    new_signature,
)
from undolog.store import (
    EffectRecord,
    OrgRecord,
    Store,
    ToolRecord,
    open_store,
)
from undolog.store.base import load_migrations
from undolog.store.records import KeyRecord

# -- schema ---------------------------------------------------------------------------------


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
    # updated_us moves only once older than SESSION_TOUCH_US (tests/store/test_session_touch.py)
    assert (raised.last_step, raised.created_us, raised.updated_us) == (7, NOW, NOW)


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
