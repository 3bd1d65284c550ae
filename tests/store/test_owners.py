"""Session owners in the store, on both stores: the column of migration 9 and its queries.

`touch_session` records the owner of a session it creates and never changes it;
`list_sessions` filters by owner; `session_owner` finds the owner of the session a session,
effect, approval or undo entry belongs to. Sessions from before migration 9 have none.
"""

from __future__ import annotations

import uuid

import pytest

from tests.store import test_migration_upstream as migration
from tests.store.contract_helpers import NOW, make_effect, make_undo
from tests.store.test_migration_upstream import _migrate_to, _sql
from undolog.store import Store, open_store

fresh_url = migration.fresh_url  # an empty database of each kind


async def test_the_first_touch_sets_the_owner_and_later_ones_keep_it(
    store: Store, org_id: str
) -> None:
    session = str(uuid.uuid4())
    async with store.transaction() as q:
        created = await q.touch_session(org_id, session, 1, NOW, "key-a")
        touched = await q.touch_session(org_id, session, 2, NOW + 1, "key-b")
        anonymous = await q.touch_session(org_id, str(uuid.uuid4()), 1, NOW)
    assert (created.owner_key_id, touched.owner_key_id, touched.last_step) == ("key-a", "key-a", 2)
    assert anonymous.owner_key_id is None


async def test_sessions_are_listed_by_owner_and_each_kind_finds_its_sessions_owner(
    store: Store, org_id: str
) -> None:
    mine, theirs = str(uuid.uuid4()), str(uuid.uuid4())
    effect = make_effect(org_id, session_id=mine)
    async with store.transaction() as q:
        await q.touch_session(org_id, mine, 1, NOW, "key-a")
        await q.touch_session(org_id, theirs, 1, NOW + 1, "key-b")
        assert await q.insert_effect(effect)
        await q.insert_undo_entry(make_undo(effect))
        [entry] = await q.list_undo_entries(org_id, mine)
    async with store.reader() as q:
        assert [s.session_id for s in await q.list_sessions(org_id, owner="key-a")] == [mine]
        assert [s.session_id for s in await q.list_sessions(org_id)] == [theirs, mine]
        assert await q.list_sessions(org_id, owner="key-c") == []
        assert await q.session_owner(org_id, "session", mine) == (True, "key-a")
        assert await q.session_owner(org_id, "effect", effect.effect_id) == (True, "key-a")
        assert await q.session_owner(org_id, "undo_entry", entry.entry_id) == (True, "key-a")
        assert await q.session_owner(org_id, "approval", "nope") == (False, None)
        assert await q.session_owner("another-org", "session", mine) == (False, None)


async def test_sessions_from_before_migration_9_have_no_owner(
    fresh_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    await _migrate_to(fresh_url, 8, monkeypatch)
    await _sql(
        fresh_url,
        "INSERT INTO sessions (org_id, session_id, state, last_step, created_us, updated_us) "
        "VALUES ($1, $2, 'active', 3, 1, 1)",
        "acme",
        "old-session",
    )
    await _migrate_to(fresh_url, None, monkeypatch)
    store = await open_store(fresh_url)
    try:
        async with store.reader() as q:
            old = await q.get_session("acme", "old-session")
            assert await q.session_owner("acme", "session", "old-session") == (True, None)
            assert await q.list_sessions("acme", owner="key-a") == []
    finally:
        await store.close()
    assert old is not None and (old.last_step, old.owner_key_id) == (3, None)
