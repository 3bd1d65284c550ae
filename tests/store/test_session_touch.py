"""A call touches its session cheaply: `updated_us` moves only when it is older than
`SESSION_TOUCH_US` (or the state changes), so most touches change no indexed column.

On every store: what `updated_us` reads after touches and new calls. On PostgreSQL: that such
a touch is a HOT update (no index entry written), counted by the transaction's own statistics
(`pg_stat_get_xact_tuples_*`, exact and immediate), on the same path the store uses.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import asyncpg
import pytest

from tests.store.contract_helpers import NOW, make_effect, new_session
from undolog.store import NewCall, Store
from undolog.store.postgres import _PostgresQueries
from undolog.store.records import SESSION_TOUCH_US

REPLAY = (("committed",), "effect_replayed", '{"stage":"replayed"}')
INTERCEPTED = ("effect_intercepted", '{"stage":"executing"}')


async def test_a_touch_moves_updated_us_only_once_it_is_older_than_the_interval(
    store: Store, org_id: str
) -> None:
    session = new_session()
    async with store.transaction() as q:
        await q.touch_session(org_id, session, 1, NOW)
        soon = await q.touch_session(org_id, session, 2, NOW + 1)
        edge = await q.touch_session(org_id, session, 3, NOW + SESSION_TOUCH_US)
        later = await q.touch_session(org_id, session, 4, NOW + SESSION_TOUCH_US + 1)
    assert (soon.last_step, soon.updated_us) == (2, NOW)
    assert (edge.last_step, edge.updated_us) == (3, NOW)
    assert (later.last_step, later.updated_us) == (4, NOW + SESSION_TOUCH_US + 1)
    assert later.created_us == NOW


async def test_a_state_change_always_moves_updated_us(store: Store, org_id: str) -> None:
    session = new_session()
    async with store.transaction() as q:
        await q.touch_session(org_id, session, 1, NOW)
        await q.update_session(org_id, session, NOW + 1, state="completed")
        closed = await q.get_session(org_id, session)
    assert closed is not None and (closed.state, closed.updated_us) == ("completed", NOW + 1)


async def test_a_step_without_a_state_change_moves_updated_us_only_once_it_is_old(
    store: Store, org_id: str
) -> None:
    """A step-less call notes its step with `update_session(last_step=...)`: a touch too."""
    session = new_session()
    async with store.transaction() as q:
        await q.touch_session(org_id, session, 1, NOW)
        await q.update_session(org_id, session, NOW + 1, last_step=2)
        soon = await q.get_session(org_id, session)
        await q.update_session(org_id, session, NOW + SESSION_TOUCH_US + 1, last_step=3)
        later = await q.get_session(org_id, session)
    assert soon is not None and (soon.last_step, soon.updated_us) == (2, NOW)
    assert later is not None and (later.last_step, later.updated_us) == (
        3,
        NOW + SESSION_TOUCH_US + 1,
    )


async def test_a_new_call_moves_updated_us_only_once_it_is_older_than_the_interval(
    store: Store, org_id: str
) -> None:
    session = new_session()
    seen = []
    for step, at in ((1, NOW), (2, NOW + 1000), (3, NOW + SESSION_TOUCH_US + 1)):
        effect = make_effect(org_id, session_id=session, step_index=step, created_us=at)
        outcome = await store.execute_new(NewCall.of(effect, None, INTERCEPTED), REPLAY)
        assert outcome == ("inserted", None)
        async with store.reader() as q:
            row = await q.get_session(org_id, session)
        assert row is not None
        seen.append((row.last_step, row.updated_us))
    assert seen == [(1, NOW), (2, NOW), (3, NOW + SESSION_TOUCH_US + 1)]


# -- PostgreSQL: a touch within the interval writes no index entry ----------------------------


@pytest.fixture
async def pg_conn(pg_url: str) -> AsyncIterator[asyncpg.Connection]:
    conn = await asyncpg.connect(pg_url)
    try:
        yield conn
    finally:
        await conn.close()


async def _session_updates(conn: asyncpg.Connection) -> tuple[int, int]:
    """(updates, of which HOT) of `sessions` in this connection's open transaction."""
    row = await conn.fetchrow(
        "SELECT pg_stat_get_xact_tuples_updated('sessions'::regclass), "
        "pg_stat_get_xact_tuples_hot_updated('sessions'::regclass)"
    )
    assert row is not None
    return int(row[0]), int(row[1])


async def test_on_postgres_a_touch_within_the_interval_is_a_hot_update(
    pg_conn: asyncpg.Connection, org_id: str
) -> None:
    session = new_session()
    async with pg_conn.transaction():
        q = _PostgresQueries(pg_conn)
        await q.touch_session(org_id, session, 1, NOW)
        await q.touch_session(org_id, session, 2, NOW + 1)
        assert await _session_updates(pg_conn) == (1, 1)
        await q.touch_session(org_id, session, 3, NOW + SESSION_TOUCH_US + 1)
        assert await _session_updates(pg_conn) == (2, 1)  # updated_us moved: indexed


async def test_on_postgres_a_new_call_within_the_interval_touches_its_session_hot(
    pg_conn: asyncpg.Connection, org_id: str
) -> None:
    session = new_session()
    async with pg_conn.transaction():
        q = _PostgresQueries(pg_conn)
        for step, at in ((1, NOW), (2, NOW + 1000), (3, NOW + 2000)):
            effect = make_effect(org_id, session_id=session, step_index=step, created_us=at)
            outcome = await q.execute_new(
                NewCall.of(effect, None, INTERCEPTED), REPLAY, None, False
            )
            assert outcome == ("inserted", None)
        assert await _session_updates(pg_conn) == (2, 2)
