"""Approval decisions and the timeout sweep (`undolog.engine.approvals`) over both stores.

Time is an injected clock (`clock_us=`), so a deadline passes by moving the clock, never by
waiting. The sweep looks at every org of the store: each test's clock starts further in the
past than the previous one's, so no test sweeps the approvals another test left behind.
"""

from __future__ import annotations

import asyncio
import itertools
import uuid
from collections.abc import AsyncIterator

import pytest

from undolog.engine import Decision, Engine, Outcome
from undolog.engine.approvals import (
    Approvals,
    DecisionResult,
    ResolvedByPolicy,
    Verdict,
)
from undolog.store import ApprovalRecord, EventRecord, Store, open_store
from undolog_sdk.errors import (
    ApprovalAlreadyResolved,
    ApprovalRejected,
    ApprovalTimedOut,
    InProgress,
    InvalidRequest,
    NotFound,
    SessionClosed,
)

SECOND = 1_000_000
TIMEOUT_S = 90
_EPOCHS = itertools.count()


class Clock:
    """A clock that moves only when told to, starting further back for every test."""

    def __init__(self) -> None:
        self.now = 1_000_000_000 * SECOND - next(_EPOCHS) * 86_400 * SECOND

    def __call__(self) -> int:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += int(seconds * SECOND)


@pytest.fixture
def clock() -> Clock:
    return Clock()


async def make_engine(store: Store, clock: Clock) -> Engine:
    return Engine(store, lease_seconds=30, retry_after_seconds=5, clock_us=clock)


@pytest.fixture
async def engine(store: Store, clock: Clock, org_id: str) -> Engine:
    engine = await make_engine(store, clock)
    await setup_org(engine, org_id)
    return engine


async def setup_org(engine: Engine, org_id: str, *, auto_approve: bool = False) -> None:
    await engine.ensure_org(
        org_id, approval_timeout_s=TIMEOUT_S, auto_approve_on_timeout=auto_approve
    )
    await engine.register_tool(org_id, "delete_database", tier="irreversible")


@pytest.fixture
def approvals(engine: Engine, clock: Clock) -> Approvals:
    return Approvals(engine, clock_us=clock)


def new_session() -> str:
    return str(uuid.uuid4())


async def ask(
    engine: Engine, org_id: str, session: str, *, step: int = 1, db: str = "prod",
    mode: str = "proxy",
) -> Decision:  # fmt: skip
    return await engine.intercept(
        org_id, session, "delete_database", {"db": db}, step_index=step, mode=mode
    )


async def pending(
    engine: Engine, org_id: str, session: str | None = None, *, step: int = 1, mode: str = "proxy"
) -> tuple[str, str, str]:
    """An IRREVERSIBLE call awaiting approval: (session, approval id, effect id)."""
    session = session or new_session()
    decision = await ask(engine, org_id, session, step=step, db=f"db-{step}", mode=mode)
    assert decision.outcome is Outcome.AWAITING_APPROVAL
    assert decision.approval_id is not None
    return session, decision.approval_id, decision.effect_id


async def approval_of(engine: Engine, org_id: str, approval_id: str) -> ApprovalRecord:
    async with engine.store.reader() as q:
        record = await q.get_approval(org_id, approval_id)
    assert record is not None
    return record


async def events_of(engine: Engine, org_id: str) -> list[EventRecord]:
    async with engine.store.reader() as q:
        return await q.list_events(org_id)


def mine(results: list[DecisionResult], org_id: str) -> list[DecisionResult]:
    return [r for r in results if r.approval.org_id == org_id]


# --- approve -------------------------------------------------------------------------------


async def test_approving_a_proxy_call_hands_back_the_run_and_moves_it_to_executing(
    engine: Engine, approvals: Approvals, clock: Clock, org_id: str
) -> None:
    _, approval_id, effect_id = await pending(engine, org_id)
    clock.advance(5)
    result = await approvals.decide(
        org_id, approval_id, Verdict.APPROVE, reason="looks fine", decided_by="ana (org)"
    )
    assert result.run is not None
    assert (result.run.outcome, result.run.effect_id, result.run.attempt) == (
        Outcome.EXECUTE, effect_id, 1,
    )  # fmt: skip
    assert result.effect.state == "executing"
    record = await approval_of(engine, org_id, approval_id)
    assert (record.status, record.reason, record.decided_by, record.decided_us) == (
        "approved", "looks fine", "ana (org)", clock.now,
    )  # fmt: skip
    types = [e.type for e in await events_of(engine, org_id)]
    assert types == ["approval_required", "approval_approved", "effect_intercepted"]


async def test_approving_an_sdk_call_leaves_the_run_to_the_agents_retry(
    engine: Engine, approvals: Approvals, org_id: str
) -> None:
    session, approval_id, effect_id = await pending(engine, org_id, mode="sdk")
    result = await approvals.decide(org_id, approval_id, Verdict.APPROVE)
    assert result.run is None
    assert result.effect.state == "awaiting_approval"
    retry = await ask(engine, org_id, session, db="db-1", mode="sdk")
    assert (retry.outcome, retry.effect_id) == (Outcome.EXECUTE, effect_id)


async def test_approving_a_call_of_a_closed_session_is_refused(
    engine: Engine, approvals: Approvals, org_id: str
) -> None:
    session, first, _ = await pending(engine, org_id, step=1)
    _, second, _ = await pending(engine, org_id, session, step=2)
    await approvals.decide(org_id, first, Verdict.REJECT)  # halts the session
    with pytest.raises(SessionClosed):
        await approvals.decide(org_id, second, Verdict.APPROVE)
    assert (await approval_of(engine, org_id, second)).status == "pending"


# --- reject --------------------------------------------------------------------------------


async def test_rejecting_halts_the_session_and_refuses_the_retry_with_the_reason(
    engine: Engine, approvals: Approvals, org_id: str
) -> None:
    session, approval_id, effect_id = await pending(engine, org_id)
    result = await approvals.decide(org_id, approval_id, Verdict.REJECT, reason="no")
    assert (result.approval.status, result.effect.state, result.run) == (
        "rejected", "rejected", None,
    )  # fmt: skip
    view = await engine.session_view(org_id, session)
    assert view.session.state == "halted"
    with pytest.raises(ApprovalRejected) as refused:
        await ask(engine, org_id, session, db="db-1")
    assert (refused.value.approval_id, refused.value.reason) == (approval_id, "no")
    (event,) = [e for e in await events_of(engine, org_id) if e.type == "approval_rejected"]
    assert event.effect_id == effect_id


# --- one decision --------------------------------------------------------------------------


@pytest.mark.parametrize("first", list(Verdict))
@pytest.mark.parametrize("second", list(Verdict))
async def test_a_second_decision_is_already_resolved(
    engine: Engine, approvals: Approvals, org_id: str, first: Verdict, second: Verdict
) -> None:
    _, approval_id, _ = await pending(engine, org_id)
    await approvals.decide(org_id, approval_id, first)
    with pytest.raises(ApprovalAlreadyResolved) as again:
        await approvals.decide(org_id, approval_id, second)
    assert again.value.approval_id == approval_id
    assert not isinstance(again.value, ResolvedByPolicy)


@pytest.fixture
async def second_store(store_url: str) -> AsyncIterator[Store]:
    """Another connection to the same database, as a second proxy process would have."""
    other = await open_store(store_url)
    try:
        yield other
    finally:
        await other.close()


@pytest.mark.parametrize("verdicts", [(Verdict.APPROVE, Verdict.APPROVE),
                                      (Verdict.APPROVE, Verdict.REJECT)], ids=str)  # fmt: skip
async def test_of_two_decisions_at_once_through_two_stores_exactly_one_wins(
    engine: Engine,
    approvals: Approvals,
    second_store: Store,
    clock: Clock,
    org_id: str,
    verdicts: tuple[Verdict, Verdict],
) -> None:
    other = Approvals(await make_engine(second_store, clock), clock_us=clock)
    for round_ in range(6):  # a session each: a winning rejection halts its session
        _, approval_id, _ = await pending(engine, org_id)
        racers = [approvals.decide(org_id, approval_id, verdicts[0]),
                  other.decide(org_id, approval_id, verdicts[1])]  # fmt: skip
        if round_ % 2:
            racers.reverse()
        outcomes = await asyncio.gather(*racers, return_exceptions=True)
        won = [o for o in outcomes if isinstance(o, DecisionResult)]
        lost = [o for o in outcomes if isinstance(o, ApprovalAlreadyResolved)]
        assert (len(won), len(lost)) == (1, 1), outcomes
        assert sum(1 for o in won if o.run is not None) <= 1
        record = await approval_of(engine, org_id, approval_id)
        assert record.status == won[0].approval.status
        decided = [e for e in await events_of(engine, org_id)
                   if e.payload_json.find(approval_id) >= 0 and e.type != "approval_required"
                   and e.type.startswith("approval_")]  # fmt: skip
        assert len(decided) == 1


# --- lookups -------------------------------------------------------------------------------


async def test_an_approval_of_another_org_is_not_found(
    engine: Engine, approvals: Approvals, org_id: str
) -> None:
    _, approval_id, _ = await pending(engine, org_id)
    other_org = f"org-{uuid.uuid4().hex[:12]}"
    await setup_org(engine, other_org)
    with pytest.raises(NotFound):
        await approvals.decide(other_org, approval_id, Verdict.APPROVE)
    with pytest.raises(NotFound):
        await approvals.get(other_org, approval_id)
    assert await approvals.list_approvals(other_org) == []
    assert (await approval_of(engine, org_id, approval_id)).status == "pending"


async def test_listing_is_newest_first_with_the_id_breaking_ties(
    engine: Engine, approvals: Approvals, clock: Clock, org_id: str
) -> None:
    session = new_session()
    same_moment = [(await pending(engine, org_id, session, step=s))[1] for s in (1, 2, 3)]
    clock.advance(1)
    newest = (await pending(engine, org_id, session, step=4))[1]
    listed = [a.approval_id for a in await approvals.list_approvals(org_id)]
    assert listed == [newest, *sorted(same_moment, reverse=True)]
    assert [a.approval_id for a in await approvals.list_approvals(org_id, limit=2)] == listed[:2]


@pytest.mark.parametrize("status", ["maybe", "", "Pending"])
async def test_listing_an_unknown_status_is_invalid(
    approvals: Approvals, org_id: str, status: str
) -> None:
    with pytest.raises(InvalidRequest):
        await approvals.list_approvals(org_id, status)


async def test_a_reason_too_long_is_invalid_and_decides_nothing(
    engine: Engine, approvals: Approvals, org_id: str
) -> None:
    _, approval_id, _ = await pending(engine, org_id)
    with pytest.raises(InvalidRequest):
        await approvals.decide(org_id, approval_id, Verdict.REJECT, reason="x" * 2001)
    assert (await approval_of(engine, org_id, approval_id)).status == "pending"


async def test_a_nul_in_a_reason_is_stored_as_a_replacement_character(
    engine: Engine, approvals: Approvals, org_id: str
) -> None:
    _, approval_id, _ = await pending(engine, org_id)
    await approvals.decide(org_id, approval_id, Verdict.REJECT, reason="a\x00b")
    assert (await approval_of(engine, org_id, approval_id)).reason == "a\ufffdb"


# --- the sweep -----------------------------------------------------------------------------


async def test_the_sweep_times_out_an_expired_approval_once(
    engine: Engine, approvals: Approvals, clock: Clock, org_id: str
) -> None:
    session, approval_id, effect_id = await pending(engine, org_id)
    clock.advance(TIMEOUT_S - 1)
    assert mine(await approvals.sweep(), org_id) == []
    clock.advance(1)
    (result,) = mine(await approvals.sweep(), org_id)
    assert (result.approval.approval_id, result.approval.status, result.run) == (
        approval_id, "timed_out", None,
    )  # fmt: skip
    assert (result.approval.decided_by, result.effect.state) == ("policy", "timed_out")
    assert mine(await approvals.sweep(), org_id) == []
    timed_out = [e for e in await events_of(engine, org_id) if e.type == "approval_timed_out"]
    assert [e.effect_id for e in timed_out] == [effect_id]
    with pytest.raises(ApprovalTimedOut):
        await ask(engine, org_id, session, db="db-1")
    with pytest.raises(ApprovalTimedOut):
        await approvals.decide(org_id, approval_id, Verdict.APPROVE)
    assert (await engine.session_view(org_id, session)).session.state == "active"


@pytest.mark.parametrize(("mode", "runs"), [("proxy", True), ("sdk", False)])
async def test_the_sweep_auto_approves_when_the_org_says_so(
    engine: Engine, approvals: Approvals, clock: Clock, org_id: str, mode: str, runs: bool
) -> None:
    await setup_org(engine, org_id, auto_approve=True)
    session, _, effect_id = await pending(engine, org_id, mode=mode)
    clock.advance(TIMEOUT_S)
    (result,) = mine(await approvals.sweep(), org_id)
    assert (result.approval.status, result.approval.decided_by) == ("auto_approved", "policy")
    assert (result.run is not None) is runs
    assert mine(await approvals.sweep(), org_id) == []
    if mode == "sdk":
        retry = await ask(engine, org_id, session, db="db-1", mode="sdk")
        assert (retry.outcome, retry.effect_id) == (Outcome.EXECUTE, effect_id)
    else:
        assert result.effect.state == "executing"


async def test_the_sweep_times_out_instead_when_the_session_no_longer_runs(
    engine: Engine, approvals: Approvals, clock: Clock, org_id: str
) -> None:
    await setup_org(engine, org_id, auto_approve=True)
    session, first, _ = await pending(engine, org_id, step=1)
    _, second, _ = await pending(engine, org_id, session, step=2)
    await approvals.decide(org_id, first, Verdict.REJECT)
    clock.advance(TIMEOUT_S)
    (result,) = mine(await approvals.sweep(), org_id)
    assert (result.approval.approval_id, result.approval.status) == (second, "timed_out")


async def test_of_two_sweeps_at_once_through_two_stores_each_approval_is_swept_once(
    engine: Engine, approvals: Approvals, second_store: Store, clock: Clock, org_id: str
) -> None:
    await setup_org(engine, org_id, auto_approve=True)
    other = Approvals(await make_engine(second_store, clock), clock_us=clock)
    session = new_session()
    ids = {(await pending(engine, org_id, session, step=s))[1] for s in range(1, 21)}
    clock.advance(TIMEOUT_S)
    first, second = await asyncio.gather(approvals.sweep(limit=7), other.sweep(limit=7))
    swept = [r.approval.approval_id for r in mine(first + second, org_id)]
    while len(swept) < len(ids):
        more = mine(await approvals.sweep(), org_id) + mine(await other.sweep(), org_id)
        assert more, "the sweeps stopped before every approval was swept"
        swept += [r.approval.approval_id for r in more]
    assert sorted(swept) == sorted(ids)
    approved = [e for e in await events_of(engine, org_id) if e.type == "approval_approved"]
    assert len(approved) == len(ids)


# --- a decision after the deadline ---------------------------------------------------------


async def test_a_decision_after_the_deadline_times_the_approval_out(
    engine: Engine, approvals: Approvals, clock: Clock, org_id: str
) -> None:
    _, approval_id, _ = await pending(engine, org_id)
    clock.advance(TIMEOUT_S)
    with pytest.raises(ApprovalTimedOut):
        await approvals.decide(org_id, approval_id, Verdict.APPROVE)
    record = await approval_of(engine, org_id, approval_id)
    assert (record.status, record.decided_by) == ("timed_out", "policy")
    assert mine(await approvals.sweep(), org_id) == []


async def test_a_decision_after_the_deadline_of_an_auto_approving_org_hands_back_the_run(
    engine: Engine, approvals: Approvals, clock: Clock, org_id: str
) -> None:
    await setup_org(engine, org_id, auto_approve=True)
    _, approval_id, effect_id = await pending(engine, org_id)
    clock.advance(TIMEOUT_S)
    with pytest.raises(ResolvedByPolicy) as late:
        await approvals.decide(org_id, approval_id, Verdict.REJECT)
    assert late.value.code == "approval_already_resolved"
    assert late.value.result.approval.status == "auto_approved"
    assert late.value.result.run is not None
    assert late.value.result.run.effect_id == effect_id
    assert mine(await approvals.sweep(), org_id) == []


# --- an approval racing the agent's retry -------------------------------------------------------


async def test_a_retry_that_read_the_call_before_its_approval_ran_it_gets_in_progress(
    engine: Engine, approvals: Approvals, org_id: str
) -> None:
    """The retry read the effect awaiting and the approval approved (PostgreSQL reads each
    statement's snapshot): the approval moved the effect first, so the retry's write finds it
    executing and answers `in_progress` (then the replay), never invalid_state_transition."""
    from undolog.engine.decide import Action

    _, approval_id, effect_id = await pending(engine, org_id)
    async with engine.store.reader() as q:
        stale = await q.get_effect(org_id, effect_id)
    assert stale is not None and stale.state == "awaiting_approval"
    result = await approvals.decide(org_id, approval_id, Verdict.APPROVE)
    assert result.run is not None
    tool = await engine.get_tool(org_id, "delete_database")
    async with engine.store.transaction() as q:
        plan = await engine.apply_action(
            q, Action.EXECUTE_APPROVED, tool, stale, result.approval, engine._clock()
        )
    assert isinstance(plan.error, InProgress), plan
    await engine.commit(org_id, effect_id, '{"success": true, "output": 1, "error": null}')
    async with engine.store.transaction() as q:
        plan = await engine.apply_action(
            q, Action.EXECUTE_APPROVED, tool, stale, result.approval, engine._clock()
        )
    assert plan.decision is not None and plan.decision.outcome is Outcome.REPLAY
