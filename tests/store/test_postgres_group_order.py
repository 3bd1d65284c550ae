"""Batches of new calls and of finishes from several processes on one PostgreSQL do not
deadlock.

Each `PostgresStore` is what one proxy process has: its own pool and its own group
(store/pg_group.py). Here two of them, each held to one lane so that nearly every call goes
in a batch, write calls over the same few sessions at once, the same calls included (a
retry that reached another process), then finish them all, each effect from both at once.
A batch of new calls locks its session rows in (org, session, signature) order, and one of
finishes its effect rows in (org, effect) order, so two batches never wait for each other in
a cycle. A deadlock would not
fail a call (the server aborts one batch, which is then sent again one call at a time), so
the test reads PostgreSQL's own count of deadlocks in the database.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Iterator

import asyncpg
import pytest

from tests.conftest import fresh_pg_database
from tests.store.contract_helpers import NOW, make_effect, make_undo, new_session
from undolog.store import EffectRecord, Finish, NewCall, Store, open_store
from undolog.store.postgres import PostgresStore

REPLAY = (("committed",), "effect_replayed", '{"stage":"replayed"}')
INTERCEPTED = ("effect_intercepted", '{"stage":"executing"}')

pytestmark = pytest.mark.postgres

ROUNDS, CALLS = 20, 48


@pytest.fixture
def own_pg_url() -> Iterator[str]:
    """A database nobody else uses meanwhile: its deadlock count is this test's."""
    with fresh_pg_database("order") as url:
        yield url


async def _deadlocks(url: str) -> int:
    """The database's deadlock count, once no other backend is connected to it (a backend
    reports its counts when it exits)."""
    conn = await asyncpg.connect(url)
    try:
        deadline = time.monotonic() + 30
        while await conn.fetchval(
            "SELECT count(*) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid()"
        ):
            assert time.monotonic() < deadline, "the stores' backends never went away"
            await asyncio.sleep(0.05)
        await conn.execute("SELECT pg_stat_clear_snapshot()")
        count = await conn.fetchval(
            "SELECT deadlocks FROM pg_stat_database WHERE datname = current_database()"
        )
    finally:
        await conn.close()
    return int(count)


async def _finish(store: Store, org_id: str, effect_id: str) -> EffectRecord | None:
    result = '{"success":true,"output":null,"error":null}'
    return await store.finish_effect(
        Finish(org_id, effect_id, "committed", result, None, NOW, "effect_committed")
    )


async def test_batches_of_two_processes_over_the_same_sessions_never_deadlock(
    own_pg_url: str, org_id: str
) -> None:
    pg_url = own_pg_url
    before = await _deadlocks(pg_url)
    stores = [await open_store(pg_url) for _ in range(2)]
    try:
        for store in stores:
            assert isinstance(store, PostgresStore)
            store._group.lanes = 1  # one statement out: the others wait and go together
            store._finishes.lanes = 1
        sessions = [new_session() for _ in range(4)]
        rng = random.Random(7)
        answers = []
        finishes = []
        for _ in range(ROUNDS):
            calls = []
            for _ in range(CALLS):
                effect = make_effect(org_id, session_id=rng.choice(sessions))
                calls.append(NewCall.of(effect, make_undo(effect), INTERCEPTED))
            # Every call from both processes, each in its own order: the same call twice at
            # once, and batches that hold the sessions in every mix.
            work = [
                store.execute_new(call, REPLAY)
                for store in stores
                for call in rng.sample(calls, len(calls))
            ]
            answers += await asyncio.gather(*work)
            finishes += await asyncio.gather(
                *(
                    _finish(store, org_id, call.records()[0].effect_id)
                    for store in stores
                    for call in rng.sample(calls, len(calls))
                )
            )
        groups = [
            group
            for store in stores
            if isinstance(store, PostgresStore)
            for group in (store._group, store._finishes)
        ]
    finally:
        for store in stores:
            await store.close()

    assert await _deadlocks(pg_url) == before
    # No batch was refused and sent again call by call: each call went once.
    assert sum(g.calls for g in groups) == 4 * ROUNDS * CALLS
    assert sum(g.statements for g in groups) < 2 * ROUNDS * CALLS  # they did go in batches
    outcomes = [outcome for outcome, _ in answers]
    assert outcomes.count("inserted") == ROUNDS * CALLS  # each call written once
    # Its twin from the other process found it, written ("exists") or still being written
    # ("busy": the engine then takes the call's full path).
    assert outcomes.count("exists") + outcomes.count("busy") == ROUNDS * CALLS
    # Each effect finished once; its twin finish found it finished.
    finished = [f for f in finishes if f is not None]
    assert len(finished) == ROUNDS * CALLS
    assert len({f.effect_id for f in finished}) == ROUNDS * CALLS
