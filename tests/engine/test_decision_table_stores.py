"""Every row of the intercept decision table (docs/architecture.md), through the engine on both
stores.

`tests/engine/test_decide.py` checks the pure `decide`; this runs the same rows end to end
through `Engine.intercept`, so the store's own new-call path (PostgreSQL's one-round-trip
function, SQLite's transaction) is held to the same table. Each row builds the existing effect
with the engine's own operations and an injected clock (lease expiry is a clock move), then
intercepts the same call again and checks the answer and what was written.
"""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import pytest

from undolog.engine import Decision, Engine, Outcome
from undolog.engine.approvals import Approvals, Verdict
from undolog.engine.saga import Saga
from undolog.store import Store
from undolog_sdk.errors import (
    ApprovalRejected,
    ApprovalTimedOut,
    EffectInDoubt,
    InProgress,
    NotFound,
    SessionClosed,
)

SECOND = 1_000_000
LEASE_S = 30
APPROVAL_TIMEOUT_S = 60
RESULT = '{"success": true, "output": {"id": 7}, "error": null}'


class Clock:
    def __init__(self) -> None:
        self.now = 1_700_000_000_000_000

    def __call__(self) -> int:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += int(seconds * SECOND)


@dataclass
class World:
    engine: Engine
    approvals: Approvals
    saga: Saga
    clock: Clock
    org_id: str
    session: str

    async def call(self, tool: str, step: int = 1) -> Decision:
        return await self.engine.intercept(
            self.org_id, self.session, tool, {"n": step}, step_index=step
        )

    async def state(self, effect_id: str) -> str:
        return (await self.engine.get_effect(self.org_id, effect_id)).state


@pytest.fixture
async def world(store: Store, org_id: str) -> World:
    clock = Clock()
    engine = Engine(store, lease_seconds=LEASE_S, retry_after_seconds=5, clock_us=clock)
    await engine.ensure_org(org_id, approval_timeout_s=APPROVAL_TIMEOUT_S)
    await engine.register_tool(org_id, "search", tier="safe")
    await engine.register_tool(org_id, "charge", tier="compensable",
                               compensation={"fn_name": "refund"})  # fmt: skip
    await engine.register_tool(org_id, "charge_again", tier="compensable",
                               compensation={"fn_name": "refund"},
                               idempotent_upstream=True)  # fmt: skip
    await engine.register_tool(org_id, "drop", tier="irreversible")
    approvals = Approvals(engine, clock_us=clock)
    saga = Saga(store, lease_seconds=LEASE_S, clock_us=clock)
    return World(engine, approvals, saga, clock, org_id, str(uuid.uuid4()))


Row = Callable[[World], Awaitable[None]]


async def none_safe(w: World) -> None:
    decision = await w.call("search")
    assert (decision.outcome, decision.logged) == (Outcome.EXECUTE, False)
    again = await w.call("search")
    assert (again.outcome, again.logged) == (Outcome.EXECUTE, False)
    assert again.effect_id != decision.effect_id  # nothing recorded: each runs freely
    with pytest.raises(NotFound):
        await w.engine.session_view(w.org_id, w.session)


async def none_compensable(w: World) -> None:
    decision = await w.call("charge")
    assert (decision.outcome, decision.attempt, decision.logged) == (Outcome.EXECUTE, 1, True)
    view = await w.engine.session_view(w.org_id, w.session)
    assert [e.state for e in view.effects] == ["executing"]
    assert [u.fn_name for u in view.undo_entries] == ["refund"]  # pushed before it runs


async def none_irreversible(w: World) -> None:
    decision = await w.call("drop")
    assert decision.outcome is Outcome.AWAITING_APPROVAL
    assert decision.approval_id is not None
    approval = await w.approvals.get(w.org_id, decision.approval_id)
    assert (approval.status, approval.effect_id) == ("pending", decision.effect_id)
    assert await w.state(decision.effect_id) == "awaiting_approval"


async def committed_replays(w: World) -> None:
    first = await w.call("charge")
    await w.engine.commit(w.org_id, first.effect_id, RESULT)
    again = await w.call("charge")
    assert (again.outcome, again.effect_id, again.result_json) == (
        Outcome.REPLAY, first.effect_id, RESULT,
    )  # fmt: skip


async def approved_and_committed_replays(w: World) -> None:
    first = await w.call("drop")
    assert first.approval_id is not None
    result = await w.approvals.decide(w.org_id, first.approval_id, Verdict.APPROVE)
    assert result.run is not None and result.run.outcome is Outcome.EXECUTE
    await w.engine.commit(w.org_id, first.effect_id, RESULT)
    again = await w.call("drop")
    assert (again.outcome, again.result_json) == (Outcome.REPLAY, RESULT)


async def awaiting_keeps_awaiting(w: World) -> None:
    first = await w.call("drop")
    again = await w.call("drop")
    assert (again.outcome, again.effect_id, again.approval_id) == (
        Outcome.AWAITING_APPROVAL, first.effect_id, first.approval_id,
    )  # fmt: skip


async def executing_live_lease_in_progress(w: World) -> None:
    first = await w.call("charge")
    w.clock.advance(LEASE_S - 1)
    with pytest.raises(InProgress) as raised:
        await w.call("charge")
    assert 1 <= raised.value.retry_after <= 5
    assert await w.state(first.effect_id) == "executing"


async def executing_expired_lease_in_doubt(w: World) -> None:
    first = await w.call("charge")
    w.clock.advance(LEASE_S + 1)
    with pytest.raises(EffectInDoubt):
        await w.call("charge")
    assert await w.state(first.effect_id) == "in_doubt"
    with pytest.raises(EffectInDoubt):  # and it stays so until an operator resolves it
        await w.call("charge")


async def executing_expired_lease_idempotent_reruns(w: World) -> None:
    first = await w.call("charge_again")
    w.clock.advance(LEASE_S + 1)
    again = await w.call("charge_again")
    assert (again.outcome, again.effect_id, again.attempt) == (
        Outcome.EXECUTE, first.effect_id, 2,
    )  # fmt: skip


async def failed_runs_again(w: World) -> None:
    first = await w.call("charge")
    await w.engine.fail(w.org_id, first.effect_id, "upstream refused")
    again = await w.call("charge")
    assert (again.outcome, again.effect_id, again.attempt) == (
        Outcome.EXECUTE, first.effect_id, 2,
    )  # fmt: skip
    assert await w.state(first.effect_id) == "executing"


async def rejected_refuses(w: World) -> None:
    first = await w.call("drop")
    assert first.approval_id is not None
    await w.approvals.decide(w.org_id, first.approval_id, Verdict.REJECT, reason="no")
    with pytest.raises(ApprovalRejected):
        await w.call("drop")
    assert await w.state(first.effect_id) == "rejected"


async def timed_out_refuses(w: World) -> None:
    first = await w.call("drop")
    w.clock.advance(APPROVAL_TIMEOUT_S + 1)
    swept = [r for r in await w.approvals.sweep() if r.approval.org_id == w.org_id]
    assert [r.approval.status for r in swept] == ["timed_out"]  # (the store is shared)
    with pytest.raises(ApprovalTimedOut):
        await w.call("drop")
    assert await w.state(first.effect_id) == "timed_out"


async def session_not_active_refuses(w: World) -> None:
    await w.call("charge")
    await w.saga.complete_session(w.org_id, w.session)
    for tool in ("charge", "drop"):
        with pytest.raises(SessionClosed):
            await w.call(tool, step=2)  # a new call of a closed session


ROWS: dict[str, Row] = {
    "none, SAFE: execute freely, nothing logged": none_safe,
    "none, COMPENSABLE: executing + undo entry": none_compensable,
    "none, IRREVERSIBLE: awaiting approval": none_irreversible,
    "committed: replay": committed_replays,
    "approved and committed: replay": approved_and_committed_replays,
    "awaiting_approval: the same approval": awaiting_keeps_awaiting,
    "executing, lease alive: in_progress": executing_live_lease_in_progress,
    "executing, lease expired: in_doubt": executing_expired_lease_in_doubt,
    "executing, lease expired, idempotent_upstream: run again": (
        executing_expired_lease_idempotent_reruns
    ),
    "failed: a new attempt": failed_runs_again,
    "rejected: approval_rejected": rejected_refuses,
    "timed_out: ApprovalTimedOut": timed_out_refuses,
    "session not active: session_closed": session_not_active_refuses,
}


@pytest.mark.parametrize("row", list(ROWS.values()), ids=list(ROWS))
async def test_the_decision_table_holds_on_this_store(world: World, row: Row) -> None:
    await row(world)
