"""Session owners in the engine, over both stores (`undolog.engine.owners`).

A session is recorded as the key's whose call created it. An actor held to its own sessions
(an agent key) is refused another key's session on every intercept path — numbered (the
store's one-call path on PostgreSQL, the locked path on SQLite), step-less, SAFE — before
anything is read or written, so not even a replay of the other key's call comes back.
"""

from __future__ import annotations

import uuid

import pytest

from tests.engine.test_engine import Clock, events_of, setup_org
from undolog.engine import Engine, Outcome
from undolog.engine.model import ORG_WIDE, Actor
from undolog.engine.owners import Owned, ensure_visible
from undolog.store import SessionRecord, Store
from undolog_sdk.errors import Forbidden, NotFound

EMAIL = {"to": "a@example.com", "subject": "hello"}
A = Actor("key-a", own_sessions_only=True)
B = Actor("key-b", own_sessions_only=True)
ADMIN = Actor("key-admin")


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
async def engine(store: Store, org_id: str, clock: Clock) -> Engine:
    engine = Engine(store, lease_seconds=30, retry_after_seconds=5, clock_us=clock)
    await setup_org(engine, org_id)
    return engine


async def session_of(engine: Engine, org_id: str, session_id: str) -> SessionRecord | None:
    async with engine.store.reader() as q:
        return await q.get_session(org_id, session_id)


async def test_the_creating_key_owns_the_session_and_keeps_it(engine: Engine, org_id: str) -> None:
    session = str(uuid.uuid4())
    await engine.intercept(org_id, session, "send_email", EMAIL, step_index=1, actor=A)
    # An org-wide key's call in it (an admin's) does not take it over.
    await engine.intercept(org_id, session, "send_email", EMAIL, step_index=2, actor=ADMIN)
    await engine.intercept(org_id, session, "send_email", {"n": 3}, actor=ADMIN)
    record = await session_of(engine, org_id, session)
    assert record is not None and record.owner_key_id == "key-a"
    own = str(uuid.uuid4())
    await engine.intercept(org_id, own, "send_email", EMAIL, actor=ADMIN)  # step-less, new
    assert (await session_of(engine, org_id, own)).owner_key_id == "key-admin"  # type: ignore[union-attr]
    await engine.intercept(org_id, str(uuid.uuid4()), "send_email", EMAIL, step_index=1)
    assert [s.owner_key_id for s in await engine.list_sessions(org_id, actor=A)] == ["key-a"]


@pytest.mark.parametrize(
    ("tool", "step"),
    [
        ("send_email", 1),  # A's very call: a replay, were it allowed
        ("delete_database", 2),  # A's approved call: a replay of an IRREVERSIBLE one
        ("send_email", 2),
        ("send_email", None),
        ("delete_database", 3),
        ("delete_database", None),
        ("search_web", 4),  # SAFE: nothing would be written anyway
        ("search_web", None),
    ],
)
async def test_another_agent_is_refused_on_every_path_and_nothing_is_written(
    engine: Engine, org_id: str, clock: Clock, tool: str, step: int | None
) -> None:
    session = str(uuid.uuid4())
    first = await engine.intercept(org_id, session, "send_email", EMAIL, step_index=1, actor=A)
    await engine.commit(org_id, first.effect_id, '{"ok": true}')
    gated = await engine.intercept(org_id, session, "delete_database", EMAIL, step_index=2, actor=A)
    async with engine.store.transaction() as q:  # as if approved, run and committed
        await q.update_effect(org_id, gated.effect_id, state="committed", result='{"gone": 1}')
    before = await session_of(engine, org_id, session)
    events = await events_of(engine, org_id)
    clock.advance(1)
    with pytest.raises(Forbidden) as refused:
        await engine.intercept(org_id, session, tool, EMAIL, step_index=step, actor=B)
    assert refused.value.code == "forbidden" and refused.value.http_status == 403
    assert await session_of(engine, org_id, session) == before
    assert await events_of(engine, org_id) == events
    view = await engine.session_view(org_id, session)
    assert [e.effect_id for e in view.effects] == [first.effect_id, gated.effect_id]
    # A itself goes on, and replays its own calls.
    for tool_, step_ in (("send_email", 1), ("delete_database", 2)):
        again = await engine.intercept(org_id, session, tool_, EMAIL, step_index=step_, actor=A)
        assert again.outcome is Outcome.REPLAY


async def test_a_session_without_owner_is_refused_to_agents_only(
    engine: Engine, org_id: str
) -> None:
    session = str(uuid.uuid4())
    await engine.intercept(org_id, session, "send_email", EMAIL, step_index=1)  # no owner
    assert (await session_of(engine, org_id, session)).owner_key_id is None  # type: ignore[union-attr]
    with pytest.raises(Forbidden):
        await engine.intercept(org_id, session, "send_email", EMAIL, step_index=2, actor=A)
    decision = await engine.intercept(org_id, session, "send_email", EMAIL, step_index=2)
    assert decision.outcome is Outcome.EXECUTE
    assert await engine.list_sessions(org_id, actor=A) == []
    assert len(await engine.list_sessions(org_id, actor=ADMIN)) == 1
    with pytest.raises(NotFound, match=f"session '{session}' not found"):
        await ensure_visible(engine.store, org_id, Owned.SESSION, session, A)
    await ensure_visible(engine.store, org_id, Owned.SESSION, session, ORG_WIDE)


async def test_ensure_visible_hides_each_kind_of_another_keys_thing_like_a_missing_one(
    engine: Engine, org_id: str
) -> None:
    session = str(uuid.uuid4())
    run = await engine.intercept(org_id, session, "send_email", EMAIL, step_index=1, actor=A)
    wait = await engine.intercept(
        org_id, session, "delete_database", {"db": "x"}, step_index=2, actor=A
    )
    view = await engine.session_view(org_id, session)
    ids = {
        Owned.SESSION: session,
        Owned.EFFECT: run.effect_id,
        Owned.APPROVAL: wait.approval_id,
        Owned.UNDO_ENTRY: view.undo_entries[0].entry_id,
    }
    for what, id_ in ids.items():
        assert id_ is not None
        await ensure_visible(engine.store, org_id, what, id_, A)
        await ensure_visible(engine.store, org_id, what, id_, ADMIN)
        with pytest.raises(NotFound) as hidden:
            await ensure_visible(engine.store, org_id, what, id_, B)
        assert hidden.value.message == what.not_found(id_).message
        await ensure_visible(engine.store, org_id, what, str(uuid.uuid4()), B)  # missing: passes
        await ensure_visible(engine.store, "another-org", what, id_, B)  # another org's: missing
    assert ids[Owned.EFFECT] is not None
    with pytest.raises(NotFound) as missing:
        await engine.get_effect(org_id, "no-such-effect")
    assert missing.value.message == Owned.EFFECT.not_found("no-such-effect").message


@pytest.mark.parametrize("step", [2, None], ids=["numbered", "step-less"])
async def test_a_session_created_after_the_owner_precheck_is_still_refused_in_the_transaction(
    engine: Engine, org_id: str, monkeypatch: pytest.MonkeyPatch, step: int | None
) -> None:
    """The race: the pre-check read no session, then A created it. The locked path (or, on
    PostgreSQL, the one-call function) sees the owner and writes nothing."""
    session = str(uuid.uuid4())
    first = await engine.intercept(org_id, session, "send_email", EMAIL, step_index=1, actor=A)
    before = await session_of(engine, org_id, session)
    events = await events_of(engine, org_id)

    async def nothing_there(*_: object) -> tuple[bool, None]:
        return False, None

    async with engine.store.reader() as q:
        monkeypatch.setattr(type(q), "session_owner", nothing_there)
    with pytest.raises(Forbidden):
        await engine.intercept(org_id, session, "send_email", {"n": 2}, step_index=step, actor=B)
    assert await session_of(engine, org_id, session) == before
    assert await events_of(engine, org_id) == events
    view = await engine.session_view(org_id, session)
    assert [e.effect_id for e in view.effects] == [first.effect_id]
