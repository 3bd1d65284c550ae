"""`Deliveries`: marking sent answers, holding back calls meanwhile, and a store that is down.

The HTTP side (a client that hangs up, one that repeats at once) is in test_stepless_delivery.py
and tests/mcp/test_delivery.py; these drive the component itself over a real store.
"""

from __future__ import annotations

import asyncio
import uuid

import pytest

from undolog.engine import Engine, Outcome
from undolog.services.delivery import Deliveries
from undolog.store import Store, open_store

ARGS = {"to": "ada@example.com"}


async def _engine(store: Store, org_id: str) -> Engine:
    engine = Engine(store)
    await engine.ensure_org(org_id)
    await engine.register_tool(
        org_id, "send_email", tier="compensable", compensation={"fn_name": "undo_send_email"}
    )
    return engine


async def _committed_call(engine: Engine, org_id: str, session: str) -> str:
    decision = await engine.intercept(org_id, session, "send_email", ARGS)
    await engine.commit(org_id, decision.effect_id, '{"success":true}')
    return decision.effect_id


async def test_a_sent_answer_is_marked_so_the_same_call_is_new(store: Store, org_id: str) -> None:
    engine = await _engine(store, org_id)
    deliveries = Deliveries(engine)
    session = str(uuid.uuid4())
    effect_id = await _committed_call(engine, org_id, session)
    await deliveries.finish([deliveries.begin(org_id, session, effect_id)], sent=True)
    again = await engine.intercept(org_id, session, "send_email", ARGS)
    assert (again.outcome, again.step_index) == (Outcome.EXECUTE, 2)


async def test_a_lost_answer_is_not_marked_so_the_same_call_replays(
    store: Store, org_id: str
) -> None:
    engine = await _engine(store, org_id)
    deliveries = Deliveries(engine)
    session = str(uuid.uuid4())
    effect_id = await _committed_call(engine, org_id, session)
    await deliveries.finish([deliveries.begin(org_id, session, effect_id)], sent=False)
    again = await engine.intercept(org_id, session, "send_email", ARGS)
    assert (again.outcome, again.effect_id) == (Outcome.REPLAY, effect_id)


async def test_a_call_of_the_session_waits_until_the_answer_being_sent_is_marked(
    store: Store, org_id: str
) -> None:
    engine = await _engine(store, org_id)
    deliveries = Deliveries(engine)
    session, other = str(uuid.uuid4()), str(uuid.uuid4())
    effect_id = await _committed_call(engine, org_id, session)
    sending = deliveries.begin(org_id, session, effect_id)

    waiting = asyncio.create_task(deliveries.settle(org_id, session))
    await deliveries.settle(org_id, other)  # another session is not held back
    await asyncio.sleep(0)  # let the waiter run up to its wait (a yield, not a timed wait)
    assert not waiting.done()
    await deliveries.finish([sending], sent=True)
    await asyncio.wait_for(waiting, 10)
    again = await engine.intercept(org_id, session, "send_email", ARGS)
    assert again.step_index == 2


@pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)
async def test_a_store_that_is_down_loses_the_mark_not_the_session(
    store_url: str, org_id: str
) -> None:
    """The mark cannot be written: nothing raises, calls go on, and the answer stays owed."""
    store = await open_store(store_url)
    await store.migrate()
    engine = await _engine(store, org_id)
    session = str(uuid.uuid4())
    effect_id = await _committed_call(engine, org_id, session)
    await store.close()  # the store goes away while the answer is being sent

    deliveries = Deliveries(engine)
    await deliveries.finish([deliveries.begin(org_id, session, effect_id)], sent=True)
    await asyncio.wait_for(deliveries.settle(org_id, session), 10)  # not held back

    reopened = await open_store(store_url)
    try:
        engine = await _engine(reopened, org_id)
        again = await engine.intercept(org_id, session, "send_email", ARGS)
    finally:
        await reopened.close()
    # Unmarked, the same call is still a retry: it gets the result, it does not run again.
    assert (again.outcome, again.effect_id) == (Outcome.REPLAY, effect_id)
