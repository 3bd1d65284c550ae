"""The one operation for "record a new call" (`Store.execute_new`), on every store.

PostgreSQL does it in one round trip (its `undolog_execute_new` function), SQLite in its own
`BEGIN IMMEDIATE` transaction; the engine calls it the same way on both. A store may answer a
replayable effect with "replayed" (and write the replay event) or with "exists" (the engine
replays it); everything else answers the same on both. The lock-busy case is PostgreSQL's
alone (tests/store/test_postgres_locking.py).
"""

from __future__ import annotations

import pytest

from tests.store.contract_helpers import make_effect, make_undo
from undolog.store import EffectRecord, NewCall, Store
from undolog.store.protocol import NewRecords

REPLAY = (("committed",), "effect_replayed", '{"stage":"replayed"}')
INTERCEPTED = ("effect_intercepted", '{"stage":"executing"}')


async def test_a_new_call_is_inserted_with_its_undo_entry_event_and_session(
    store: Store, org_id: str
) -> None:
    effect = make_effect(org_id)
    outcome = await store.execute_new(
        NewCall.of(effect, make_undo(effect), INTERCEPTED), REPLAY, owner="key-a"
    )
    assert outcome == ("inserted", None)
    async with store.reader() as q:
        session = await q.get_session(org_id, effect.session_id)
        undo = await q.list_undo_entries(org_id, effect.session_id)
        events = await q.list_events(org_id, session_id=effect.session_id)
        assert await q.get_effect(org_id, effect.effect_id) == effect
    assert session is not None
    assert (session.state, session.last_step, session.owner_key_id) == (
        "active",
        effect.step_index,
        "key-a",
    )
    assert [u.effect_id for u in undo] == [effect.effect_id]
    assert [(e.type, e.payload_json) for e in events] == [INTERCEPTED]


async def test_a_taken_signature_hands_back_its_row_and_writes_nothing(
    store: Store, org_id: str
) -> None:
    effect = make_effect(org_id)
    assert await store.execute_new(NewCall.of(effect, None, INTERCEPTED), REPLAY) == (
        "inserted",
        None,
    )
    again = make_effect(org_id, session_id=effect.session_id, call_signature=effect.call_signature)
    assert await store.execute_new(NewCall.of(again, None, INTERCEPTED), REPLAY) == (
        "exists",
        effect,
    )
    async with store.reader() as q:
        assert await q.get_effect(org_id, again.effect_id) is None
        events = await q.list_events(org_id, session_id=effect.session_id)
    assert [e.type for e in events] == ["effect_intercepted"]


async def test_a_replayable_row_is_handed_back_as_a_replay_or_to_replay(
    store: Store, org_id: str
) -> None:
    effect = make_effect(org_id)
    await store.execute_new(NewCall.of(effect, None, INTERCEPTED), REPLAY)
    async with store.transaction() as q:
        await q.update_effect(org_id, effect.effect_id, state="committed", result='{"ok":1}')
    again = make_effect(org_id, session_id=effect.session_id, call_signature=effect.call_signature)
    outcome, row = await store.execute_new(NewCall.of(again, None, INTERCEPTED), REPLAY)
    assert outcome in ("replayed", "exists")
    assert row is not None and (row.effect_id, row.result_json) == (effect.effect_id, '{"ok":1}')
    async with store.reader() as q:
        assert await q.get_effect(org_id, again.effect_id) is None


async def test_nothing_is_inserted_in_a_session_that_is_not_active(
    store: Store, org_id: str
) -> None:
    effect = make_effect(org_id)
    async with store.transaction() as q:
        await q.touch_session(org_id, effect.session_id, 0, effect.created_us)
        await q.update_session(org_id, effect.session_id, effect.created_us, state="completed")
    assert await store.execute_new(NewCall.of(effect, None, INTERCEPTED), REPLAY) == (
        "closed",
        None,
    )
    async with store.reader() as q:
        assert await q.get_effect(org_id, effect.effect_id) is None
        assert await q.list_events(org_id, session_id=effect.session_id) == []


@pytest.mark.parametrize("replayable", [False, True], ids=["new", "replay"])
async def test_another_keys_session_is_refused_before_anything_is_read_or_written(
    store: Store, org_id: str, replayable: bool
) -> None:
    effect = make_effect(org_id)
    mine = await store.execute_new(
        NewCall.of(effect, None, INTERCEPTED), REPLAY, owner="a", owner_only=True
    )
    assert mine == ("inserted", None)
    async with store.transaction() as q:
        if replayable:
            await q.update_effect(org_id, effect.effect_id, state="committed", result="{}")
        before = await q.get_session(org_id, effect.session_id)
    theirs = (
        make_effect(org_id, session_id=effect.session_id, call_signature=effect.call_signature)
        if replayable
        else make_effect(org_id, session_id=effect.session_id)
    )
    refused = await store.execute_new(
        NewCall.of(theirs, None, INTERCEPTED), REPLAY, owner="b", owner_only=True
    )
    assert refused == ("forbidden", None)
    async with store.reader() as q:
        assert await q.get_session(org_id, effect.session_id) == before
        assert await q.get_effect(org_id, theirs.effect_id) is None
        events = await q.list_events(org_id, session_id=effect.session_id)
    assert [e.type for e in events] == ["effect_intercepted"]


async def test_records_are_built_only_when_written_and_never_for_a_taken_signature_on_sqlite(
    store: Store, org_id: str
) -> None:
    """A replay must not pay for the effect, undo entry and event of a call it does not make
    (issue 12): SQLite reads first and builds nothing on a hit; PostgreSQL sends the records
    with its one round trip, so it builds them once."""
    builds: list[str] = []

    def lazily(effect: EffectRecord) -> NewCall:
        def records() -> NewRecords:
            builds.append(effect.effect_id)
            return effect, None, INTERCEPTED

        return NewCall(effect.org_id, effect.session_id, effect.call_signature, records)

    effect = make_effect(org_id)
    assert await store.execute_new(lazily(effect), REPLAY) == ("inserted", None)
    assert builds == [effect.effect_id]
    again = make_effect(org_id, session_id=effect.session_id, call_signature=effect.call_signature)
    assert await store.execute_new(lazily(again), REPLAY) == ("exists", effect)
    expected = [] if store.dialect == "sqlite" else [again.effect_id]
    assert builds[1:] == expected
