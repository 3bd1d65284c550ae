"""The engine over both stores: intercept, commit, fail, resolve, approvals and isolation.

Time is an injected clock (`clock_us=`), so lease expiry is a clock move, never a sleep.
"""

from __future__ import annotations

import math
import uuid
from typing import Any

import pytest

from undolog.engine import Decision, Engine, Outcome
from undolog.engine.model import check_registered_before_executed
from undolog.store import ApprovalRecord, EffectRecord, EventRecord, Store
from undolog_sdk.errors import (
    ApprovalRejected,
    ApprovalTimedOut,
    CompensationRegisteredTooLate,
    EffectInDoubt,
    InProgress,
    InvalidRequest,
    InvalidStateTransition,
    NotExecuting,
    NotFound,
    SessionClosed,
    ToolNotRegistered,
)

SECOND = 1_000_000
LEASE_S = 30
APPROVAL_TIMEOUT_S = 90
EMAIL = {"to": "a@example.com", "subject": "hello"}
UNDO_EMAIL = {"fn_name": "undo_send_email", "args": {"to": "a@example.com"}, "max_retries": 2}
RESULT = '{"message_id": "m-1",  "sent": true, "cost": 1.50}'  # odd spacing: bytes must survive


class Clock:
    """A clock that moves only when told to."""

    def __init__(self) -> None:
        self.now = 1_700_000_000_000_000

    def __call__(self) -> int:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += int(seconds * SECOND)


@pytest.fixture
def clock() -> Clock:
    return Clock()


async def setup_org(engine: Engine, org_id: str) -> None:
    await engine.ensure_org(org_id, approval_timeout_s=APPROVAL_TIMEOUT_S)
    await engine.register_tool(org_id, "send_email", tier="compensable", compensation=UNDO_EMAIL)
    await engine.register_tool(
        org_id,
        "charge_card",
        tier="compensable",
        compensation={"fn_name": "refund_card"},
        idempotent_upstream=True,
    )
    await engine.register_tool(org_id, "delete_database", tier="irreversible")
    await engine.register_tool(org_id, "search_web", tier="safe")


@pytest.fixture
async def engine(store: Store, org_id: str, clock: Clock) -> Engine:
    engine = Engine(store, lease_seconds=LEASE_S, retry_after_seconds=5, clock_us=clock)
    await setup_org(engine, org_id)
    return engine


def new_session() -> str:
    return str(uuid.uuid4())


async def send(
    engine: Engine,
    org_id: str,
    session: str,
    *,
    step: int | None = 1,
    tool: str = "send_email",
    args: Any = None,
) -> Decision:
    return await engine.intercept(
        org_id, session, tool, EMAIL if args is None else args, step_index=step
    )


async def events_of(engine: Engine, org_id: str, session: str | None = None) -> list[EventRecord]:
    async with engine.store.reader() as q:
        return await q.list_events(org_id, session_id=session)


async def approval(engine: Engine, org_id: str, approval_id: str | None) -> ApprovalRecord:
    assert approval_id is not None
    async with engine.store.reader() as q:
        record = await q.get_approval(org_id, approval_id)
    assert record is not None
    return record


async def set_approval(
    engine: Engine, org_id: str, approval_id: str | None, **changes: Any
) -> None:
    assert approval_id is not None
    async with engine.store.transaction() as q:
        assert await q.update_approval(org_id, approval_id, expect_status="pending", **changes)


async def go_in_doubt(engine: Engine, clock: Clock, org_id: str, session: str) -> Decision:
    first = await send(engine, org_id, session)
    clock.advance(LEASE_S + 1)
    with pytest.raises(EffectInDoubt):
        await send(engine, org_id, session)
    return first


# -- execute, commit, replay -----------------------------------------------------------------


async def test_a_committed_call_replays_the_exact_stored_result(
    engine: Engine, org_id: str
) -> None:
    session = new_session()
    first = await send(engine, org_id, session)
    assert (first.outcome, first.step_index, first.attempt, first.logged) == (
        Outcome.EXECUTE,
        1,
        1,
        True,
    )
    committed = await engine.commit(org_id, first.effect_id, RESULT)
    again = await send(engine, org_id, session)
    assert (committed.state, committed.result_json) == ("committed", RESULT)
    assert (again.outcome, again.effect_id, again.result_json) == (
        Outcome.REPLAY,
        first.effect_id,
        RESULT,
    )
    view = await engine.session_view(org_id, session)
    assert view.replay_counts == {first.effect_id: 1}


async def test_a_concurrent_duplicate_is_in_progress_with_a_retry_after(
    engine: Engine, clock: Clock, org_id: str
) -> None:
    session = new_session()
    first = await send(engine, org_id, session)
    with pytest.raises(InProgress) as early:
        await send(engine, org_id, session)
    clock.advance(LEASE_S - 0.5)
    with pytest.raises(InProgress) as late:
        await send(engine, org_id, session)
    assert (early.value.effect_id, early.value.retry_after) == (first.effect_id, 5)
    assert late.value.retry_after == 1  # never 0, never past the lease
    assert (await engine.get_effect(org_id, first.effect_id)).state == "executing"


async def test_after_the_lease_expires_a_retry_finds_the_call_in_doubt_until_resolved(
    engine: Engine, clock: Clock, org_id: str
) -> None:
    session = new_session()
    first = await go_in_doubt(engine, clock, org_id, session)
    clock.advance(LEASE_S + 1)
    with pytest.raises(EffectInDoubt) as again:
        await send(engine, org_id, session)
    effect = await engine.get_effect(org_id, first.effect_id)
    assert again.value.effect_id == first.effect_id
    assert (effect.state, effect.lease_expires_us, effect.attempts) == ("in_doubt", None, 1)
    in_doubt_events = [e for e in await events_of(engine, org_id) if '"in_doubt"' in e.payload_json]
    assert [e.type for e in in_doubt_events] == ["effect_failed"]  # marked once


async def test_after_the_lease_expires_an_idempotent_upstream_runs_again_as_attempt_2(
    engine: Engine, clock: Clock, org_id: str
) -> None:
    session = new_session()
    first = await send(engine, org_id, session, tool="charge_card")
    clock.advance(LEASE_S + 1)
    rerun = await send(engine, org_id, session, tool="charge_card")
    effect = await engine.get_effect(org_id, first.effect_id)
    assert (rerun.outcome, rerun.effect_id, rerun.attempt) == (Outcome.EXECUTE, first.effect_id, 2)
    assert (effect.state, effect.attempts) == ("executing", 2)
    assert effect.lease_expires_us == clock.now + LEASE_S * SECOND
    await engine.commit(org_id, first.effect_id, RESULT)
    replay = await send(engine, org_id, session, tool="charge_card")
    assert (replay.outcome, replay.attempt, replay.result_json) == (Outcome.REPLAY, 2, RESULT)


async def test_a_failed_call_retried_is_a_new_attempt_on_the_same_effect(
    engine: Engine, org_id: str
) -> None:
    session = new_session()
    first = await send(engine, org_id, session)
    failed = await engine.fail(org_id, first.effect_id, "smtp down")
    retry = await send(engine, org_id, session)
    effect = await engine.get_effect(org_id, first.effect_id)
    assert (failed.state, failed.error) == ("failed", "smtp down")
    assert (retry.outcome, retry.effect_id, retry.attempt) == (Outcome.EXECUTE, first.effect_id, 2)
    assert (effect.state, effect.attempts, effect.error) == ("executing", 2, None)
    view = await engine.session_view(org_id, session)
    assert len(view.effects) == 1
    assert len(view.undo_entries) == 1  # the compensation was pushed once, for the effect
    assert (await engine.commit(org_id, first.effect_id, RESULT)).attempts == 2


# -- commit, fail, resolve ---------------------------------------------------------------------


async def test_resolving_an_in_doubt_call_as_committed_makes_retries_replay_it(
    engine: Engine, clock: Clock, org_id: str
) -> None:
    session = new_session()
    first = await go_in_doubt(engine, clock, org_id, session)
    resolved = await engine.resolve(
        org_id, first.effect_id, outcome="committed", result_json=RESULT
    )
    replay = await send(engine, org_id, session)
    assert (resolved.state, resolved.result_json) == ("committed", RESULT)
    assert (replay.outcome, replay.effect_id, replay.result_json) == (
        Outcome.REPLAY,
        first.effect_id,
        RESULT,
    )


async def test_resolving_an_in_doubt_call_as_failed_makes_the_retry_attempt_2(
    engine: Engine, clock: Clock, org_id: str
) -> None:
    session = new_session()
    first = await go_in_doubt(engine, clock, org_id, session)
    resolved = await engine.resolve(org_id, first.effect_id, outcome="failed")
    retry = await send(engine, org_id, session)
    assert resolved.state == "failed"
    assert (retry.outcome, retry.effect_id, retry.attempt) == (Outcome.EXECUTE, first.effect_id, 2)


async def test_the_runner_that_outlived_its_lease_can_still_commit_the_in_doubt_call(
    engine: Engine, clock: Clock, org_id: str
) -> None:
    session = new_session()
    first = await go_in_doubt(engine, clock, org_id, session)
    late = await engine.commit(org_id, first.effect_id, RESULT)
    replay = await send(engine, org_id, session)
    assert (late.state, replay.outcome, replay.result_json) == ("committed", Outcome.REPLAY, RESULT)


@pytest.mark.parametrize("kwargs", [{"outcome": "committed"}, {"outcome": "replayed"}])
async def test_resolving_without_a_result_or_to_an_unknown_outcome_is_invalid(
    engine: Engine, clock: Clock, org_id: str, kwargs: dict[str, str]
) -> None:
    first = await go_in_doubt(engine, clock, org_id, new_session())
    with pytest.raises(InvalidRequest):
        await engine.resolve(org_id, first.effect_id, **kwargs)
    assert (await engine.get_effect(org_id, first.effect_id)).state == "in_doubt"


async def test_resolving_a_call_that_is_not_in_doubt_raises_invalid_state_transition(
    engine: Engine, org_id: str
) -> None:
    first = await send(engine, org_id, new_session())
    with pytest.raises(InvalidStateTransition) as executing:
        await engine.resolve(org_id, first.effect_id, outcome="committed", result_json="{}")
    await engine.commit(org_id, first.effect_id, RESULT)
    with pytest.raises(InvalidStateTransition) as committed:
        await engine.resolve(org_id, first.effect_id, outcome="failed")
    assert (executing.value.current_state, executing.value.target_state) == (
        "executing",
        "committed",
    )
    assert committed.value.current_state == "committed"
    assert (await engine.get_effect(org_id, first.effect_id)).result_json == RESULT


async def test_committing_twice_raises_not_executing_and_keeps_the_first_result(
    engine: Engine, org_id: str
) -> None:
    first = await send(engine, org_id, new_session())
    await engine.commit(org_id, first.effect_id, RESULT)
    with pytest.raises(NotExecuting) as caught:
        await engine.commit(org_id, first.effect_id, '{"other":1}')
    assert caught.value.effect_id == first.effect_id
    assert (await engine.get_effect(org_id, first.effect_id)).result_json == RESULT


async def test_a_finished_call_cannot_be_committed_or_failed_again(
    engine: Engine, org_id: str
) -> None:
    failed = await send(engine, org_id, new_session())
    await engine.fail(org_id, failed.effect_id, "boom")
    with pytest.raises(NotExecuting):
        await engine.commit(org_id, failed.effect_id, RESULT)
    committed = await send(engine, org_id, new_session())
    await engine.commit(org_id, committed.effect_id, RESULT)
    with pytest.raises(InvalidStateTransition):
        await engine.fail(org_id, committed.effect_id, "too late")
    assert (await engine.get_effect(org_id, committed.effect_id)).state == "committed"


async def test_committing_an_unknown_effect_raises_not_found(engine: Engine, org_id: str) -> None:
    with pytest.raises(NotFound):
        await engine.commit(org_id, str(uuid.uuid4()), RESULT)
    with pytest.raises(NotFound):
        await engine.fail(org_id, str(uuid.uuid4()), "boom")
    with pytest.raises(NotFound):
        await engine.resolve(org_id, str(uuid.uuid4()), outcome="failed")


# -- the undo stack ----------------------------------------------------------------------------


async def test_a_compensable_call_pushes_one_undo_entry_before_it_executes(
    engine: Engine, org_id: str
) -> None:
    session = new_session()
    decision = await send(engine, org_id, session)  # the clock stands still: order must hold
    view = await engine.session_view(org_id, session)
    (effect,) = view.effects
    (entry,) = view.undo_entries
    assert (entry.effect_id, entry.fn_name, entry.args_json, entry.max_retries, entry.state) == (
        decision.effect_id,
        "undo_send_email",
        '{"to":"a@example.com"}',
        2,
        "pending",
    )
    assert effect.executed_us is not None and entry.registered_us < effect.executed_us
    check_registered_before_executed(entry, effect)


@pytest.mark.parametrize("shift_us", [0, 1], ids=["same_instant", "after"])
async def test_an_entry_registered_at_or_after_execution_violates_the_invariant(
    engine: Engine, org_id: str, shift_us: int
) -> None:
    session = new_session()
    decision = await send(engine, org_id, session)
    effect = await engine.get_effect(org_id, decision.effect_id)
    (entry,) = (await engine.session_view(org_id, session)).undo_entries
    assert effect.executed_us is not None
    async with engine.store.transaction() as q:
        late = effect.executed_us + shift_us
        await q.update_undo_entry(org_id, entry.entry_id, registered_us=late)
        stored = await q.get_undo_entry(org_id, entry.entry_id)
    assert stored is not None
    with pytest.raises(CompensationRegisteredTooLate) as caught:
        check_registered_before_executed(stored, effect)
    assert caught.value.effect_id == effect.effect_id


async def test_an_effect_without_an_execution_time_violates_the_invariant(
    engine: Engine, org_id: str
) -> None:
    session = new_session()
    decision = await send(engine, org_id, session)
    async with engine.store.transaction() as q:
        await q.update_effect(org_id, decision.effect_id, executed_us=None)
        effect = await q.get_effect(org_id, decision.effect_id)
        (entry,) = await q.list_undo_entries(org_id, session)
    assert isinstance(effect, EffectRecord)
    with pytest.raises(CompensationRegisteredTooLate):
        check_registered_before_executed(entry, effect)


# -- approvals ---------------------------------------------------------------------------------


async def test_an_irreversible_call_awaits_a_pending_approval_timed_by_its_org(
    engine: Engine, clock: Clock, org_id: str
) -> None:
    session = new_session()
    first = await send(engine, org_id, session, tool="delete_database")
    retry = await send(engine, org_id, session, tool="delete_database")
    record = await approval(engine, org_id, first.approval_id)
    effect = await engine.get_effect(org_id, first.effect_id)
    assert first.outcome is Outcome.AWAITING_APPROVAL
    assert (retry.outcome, retry.effect_id, retry.approval_id) == (
        Outcome.AWAITING_APPROVAL,
        first.effect_id,
        first.approval_id,
    )
    assert (record.status, record.effect_id, record.created_us) == (
        "pending",
        first.effect_id,
        clock.now,
    )
    assert record.timeout_us == record.created_us + APPROVAL_TIMEOUT_S * SECOND
    assert (effect.state, effect.executed_us) == ("awaiting_approval", None)
    assert (await engine.session_view(org_id, session)).undo_entries == []


async def test_changed_args_are_a_new_approval(engine: Engine, org_id: str) -> None:
    session = new_session()
    first = await send(engine, org_id, session, tool="delete_database", args={"db": "a"})
    other = await send(engine, org_id, session, tool="delete_database", args={"db": "b"})
    assert first.approval_id != other.approval_id and first.effect_id != other.effect_id


@pytest.mark.parametrize(
    ("status", "error"),
    [("rejected", ApprovalRejected), ("timed_out", ApprovalTimedOut)],
)
async def test_a_refused_approval_refuses_the_call(
    engine: Engine, org_id: str, status: str, error: type[Exception]
) -> None:
    session = new_session()
    first = await send(engine, org_id, session, tool="delete_database")
    await set_approval(engine, org_id, first.approval_id, status=status, reason="too risky")
    with pytest.raises(error) as caught:
        await send(engine, org_id, session, tool="delete_database")
    assert getattr(caught.value, "approval_id", None) == first.approval_id
    if isinstance(caught.value, ApprovalRejected):
        assert caught.value.reason == "too risky"


@pytest.mark.parametrize("status", ["approved", "auto_approved"])
async def test_an_approved_call_executes_on_retry(engine: Engine, org_id: str, status: str) -> None:
    session = new_session()
    first = await send(engine, org_id, session, tool="delete_database")
    await set_approval(engine, org_id, first.approval_id, status=status, decided_by="ana")
    run = await send(engine, org_id, session, tool="delete_database")
    assert (run.outcome, run.effect_id, run.attempt) == (Outcome.EXECUTE, first.effect_id, 1)
    assert (await engine.get_effect(org_id, first.effect_id)).state == "executing"
    await engine.commit(org_id, first.effect_id, RESULT)
    replay = await send(engine, org_id, session, tool="delete_database")
    assert (replay.outcome, replay.result_json) == (Outcome.REPLAY, RESULT)


# -- SAFE tools, bad input, closed sessions ------------------------------------------------------


async def test_a_safe_call_is_decided_without_writing_anything(engine: Engine, org_id: str) -> None:
    session = new_session()
    decision = await send(engine, org_id, session, tool="search_web", args={"q": "x"})
    assert (decision.outcome, decision.logged, decision.signature) == (Outcome.EXECUTE, False, None)
    with pytest.raises(NotFound):
        await engine.session_view(org_id, session)
    assert await events_of(engine, org_id) == []


async def test_an_unregistered_tool_raises_tool_not_registered(engine: Engine, org_id: str) -> None:
    with pytest.raises(ToolNotRegistered) as caught:
        await send(engine, org_id, new_session(), tool="x")
    assert str(caught.value) == f"Tool 'x' is not registered for org '{org_id}'"


@pytest.mark.parametrize(
    "args",
    [{"n": math.nan}, {"n": math.inf}, {"n": 2**64}, {1: "non-string key"}],
    ids=["nan", "inf", "int_too_large", "int_key"],
)
async def test_args_that_cannot_be_canonicalised_are_an_invalid_request(
    engine: Engine, org_id: str, args: Any
) -> None:
    session = new_session()
    with pytest.raises(InvalidRequest):
        await send(engine, org_id, session, args=args)
    with pytest.raises(NotFound):
        await engine.session_view(org_id, session)


@pytest.mark.parametrize(
    ("session", "step", "mode"),
    [
        ("not-a-uuid", 1, "proxy"),
        ("", 1, "proxy"),
        (None, -1, "proxy"),
        (None, 2**32, "proxy"),
        (None, 1, "remote"),
    ],
    ids=["session_not_uuid", "session_empty", "step_negative", "step_over_u32", "unknown_mode"],
)
async def test_a_malformed_call_is_an_invalid_request(
    engine: Engine, org_id: str, session: str | None, step: int, mode: str
) -> None:
    with pytest.raises(InvalidRequest):
        await engine.intercept(
            org_id,
            new_session() if session is None else session,
            "send_email",
            EMAIL,
            step_index=step,
            mode=mode,
        )


@pytest.mark.parametrize("step", [2, None], ids=["numbered", "unnumbered"])
async def test_a_session_that_is_not_active_refuses_new_calls_but_still_replays(
    engine: Engine, clock: Clock, org_id: str, step: int | None
) -> None:
    session = new_session()
    first = await send(engine, org_id, session)
    await engine.commit(org_id, first.effect_id, RESULT)
    async with engine.store.transaction() as q:
        await q.update_session(org_id, session, clock.now, state="completed")
    with pytest.raises(SessionClosed) as caught:
        await send(engine, org_id, session, step=step, args={"to": "b@example.com"})
    replay = await send(engine, org_id, session)
    assert (caught.value.session_id, caught.value.state) == (session, "completed")
    assert replay.outcome is Outcome.REPLAY
    assert len((await engine.session_view(org_id, session)).effects) == 1


# -- calls without a step ------------------------------------------------------------------------


async def test_calls_without_a_step_take_the_sessions_next_steps(
    engine: Engine, org_id: str
) -> None:
    session = new_session()
    first = await send(engine, org_id, session, step=None)
    second = await send(engine, org_id, session, step=None, args={"to": "b@example.com"})
    assert (first.step_index, second.step_index) == (1, 2)
    assert first.effect_id != second.effect_id


async def test_an_identical_call_without_a_step_while_the_first_runs_is_the_same_call(
    engine: Engine, org_id: str
) -> None:
    session = new_session()
    first = await send(engine, org_id, session, step=None)
    with pytest.raises(InProgress) as caught:
        await send(engine, org_id, session, step=None)
    assert caught.value.effect_id == first.effect_id
    view = await engine.session_view(org_id, session)
    assert (len(view.effects), view.session.last_step) == (1, 1)


async def test_an_identical_call_without_a_step_whose_answer_was_delivered_is_a_new_call(
    engine: Engine, org_id: str
) -> None:
    session = new_session()
    first = await send(engine, org_id, session, step=None)
    await engine.commit(org_id, first.effect_id, RESULT)
    await engine.mark_delivered(org_id, [first.effect_id])
    second = await send(engine, org_id, session, step=None)
    assert (second.outcome, second.step_index) == (Outcome.EXECUTE, 2)
    assert second.effect_id != first.effect_id


async def test_an_identical_call_without_a_step_whose_answer_was_lost_replays_it(
    engine: Engine, org_id: str
) -> None:
    session = new_session()
    first = await send(engine, org_id, session, step=None)
    await engine.commit(org_id, first.effect_id, RESULT)
    again = await send(engine, org_id, session, step=None)
    assert (again.outcome, again.effect_id, again.step_index) == (
        Outcome.REPLAY,
        first.effect_id,
        1,
    )
    assert again.result_json == RESULT
    # Delivered now: the next identical call is a new one.
    await engine.mark_delivered(org_id, [again.effect_id])
    third = await send(engine, org_id, session, step=None)
    assert (third.outcome, third.step_index) == (Outcome.EXECUTE, 2)


async def test_a_failed_call_without_a_step_runs_again_on_its_effect(
    engine: Engine, org_id: str
) -> None:
    session = new_session()
    first = await send(engine, org_id, session, step=None)
    await engine.fail(org_id, first.effect_id, "upstream down")
    await engine.mark_delivered(org_id, [first.effect_id])  # a failure is no result: no-op
    retried = await send(engine, org_id, session, step=None)
    assert (retried.outcome, retried.effect_id, retried.attempt, retried.step_index) == (
        Outcome.EXECUTE,
        first.effect_id,
        2,
        1,
    )


async def test_marking_delivered_leaves_a_call_that_is_running_again_alone(
    engine: Engine, org_id: str
) -> None:
    session = new_session()
    first = await send(engine, org_id, session, step=None)
    await engine.fail(org_id, first.effect_id, "upstream down")
    await send(engine, org_id, session, step=None)  # attempt 2 runs
    await engine.mark_delivered(org_id, [first.effect_id])  # attempt 1's answer, late
    await engine.commit(org_id, first.effect_id, RESULT)
    again = await send(engine, org_id, session, step=None)
    assert (again.outcome, again.effect_id) == (Outcome.REPLAY, first.effect_id)


async def test_a_refused_call_without_a_step_stays_refused_in_its_session(
    engine: Engine, org_id: str
) -> None:
    session = new_session()
    asked = await send(engine, org_id, session, step=None, tool="delete_database")
    await set_approval(engine, org_id, asked.approval_id, status="rejected", reason="no")
    for _ in range(2):
        with pytest.raises(ApprovalRejected) as caught:
            await send(engine, org_id, session, step=None, tool="delete_database")
        assert caught.value.approval_id == asked.approval_id
    assert len((await engine.session_view(org_id, session)).effects) == 1


async def test_an_sdk_run_call_without_a_step_counts_as_delivered_when_it_is_reported(
    engine: Engine, org_id: str
) -> None:
    session = new_session()
    first = await engine.intercept(org_id, session, "send_email", EMAIL, mode="sdk")
    await engine.commit(org_id, first.effect_id, RESULT)
    second = await engine.intercept(org_id, session, "send_email", EMAIL, mode="sdk")
    assert (second.outcome, second.step_index) == (Outcome.EXECUTE, 2)


async def test_an_identical_call_without_a_step_finds_its_approval_or_its_doubt(
    engine: Engine, clock: Clock, org_id: str
) -> None:
    session = new_session()
    asked = await send(engine, org_id, session, step=None, tool="delete_database")
    again = await send(engine, org_id, session, step=None, tool="delete_database")
    sent = await send(engine, org_id, session, step=None)
    clock.advance(LEASE_S + 1)
    with pytest.raises(EffectInDoubt) as caught:
        await send(engine, org_id, session, step=None)
    assert (again.approval_id, again.step_index) == (asked.approval_id, 1)
    assert (sent.step_index, caught.value.effect_id) == (2, sent.effect_id)
    assert len((await engine.session_view(org_id, session)).effects) == 2


async def test_a_call_without_a_step_follows_the_highest_numbered_step(
    engine: Engine, org_id: str
) -> None:
    session = new_session()
    await send(engine, org_id, session, step=7)
    follower = await send(engine, org_id, session, step=None, args={"to": "b@example.com"})
    assert follower.step_index == 8


# -- events and isolation ------------------------------------------------------------------------


async def test_every_lifecycle_step_writes_one_event_with_increasing_ids(
    engine: Engine, org_id: str
) -> None:
    session = new_session()
    first = await send(engine, org_id, session, step=1)
    await engine.commit(org_id, first.effect_id, RESULT)
    await send(engine, org_id, session, step=1)
    second = await send(engine, org_id, session, step=2)
    await engine.fail(org_id, second.effect_id, "boom")
    third = await send(engine, org_id, session, step=3, tool="delete_database")
    events = await events_of(engine, org_id, session)
    assert [(e.type, e.effect_id) for e in events] == [
        ("effect_intercepted", first.effect_id),
        ("effect_committed", first.effect_id),
        ("effect_replayed", first.effect_id),
        ("effect_intercepted", second.effect_id),
        ("effect_failed", second.effect_id),
        ("approval_required", third.effect_id),
    ]
    ids = [e.event_id for e in events]
    assert ids == sorted(ids) and len(set(ids)) == len(ids)
    assert third.approval_id is not None and third.approval_id in events[-1].payload_json


async def test_an_orgs_effects_are_invisible_to_another_org(engine: Engine, org_id: str) -> None:
    other = f"org-{uuid.uuid4().hex[:12]}"
    await setup_org(engine, other)
    session = new_session()
    first = await send(engine, org_id, session)
    with pytest.raises(NotFound):
        await engine.session_view(other, session)
    with pytest.raises(NotFound):
        await engine.get_effect(other, first.effect_id)
    with pytest.raises(NotFound):
        await engine.commit(other, first.effect_id, RESULT)
    with pytest.raises(NotFound):
        await engine.fail(other, first.effect_id, "boom")
    assert (await engine.get_effect(org_id, first.effect_id)).state == "executing"
    assert await events_of(engine, other) == []
    twin = await send(engine, other, session)  # the same call in another org is its own
    assert (twin.outcome, twin.signature) == (Outcome.EXECUTE, first.signature)
    assert twin.effect_id != first.effect_id
