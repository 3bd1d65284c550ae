"""`Store.finish_effect`, on both stores: an effect's commit or failure as a unit of work of
its own (PostgreSQL sends concurrent ones together: tests/store/test_postgres_group_commit.py).
"""

from __future__ import annotations

import orjson

from tests.store.contract_helpers import (
    COMMIT_RESULT,
    FINISHED_US,
    effect_events,
    finish,
    running_effects,
)
from undolog.store import Store

COMMITTED = "effect_committed"


async def test_a_finish_moves_the_effect_and_writes_its_event_once_committed(
    store: Store, org_id: str
) -> None:
    (effect,) = await running_effects(store, org_id, 1)
    told: list[None] = []
    store.on_events(lambda: told.append(None))
    finished = await finish(store, org_id, effect.effect_id, extra={"note": "x"})
    assert finished is not None
    assert (finished.state, finished.result_json, finished.finished_us) == (
        "committed",
        COMMIT_RESULT,
        FINISHED_US,
    )
    assert finished.lease_expires_us is None
    assert told, "event listeners are told after the commit"
    async with store.reader() as q:
        assert await q.get_effect(org_id, effect.effect_id) == finished
    [(kind, payload)] = await effect_events(store, org_id, effect.effect_id)
    assert kind == COMMITTED
    assert orjson.loads(payload) == {
        "stage": "committed", "tool_name": effect.tool_name, "attempt": 1, "note": "x",
    }  # fmt: skip


async def test_a_finish_of_an_effect_not_running_answers_none_and_writes_nothing(
    store: Store, org_id: str
) -> None:
    (effect,) = await running_effects(store, org_id, 1)
    assert await finish(store, org_id, effect.effect_id) is not None
    again = await finish(store, org_id, effect.effect_id, target="failed", error="late")
    assert again is None
    assert await finish(store, org_id, "no-such-effect") is None
    assert len(await effect_events(store, org_id, effect.effect_id)) == 1
    async with store.reader() as q:
        kept = await q.get_effect(org_id, effect.effect_id)
    assert kept is not None and kept.state == "committed"
