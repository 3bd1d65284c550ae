"""PostgreSQL group commit (store/pg_group.py) of new calls (`execute_new`) and of finishes
(`finish_effect`): calls that wait for one another share one statement, one transaction, one
WAL flush; each is answered as if it were alone.

A group counts what it sends (`statements`, `calls`), so a test sees whether calls went
together without timing anything. Most tests give the groups one lane (one statement out at a
time), so which calls wait, and so go together, is known: the first goes alone and those
started behind it wait.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import replace
from typing import Any

import asyncpg
import pytest

from tests.store.contract_helpers import (
    NOW,
    effect_events,
    finish,
    make_effect,
    make_undo,
    running_effects,
)
from undolog.store import EffectRecord, NewCall, Store, open_store
from undolog.store.pg_group import LANES, CallGroup
from undolog.store.postgres import PostgresStore
from undolog_sdk.errors import Database

REPLAY = (("committed",), "effect_replayed", '{"stage":"replayed"}')
INTERCEPTED = ("effect_intercepted", '{"stage":"executing"}')
COMMITTED = "effect_committed"


@pytest.fixture
async def pg(pg_url: str) -> AsyncIterator[Store]:
    store = await open_store(pg_url)
    try:
        yield store
    finally:
        await store.close()


def _group(store: Store) -> CallGroup:
    assert isinstance(store, PostgresStore)
    return store._group


def _finishes(store: Store) -> CallGroup:
    assert isinstance(store, PostgresStore)
    return store._finishes


@pytest.fixture
def one_lane(pg: Store) -> Store:
    _group(pg).lanes = 1
    _finishes(pg).lanes = 1
    return pg


async def _queued(store: Store, count: int, group: Callable[[Store], CallGroup] = _group) -> None:
    """Wait (bounded) until `count` calls wait behind the statement that is out."""
    deadline = time.monotonic() + 10
    while len(group(store)._queue) < count:
        assert time.monotonic() < deadline, "calls never queued"
        await asyncio.sleep(0)


async def test_a_lone_call_goes_alone(pg: Store, org_id: str) -> None:
    effect = make_effect(org_id)
    assert await pg.execute_new(NewCall.of(effect, make_undo(effect), INTERCEPTED), REPLAY) == (
        "inserted",
        None,
    )
    assert (_group(pg).statements, _group(pg).calls) == (1, 1)


async def test_up_to_lanes_calls_go_alone_at_once(pg: Store, org_id: str) -> None:
    effects = [make_effect(org_id) for _ in range(LANES)]
    outcomes = await asyncio.gather(
        *(pg.execute_new(NewCall.of(e, None, INTERCEPTED), REPLAY) for e in effects)
    )
    assert outcomes == [("inserted", None)] * LANES
    assert (_group(pg).statements, _group(pg).calls) == (LANES, LANES)


async def test_calls_that_wait_for_one_another_share_a_statement_and_all_are_written(
    pg: Store, org_id: str
) -> None:
    effects = [make_effect(org_id) for _ in range(32)]
    outcomes = await asyncio.gather(
        *(pg.execute_new(NewCall.of(e, make_undo(e), INTERCEPTED), REPLAY) for e in effects)
    )
    assert outcomes == [("inserted", None)] * 32
    group = _group(pg)
    assert group.calls == 32
    assert group.statements < 32  # the first alone, the others together
    async with pg.reader() as q:
        for effect in effects:
            assert await q.get_effect(org_id, effect.effect_id) == effect
            session = await q.get_session(org_id, effect.session_id)
            assert session is not None and session.last_step == effect.step_index
            undo = await q.list_undo_entries(org_id, effect.session_id)
            assert [u.effect_id for u in undo] == [effect.effect_id]
            events = await q.list_events(org_id, session_id=effect.session_id)
            assert [(e.type, e.payload_json) for e in events] == [INTERCEPTED]


async def test_a_duplicate_in_the_same_batch_finds_the_call_before_it(
    one_lane: Store, org_id: str
) -> None:
    pg = one_lane
    first = make_effect(org_id)
    call = make_effect(org_id)
    twin = make_effect(org_id, session_id=call.session_id, call_signature=call.call_signature)
    lone = asyncio.create_task(pg.execute_new(NewCall.of(first, None, INTERCEPTED), REPLAY))
    one = asyncio.create_task(pg.execute_new(NewCall.of(call, None, INTERCEPTED), REPLAY))
    two = asyncio.create_task(pg.execute_new(NewCall.of(twin, None, INTERCEPTED), REPLAY))
    answers = await asyncio.gather(lone, one, two)
    assert (_group(pg).statements, _group(pg).calls) == (2, 3)
    assert answers[0] == ("inserted", None)
    # Whichever of the two went first is inserted; the other finds it, executing.
    outcomes = sorted(answers[1:], key=lambda a: a[0])
    assert outcomes[0][0] == "exists" and outcomes[1] == ("inserted", None)
    found = outcomes[0][1]
    assert found is not None and found.state == "executing"
    async with pg.reader() as q:
        kept = [await q.get_effect(org_id, e.effect_id) for e in (call, twin)]
    assert [k is not None for k in kept].count(True) == 1
    assert found.effect_id in {call.effect_id, twin.effect_id}


async def test_a_failing_call_fails_alone_and_its_batch_is_written(
    one_lane: Store, org_id: str
) -> None:
    pg = one_lane
    first = make_effect(org_id)
    undo = make_undo(first)
    bad = make_effect(org_id)
    bad_undo = make_undo(bad)
    # The same undo entry id twice: the second insert breaks its UNIQUE constraint.
    bad_undo = replace(bad_undo, entry_id=undo.entry_id)
    good = make_effect(org_id)
    calls = [
        pg.execute_new(NewCall.of(first, undo, INTERCEPTED), REPLAY),
        pg.execute_new(NewCall.of(bad, bad_undo, INTERCEPTED), REPLAY),
        pg.execute_new(NewCall.of(good, make_undo(good), INTERCEPTED), REPLAY),
    ]
    answers = await asyncio.gather(*calls, return_exceptions=True)
    assert answers[0] == ("inserted", None)
    assert isinstance(answers[1], Database)
    assert answers[2] == ("inserted", None)
    # first alone; bad and good together (refused: nothing written), then each alone
    assert (_group(pg).statements, _group(pg).calls) == (4, 5)
    async with pg.reader() as q:
        assert await q.get_effect(org_id, bad.effect_id) is None
        assert await q.get_session(org_id, bad.session_id) is None
        assert await q.get_effect(org_id, good.effect_id) == good


async def test_a_caller_cancelled_while_it_waits_is_left_out_and_the_others_go(
    one_lane: Store, org_id: str
) -> None:
    pg = one_lane
    first, dropped, kept = (make_effect(org_id) for _ in range(3))
    lone = asyncio.create_task(pg.execute_new(NewCall.of(first, None, INTERCEPTED), REPLAY))
    await _queued(pg, 0)
    gone = asyncio.create_task(pg.execute_new(NewCall.of(dropped, None, INTERCEPTED), REPLAY))
    stays = asyncio.create_task(pg.execute_new(NewCall.of(kept, None, INTERCEPTED), REPLAY))
    await _queued(pg, 2)
    gone.cancel()
    assert await lone == ("inserted", None)
    assert await stays == ("inserted", None)
    with pytest.raises(asyncio.CancelledError):
        await gone
    async with pg.reader() as q:
        assert await q.get_effect(org_id, dropped.effect_id) is None
        assert await q.get_effect(org_id, kept.effect_id) == kept
    # The next lone call goes alone again: nothing was stranded.
    again = make_effect(org_id)
    before = _group(pg).statements
    assert await pg.execute_new(NewCall.of(again, None, INTERCEPTED), REPLAY) == ("inserted", None)
    assert _group(pg).statements == before + 1


# Finishes.


async def test_a_lone_finish_goes_alone(pg: Store, org_id: str) -> None:
    (effect,) = await running_effects(pg, org_id, 1)
    assert await finish(pg, org_id, effect.effect_id) is not None
    assert (_finishes(pg).statements, _finishes(pg).calls) == (1, 1)


async def test_finishes_that_wait_for_one_another_share_a_statement_and_all_are_written(
    pg: Store, org_id: str
) -> None:
    effects = await running_effects(pg, org_id, 32)
    finished = await asyncio.gather(*(finish(pg, org_id, e.effect_id) for e in effects))
    group = _finishes(pg)
    assert group.calls == 32
    assert group.statements < 32  # the first ones alone, the others together
    for effect, done in zip(effects, finished, strict=True):
        assert done is not None and done.effect_id == effect.effect_id
        assert done.state == "committed"
        async with pg.reader() as q:
            assert await q.get_effect(org_id, effect.effect_id) == done
        assert [kind for kind, _ in await effect_events(pg, org_id, effect.effect_id)] == [
            COMMITTED
        ]


async def test_a_finish_that_cannot_finish_answers_none_alone_in_its_batch(
    one_lane: Store, org_id: str
) -> None:
    pg = one_lane
    first, running, done, later = await running_effects(pg, org_id, 4)
    assert await finish(pg, org_id, done.effect_id) is not None
    statements = _finishes(pg).statements
    answers = await asyncio.gather(
        finish(pg, org_id, first.effect_id),
        finish(pg, org_id, running.effect_id),
        finish(pg, org_id, done.effect_id, target="failed", error="again"),
        finish(pg, org_id, "no-such-effect"),
        finish(pg, org_id, later.effect_id),
    )
    # first alone; the four behind it in one statement
    assert _finishes(pg).statements - statements == 2
    assert [a is None for a in answers] == [False, False, True, True, False]
    async with pg.reader() as q:
        kept = await q.get_effect(org_id, done.effect_id)
    assert kept is not None and kept.state == "committed" and kept.error is None
    assert len(await effect_events(pg, org_id, done.effect_id)) == 1


async def test_a_second_finish_of_an_effect_in_the_same_batch_answers_none(
    one_lane: Store, org_id: str
) -> None:
    pg = one_lane
    first, effect = await running_effects(pg, org_id, 2)
    answers = await asyncio.gather(
        finish(pg, org_id, first.effect_id),
        finish(pg, org_id, effect.effect_id),
        finish(pg, org_id, effect.effect_id, target="failed", result_json=None, error="no"),
    )
    assert (_finishes(pg).statements, _finishes(pg).calls) == (2, 3)
    won = [a for a in answers[1:] if a is not None]
    assert len(won) == 1  # whichever went first; the other found it finished
    async with pg.reader() as q:
        assert await q.get_effect(org_id, effect.effect_id) == won[0]
    assert len(await effect_events(pg, org_id, effect.effect_id)) == 1


async def test_a_failing_finish_fails_alone_and_its_batch_is_written(
    one_lane: Store, org_id: str
) -> None:
    pg = one_lane
    first, bad, good = await running_effects(pg, org_id, 3)
    answers = await asyncio.gather(
        finish(pg, org_id, first.effect_id),
        # PostgreSQL refuses a NUL in JSON text: the statement carrying it fails.
        finish(pg, org_id, bad.effect_id, extra={"error": "nul\x00"}),
        finish(pg, org_id, good.effect_id),
        return_exceptions=True,
    )
    assert isinstance(answers[0], EffectRecord)
    assert isinstance(answers[1], Database)
    assert isinstance(answers[2], EffectRecord) and answers[2].state == "committed"
    # first alone; bad and good together (refused: nothing written), then each alone
    assert (_finishes(pg).statements, _finishes(pg).calls) == (4, 5)
    async with pg.reader() as q:
        kept = await q.get_effect(org_id, bad.effect_id)
    assert kept is not None and kept.state == "executing"
    assert await effect_events(pg, org_id, bad.effect_id) == []
    assert len(await effect_events(pg, org_id, good.effect_id)) == 1


async def test_a_finish_cancelled_while_it_waits_is_left_out_and_the_others_go(
    one_lane: Store, org_id: str
) -> None:
    pg = one_lane
    first, dropped, kept = await running_effects(pg, org_id, 3)
    lone = asyncio.create_task(finish(pg, org_id, first.effect_id))
    await _queued(pg, 0, _finishes)
    gone = asyncio.create_task(finish(pg, org_id, dropped.effect_id))
    stays = asyncio.create_task(finish(pg, org_id, kept.effect_id))
    await _queued(pg, 2, _finishes)
    gone.cancel()
    assert await lone is not None
    assert await stays is not None
    with pytest.raises(asyncio.CancelledError):
        await gone
    async with pg.reader() as q:
        left = await q.get_effect(org_id, dropped.effect_id)
    assert left is not None and left.state == "executing"
    assert await effect_events(pg, org_id, dropped.effect_id) == []
    # The next lone finish goes alone again: nothing was stranded.
    before = _finishes(pg).statements
    assert await finish(pg, org_id, dropped.effect_id) is not None
    assert _finishes(pg).statements == before + 1


@asynccontextmanager
async def _row_held(
    pg_url: str, sql: str, *args: Any
) -> AsyncIterator[Callable[[], Awaitable[None]]]:
    """Another transaction holds a row (`sql` locks it) while the block runs; it yields a
    function that waits (bounded) for the backend blocked on that row and terminates it."""
    holder = await asyncpg.connect(pg_url)
    try:
        async with holder.transaction():
            await holder.execute(sql, *args)

            async def terminate_blocked() -> None:
                deadline = time.monotonic() + 10
                while True:
                    pid = await holder.fetchval(
                        "SELECT pid FROM pg_stat_activity "
                        "WHERE pg_backend_pid() = ANY (pg_blocking_pids(pid))"
                    )
                    if pid is not None:
                        break
                    assert time.monotonic() < deadline, "nothing waited on the row"
                    await asyncio.sleep(0.01)
                assert await holder.fetchval("SELECT pg_terminate_backend($1)", pid)

            yield terminate_blocked
    finally:
        await holder.close()


async def test_a_batch_of_new_calls_whose_backend_is_terminated_is_not_sent_again(
    one_lane: Store, pg_url: str, org_id: str
) -> None:
    pg = one_lane
    first, blocked, other = (make_effect(org_id) for _ in range(3))
    async with pg.transaction() as q:
        await q.touch_session(org_id, blocked.session_id, 0, NOW)
    lock = "SELECT 1 FROM sessions WHERE session_id = $1 FOR UPDATE"
    async with _row_held(pg_url, lock, blocked.session_id) as terminate_blocked:
        answers = asyncio.gather(
            *(
                pg.execute_new(NewCall.of(e, None, INTERCEPTED), REPLAY)
                for e in (first, blocked, other)
            ),
            return_exceptions=True,
        )
        await terminate_blocked()
        results = await answers
    assert results[0] == ("inserted", None)
    assert isinstance(results[1], Database) and isinstance(results[2], Database)
    assert (_group(pg).statements, _group(pg).calls) == (2, 3)  # the batch went once
    async with pg.reader() as q:
        assert await q.get_effect(org_id, blocked.effect_id) is None
        assert await q.get_effect(org_id, other.effect_id) is None


async def test_a_batch_of_finishes_whose_backend_is_terminated_is_not_sent_again(
    one_lane: Store, pg_url: str, org_id: str
) -> None:
    pg = one_lane
    first, blocked, other = await running_effects(pg, org_id, 3)
    lock = "SELECT 1 FROM effects WHERE effect_id = $1 FOR UPDATE"
    async with _row_held(pg_url, lock, blocked.effect_id) as terminate_blocked:
        answers = asyncio.gather(
            *(finish(pg, org_id, e.effect_id) for e in (first, blocked, other)),
            return_exceptions=True,
        )
        await terminate_blocked()
        results = await answers
    assert isinstance(results[0], EffectRecord)
    assert isinstance(results[1], Database) and isinstance(results[2], Database)
    assert (_finishes(pg).statements, _finishes(pg).calls) == (2, 3)  # the batch went once
    async with pg.reader() as q:
        for effect in (blocked, other):
            current = await q.get_effect(org_id, effect.effect_id)
            assert current is not None and current.state == "executing"
