"""The store contract for the paged lists (docs/dashboard.md), on both dialects: keyset pages
that neither repeat nor skip rows sharing a sort value, filters, each session's latest calls,
the latest events, all scoped by org (and owner)."""

from __future__ import annotations

import asyncio
import importlib
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import _create_database, _drop_database, _pg_admin_url
from tests.store.contract_helpers import (
    NOW,
    add_effect,
    add_org,
    make_approval,
    make_effect,
    new_org,
    new_session,
)
from undolog.store import Store, open_store
from undolog.store._sql.pages import like_pattern
from undolog.store.base import load_migrations
from undolog.store.records import KeyRecord


async def test_session_pages_cover_every_row_once_even_with_equal_update_times(
    store: Store,
) -> None:
    org, other = new_org(), new_org()
    await add_org(store, org)
    await add_org(store, other)
    same_time = sorted(new_session() for _ in range(5))
    newer = new_session()
    async with store.transaction() as q:
        for session in same_time:
            await q.touch_session(org, session, 1, NOW, "key_a")
        await q.touch_session(org, newer, 1, NOW + 10, "key_b")
        await q.touch_session(other, new_session(), 1, NOW + 20, "key_a")

    seen: list[str] = []
    after = None
    async with store.reader() as q:
        while True:
            rows = await q.page_sessions(org, 2, after=after)
            seen += [s.session_id for s, _ in rows]
            if len(rows) < 2:
                break
            last = rows[-1][0]
            after = (last.updated_us, last.session_id)
        assert seen == [newer, *same_time]  # latest first, then the id ascending
        owned = await q.page_sessions(org, 10, owner="key_b")
        assert [s.session_id for s, _ in owned] == [newer]
        assert await q.page_sessions(org, 10, after=(NOW, same_time[-1])) == []


async def test_approval_pages_filter_and_tie_break_by_id_newest_first(store: Store) -> None:
    org = new_org()
    await add_org(store, org)
    approvals = []
    for n in range(5):
        effect = make_effect(org, tool_name="delete_database" if n % 2 else "publish")
        await add_effect(store, effect)
        approvals.append(make_approval(effect, created_us=NOW, requested_by_key_id="key_x"))
    async with store.transaction() as q:
        for approval in approvals:
            await q.insert_approval(approval)

    expected = sorted((a.approval_id for a in approvals), reverse=True)
    seen: list[str] = []
    after = None
    async with store.reader() as q:
        while True:
            rows = await q.page_approvals(org, 2, after=after)
            seen += [a.approval_id for a, _ in rows]
            if len(rows) < 2:
                break
            last = rows[-1][0]
            after = (last.created_us, last.approval_id)
        assert seen == expected
        deletes = await q.page_approvals(org, 10, tool="delete_database", status="pending")
        assert len(deletes) == 2
        assert {name for _, name in deletes} == {None}  # no key row with that id
        assert await q.page_approvals(org, 10, status="approved") == []
        (one,) = await q.page_approvals(org, 10, approval_id=approvals[0].approval_id)
        assert one[0] == approvals[0]
        assert await q.page_approvals(new_org(), 10) == []


def new_key(org_id: str, name: str) -> KeyRecord:
    key_id, key_hash = f"key_{uuid.uuid4().hex[:12]}", uuid.uuid4().hex
    return KeyRecord(key_id, key_hash, org_id, name, "agent", "cli", NOW, None, None)


async def test_a_listed_approval_names_its_requesting_key_of_its_own_org_only(
    store: Store,
) -> None:
    org, other = new_org(), new_org()
    await add_org(store, org)
    await add_org(store, other)
    effect, foreign = make_effect(org), make_effect(org)
    await add_effect(store, effect)
    await add_effect(store, foreign)
    async with store.transaction() as q:
        key = await q.put_api_key(new_key(org, "bot"))
        stranger = await q.put_api_key(new_key(other, "spy"))
        await q.insert_approval(make_approval(effect, requested_by_key_id=key.key_id))
        # A key id of another org never lends its name.
        await q.insert_approval(make_approval(foreign, requested_by_key_id=stranger.key_id))
    async with store.reader() as q:
        names = {a.effect_id: name for a, name in await q.page_approvals(org, 10)}
    assert names == {effect.effect_id: "bot", foreign.effect_id: None}


async def test_recent_effects_are_each_sessions_latest_steps_in_its_org(store: Store) -> None:
    org, other = new_org(), new_org()
    await add_org(store, org)
    await add_org(store, other)
    first, second = new_session(), new_session()
    for session in (first, second):
        for step in range(1, 5):
            await add_effect(store, make_effect(org, session_id=session, step_index=step))
    await add_effect(store, make_effect(other, session_id=first, step_index=9))
    async with store.reader() as q:
        recent = await q.recent_effects(org, [first, second, str(uuid.uuid4())], 2)
        assert {s: [e.step_index for e in effects] for s, effects in recent.items()} == {
            first: [4, 3],
            second: [4, 3],
        }
        assert await q.recent_effects(org, [], 2) == {}
        assert await q.recent_effects(org, [first], 0) == {}


async def test_recent_events_are_the_latest_of_the_org_or_of_an_owners_sessions(
    store: Store,
) -> None:
    org, other = new_org(), new_org()
    await add_org(store, org)
    await add_org(store, other)
    mine, theirs = new_session(), new_session()
    async with store.transaction() as q:
        await q.touch_session(org, mine, 1, NOW, "key_a")
        await q.touch_session(org, theirs, 1, NOW, "key_b")
        ids = [
            await q.insert_event(org, "effect_committed", session, None, "{}", NOW)
            for session in (mine, theirs, mine, None)
        ]
        await q.insert_event(other, "effect_committed", mine, None, "{}", NOW)
    async with store.reader() as q:
        latest = await q.recent_events(org, 3)
        assert [e.event_id for e in latest] == ids[::-1][:3]
        owned = await q.recent_events(org, 10, owner="key_a")
        assert [e.event_id for e in owned] == [ids[2], ids[0]]
        one = await q.recent_events(org, 10, session_id=theirs)
        assert [e.event_id for e in one] == [ids[1]]
        assert await q.recent_events(org, 10, owner="key_a", session_id=theirs) == []


def test_search_text_is_matched_literally_and_in_any_case() -> None:
    assert like_pattern("Send_E") == "%send!_e%"
    assert like_pattern("100%!") == "%100!%!!%"


@pytest.fixture(params=["sqlite", "postgres"])
def unmigrated_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """An empty database of each dialect (no migration applied yet)."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'old.db'}"
        return
    admin = _pg_admin_url()
    name = f"undolog_old_{uuid.uuid4().hex[:8]}"
    try:
        asyncio.run(_create_database(admin, name))
    except (TimeoutError, OSError) as exc:
        pytest.skip(f"PostgreSQL not reachable: {exc}")
    try:
        yield admin.rsplit("/", 1)[0] + "/" + name
    finally:
        asyncio.run(_drop_database(admin, name))


async def test_migration_16_gives_older_approvals_their_sessions_owner_as_requester(
    unmigrated_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    dialect = "sqlite" if unmigrated_url.startswith("sqlite") else "postgres"
    module = importlib.import_module(f"undolog.store.{dialect}")
    before = [(v, sql) for v, sql in load_migrations(dialect) if v < 16]
    monkeypatch.setattr(module, "load_migrations", lambda dialect: before)
    store = await open_store(unmigrated_url)
    try:
        assert await store.migrate() == before[-1][0]
        org = new_org()
        await add_org(store, org)
        effect = make_effect(org)
        async with store.transaction() as q:
            await q.touch_session(org, effect.session_id, 1, NOW, "key_owner")
            assert await q.insert_effect(effect)
            old = make_approval(effect)
            await q._execute(  # type: ignore[attr-defined]  # the columns before version 16
                "INSERT INTO approvals (approval_id, org_id, effect_id, session_id, tool_name, "
                "args, status, created_us, timeout_us) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                old.approval_id, org, effect.effect_id, effect.session_id, old.tool_name,
                old.args_json, old.status, old.created_us, old.timeout_us,
            )  # fmt: skip
        monkeypatch.undo()
        assert await store.migrate() >= 16
        async with store.reader() as q:
            migrated = await q.get_approval(org, old.approval_id)
        assert migrated is not None
        assert migrated.requested_by_key_id == "key_owner"
    finally:
        await store.close()
