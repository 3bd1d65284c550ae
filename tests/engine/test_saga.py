"""The saga: the pure `plan_next` table, then `Saga` over both stores.

Time is an injected clock (`clock_us=`), so a lapsed claim is a clock move, never a sleep.
Forward calls are made with the engine (intercept + commit) on the same clock, so the undo
entries and effects are the rows a real session leaves behind.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import orjson
import pytest

from undolog.engine import Engine
from undolog.engine.saga import LOST_RUN, Claim, RollbackStatus, Saga, StepKind, plan_next
from undolog.engine.unwind import NotHandedOver
from undolog.store import EffectRecord, EventRecord, Store, UndoEntryRecord
from undolog_sdk.errors import (
    ClaimNotHeld,
    CompensationFailed,
    CompensationRegisteredTooLate,
    InvalidRequest,
    InvalidStateTransition,
    NotFound,
)

SECOND = 1_000_000
LEASE_S = 30
NOW = 1_700_000_000_000_000


class Clock:
    """A clock that moves only when told to."""

    def __init__(self) -> None:
        self.now = NOW

    def __call__(self) -> int:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += int(seconds * SECOND)


# -- plan_next: the pure table -------------------------------------------------------------------


def entry(
    seq: int, state: str = "pending", *, runner: str = "proxy", lease: int | None = None
) -> UndoEntryRecord:
    return UndoEntryRecord(
        seq=seq,
        entry_id=f"entry-{seq}",
        org_id="org",
        session_id="session",
        effect_id=f"effect-{seq}",
        fn_name="undo",
        fn_version="1.0.0",
        args_json="{}",
        max_retries=3,
        retry_backoff_ms=10,
        registered_us=NOW - 10,
        state=state,
        attempts=0,
        last_error=None,
        updated_us=NOW - 10,
        runner=runner,
        lease_expires_us=lease,
    )


def effect(seq: int, state: str = "committed") -> EffectRecord:
    return EffectRecord(
        effect_id=f"effect-{seq}",
        org_id="org",
        session_id="session",
        step_index=seq,
        tool_name="tool",
        tool_version="1.0.0",
        tier="compensable",
        call_signature=f"sig-{seq}",
        args_json="{}",
        state=state,
        mode="proxy",
        attempts=1,
        result_json="{}",
        error=None,
        lease_expires_us=None,
        executed_us=NOW - 5,
        finished_us=NOW - 4,
        created_us=NOW - 10,
        updated_us=NOW - 4,
    )


def pair(
    seq: int,
    entry_state: str = "pending",
    effect_state: str = "committed",
    **entry_fields: Any,
) -> tuple[UndoEntryRecord, EffectRecord]:
    return entry(seq, entry_state, **entry_fields), effect(seq, effect_state)


Stack = list[tuple[UndoEntryRecord, EffectRecord]]
PLAN_TABLE: list[tuple[str, Stack, str, StepKind, int | None]] = [
    # (case, stack newest first, runner, expected kind, expected entry seq)
    ("an empty stack is done", [], "proxy", StepKind.DONE, None),
    (
        "a stack of settled entries is done",
        [pair(3, "compensated", "compensated"), pair(2, "skipped", "failed"),
         pair(1, "resolved", "compensated")],
        "proxy", StepKind.DONE, None,
    ),
    ("the top committed entry runs first", [pair(2), pair(1)], "proxy", StepKind.RUN, 2),
    (
        "settled entries on top are passed over",
        [pair(3, "compensated", "compensated"), pair(2, "skipped", "failed"), pair(1)],
        "proxy", StepKind.RUN, 1,
    ),
    ("a failed entry stops the unwinding", [pair(2, "failed", "compensation_failed"), pair(1)],
     "proxy", StepKind.FAILED, 2),
    ("a failed forward call is skipped", [pair(2, "pending", "failed"), pair(1)],
     "proxy", StepKind.SKIP, 2),
    ("a rejected forward call is skipped", [pair(1, "pending", "rejected")],
     "proxy", StepKind.SKIP, 1),
    ("a timed-out forward call is skipped", [pair(1, "pending", "timed_out")],
     "proxy", StepKind.SKIP, 1),
    ("a call still awaiting approval is skipped", [pair(1, "pending", "awaiting_approval")],
     "proxy", StepKind.SKIP, 1),
    ("an already compensated effect settles its entry", [pair(1, "pending", "compensated")],
     "proxy", StepKind.SETTLE, 1),
    ("an executing forward call blocks", [pair(2, "pending", "executing"), pair(1)],
     "proxy", StepKind.BLOCKED, 2),
    ("an in-doubt forward call blocks", [pair(2, "pending", "in_doubt"), pair(1)],
     "proxy", StepKind.BLOCKED, 2),
    ("a pending forward call blocks", [pair(1, "pending", "pending")],
     "proxy", StepKind.BLOCKED, 1),
    ("a claim under a live lease is busy",
     [pair(2, "running", "compensating", lease=NOW + 1), pair(1)], "proxy", StepKind.BUSY, 2),
    ("a claim whose lease lapsed runs again",
     [pair(2, "running", "compensating", lease=NOW), pair(1)], "proxy", StepKind.RUN, 2),
    ("a claim without a lease runs again",
     [pair(1, "running", "compensating", lease=None)], "proxy", StepKind.RUN, 1),
    ("an SDK entry waits for the SDK", [pair(2, runner="sdk"), pair(1)],
     "proxy", StepKind.OTHER_RUNNER, 2),
    ("the SDK runs its own entry", [pair(2, runner="sdk"), pair(1)], "sdk", StepKind.RUN, 2),
    ("a proxy entry waits for the proxy", [pair(1)], "sdk", StepKind.OTHER_RUNNER, 1),
    ("a reopened entry runs with its effect compensating",
     [pair(1, "pending", "compensating")], "proxy", StepKind.RUN, 1),
]  # fmt: skip


@pytest.mark.parametrize(
    ("stack", "runner", "kind", "seq"),
    [pytest.param(s, r, k, q, id=case) for case, s, r, k, q in PLAN_TABLE],
)
def test_plan_next_picks_the_newest_unsettled_entry(
    stack: Stack,
    runner: str,
    kind: StepKind,
    seq: int | None,
) -> None:
    step = plan_next(stack, runner, NOW)
    assert step.kind is kind
    assert (step.entry.seq if step.entry else None) == seq
    if step.entry is not None:
        assert step.effect is not None and step.effect.effect_id == step.entry.effect_id


def test_plan_next_is_pure_and_leaves_its_input_alone() -> None:
    stack = [pair(2), pair(1)]
    before = list(stack)
    assert plan_next(stack, "proxy", NOW) == plan_next(stack, "proxy", NOW)
    assert stack == before


# -- Saga over both stores -----------------------------------------------------------------------

EMAIL = {"to": "ada@example.com", "subject": "hello"}
MAX_RETRIES = 2
BACKOFF_MS = 10
UNDO_EMAIL: dict[str, Any] = {
    "fn_name": "undo_send_email",
    "args": {"reason": "rollback"},
    "max_retries": MAX_RETRIES,
    "retry_backoff_ms": BACKOFF_MS,
}


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
async def engine(store: Store, org_id: str, clock: Clock) -> Engine:
    engine = Engine(store, lease_seconds=LEASE_S, clock_us=clock)
    await engine.ensure_org(org_id)
    await engine.register_tool(org_id, "send_email", tier="compensable", compensation=UNDO_EMAIL)
    await engine.register_tool(org_id, "search_web", tier="safe")
    await engine.register_tool(org_id, "delete_database", tier="irreversible")
    return engine


@pytest.fixture
def saga(store: Store, clock: Clock) -> Saga:
    return Saga(store, lease_seconds=LEASE_S, clock_us=clock)


def new_session() -> str:
    return str(uuid.uuid4())


def refusals(
    *calls: Callable[[], Awaitable[object]],
) -> tuple[Callable[[], Awaitable[object]], ...]:
    """Calls each expected to raise, made one at a time (typed for the loop over them)."""
    return calls


async def committed(
    engine: Engine, org_id: str, session: str, step: int, *, mode: str = "proxy"
) -> str:
    """A compensable call that ran and committed; its effect id."""
    decision = await engine.intercept(
        org_id, session, "send_email", {**EMAIL, "n": step}, step_index=step, mode=mode
    )
    await engine.commit(
        org_id, decision.effect_id, orjson.dumps({"message_id": f"m-{step}"}).decode()
    )
    return decision.effect_id


async def stack_of(store: Store, org_id: str, session: str) -> list[UndoEntryRecord]:
    async with store.reader() as q:
        return await q.list_undo_entries(org_id, session)


async def effect_state(store: Store, org_id: str, effect_id: str) -> str:
    async with store.reader() as q:
        record = await q.get_effect(org_id, effect_id)
    assert record is not None
    return record.state


async def session_state(store: Store, org_id: str, session: str) -> str:
    async with store.reader() as q:
        record = await q.get_session(org_id, session)
    assert record is not None
    return record.state


async def event_types(store: Store, org_id: str, session: str) -> list[str]:
    async with store.reader() as q:
        events: list[EventRecord] = await q.list_events(org_id, session_id=session)
    return [e.type for e in events]


async def claim(saga: Saga, org_id: str, session: str, runner: str = "proxy") -> Claim:
    result = await saga.claim(org_id, session, runner)
    assert isinstance(result, Claim), result
    return result


async def test_begin_moves_the_session_to_compensating_once(
    saga: Saga, engine: Engine, store: Store, org_id: str
) -> None:
    session = new_session()
    await committed(engine, org_id, session, 1)
    first = await saga.begin(org_id, session)
    again = await saga.begin(org_id, session)
    assert (first.state, again.state) == ("compensating", "compensating")
    assert (await event_types(store, org_id, session)).count("session_compensating") == 1


async def test_a_completed_session_cannot_be_rolled_back(
    saga: Saga, engine: Engine, org_id: str
) -> None:
    session = new_session()
    await committed(engine, org_id, session, 1)
    assert (await saga.complete_session(org_id, session)).state == "completed"
    assert (await saga.complete_session(org_id, session)).state == "completed"  # idempotent
    with pytest.raises(InvalidStateTransition):
        await saga.begin(org_id, session)


async def test_unknown_and_foreign_sessions_and_entries_are_not_found(
    saga: Saga, engine: Engine, org_id: str
) -> None:
    session = new_session()
    await committed(engine, org_id, session, 1)
    other_org = f"{org_id}-other"
    for call in refusals(
        lambda: saga.begin(org_id, new_session()),
        lambda: saga.begin(other_org, session),
        lambda: saga.claim(other_org, session, "proxy"),
        lambda: saga.complete_session(other_org, session),
    ):
        with pytest.raises(NotFound):
            await call()
    await saga.begin(org_id, session)
    entry_id = (await claim(saga, org_id, session)).entry.entry_id
    for call in refusals(
        lambda: saga.complete(other_org, entry_id, "token"),
        lambda: saga.fail_attempt(other_org, entry_id, "x", "token"),
        lambda: saga.retry(other_org, entry_id),
        lambda: saga.resolve(other_org, entry_id, "x"),
        lambda: saga.claim_entry(other_org, entry_id, "sdk"),
        lambda: saga.complete(org_id, "no-such-entry", "token"),
    ):
        with pytest.raises(NotFound):
            await call()


async def test_a_claim_needs_a_compensating_session_and_a_known_runner(
    saga: Saga, engine: Engine, org_id: str
) -> None:
    session = new_session()
    await committed(engine, org_id, session, 1)
    with pytest.raises(InvalidStateTransition):
        await saga.claim(org_id, session, "proxy")  # still active: begin first
    await saga.begin(org_id, session)
    with pytest.raises(InvalidRequest):
        await saga.claim(org_id, session, "robot")


async def test_the_stack_unwinds_newest_first_each_claim_carrying_args_and_the_forward_call(
    saga: Saga, engine: Engine, store: Store, clock: Clock, org_id: str
) -> None:
    session = new_session()
    effects = [await committed(engine, org_id, session, step) for step in (1, 2, 3)]
    await saga.begin(org_id, session)

    order: list[int] = []
    for expected in reversed(effects):
        clock.advance(1)
        claimed = await claim(saga, org_id, session)
        assert claimed.entry.effect_id == expected
        assert (claimed.entry.state, claimed.entry.lease_expires_us) == (
            "running",
            clock.now + LEASE_S * SECOND,
        )
        assert claimed.attempts_left == MAX_RETRIES + 1
        step = len(effects) - len(order)
        assert claimed.payload == {
            "reason": "rollback",
            "original_args": {**EMAIL, "n": step},
            "original_result": {"message_id": f"m-{step}"},
        }
        assert await effect_state(store, org_id, expected) == "compensating"
        done = await saga.complete(org_id, claimed.entry.entry_id, claimed.token)
        assert (done.state, done.attempts, done.lease_expires_us) == ("compensated", 1, None)
        assert await effect_state(store, org_id, expected) == "compensated"
        order.append(claimed.entry.seq)

    assert order == sorted(order, reverse=True)  # seq is push order, global to the store
    assert await saga.claim(org_id, session, "proxy") is RollbackStatus.COMPENSATED
    assert await session_state(store, org_id, session) == "compensated"
    assert await saga.claim(org_id, session, "proxy") is RollbackStatus.COMPENSATED  # idempotent
    types = await event_types(store, org_id, session)
    assert types.count("compensation_started") == 3
    assert types.count("compensation_completed") == 3
    assert types.count("session_compensated") == 1


async def test_a_session_with_nothing_to_undo_reports_an_empty_stack_and_is_compensated(
    saga: Saga, engine: Engine, store: Store, org_id: str
) -> None:
    session = new_session()
    await engine.intercept(org_id, session, "search_web", {"query": "x"}, step_index=1)
    await engine.intercept(org_id, session, "delete_database", {"db": "x"}, step_index=2)
    await saga.begin(org_id, session)
    assert await saga.claim(org_id, session, "proxy") is RollbackStatus.EMPTY
    assert await session_state(store, org_id, session) == "compensated"


async def test_entries_of_failed_and_logically_failed_calls_are_skipped_not_run(
    saga: Saga, engine: Engine, store: Store, org_id: str
) -> None:
    session = new_session()
    ran = await committed(engine, org_id, session, 1)
    failed = await engine.intercept(org_id, session, "send_email", EMAIL, step_index=2)
    await engine.fail(org_id, failed.effect_id, "smtp down")
    said_no = await engine.intercept(org_id, session, "send_email", EMAIL, step_index=3)
    await engine.commit(org_id, said_no.effect_id, '{"success": false}', undoable=False)
    await saga.begin(org_id, session)

    claimed = await claim(saga, org_id, session)

    assert claimed.entry.effect_id == ran
    states = {e.effect_id: e.state for e in await stack_of(store, org_id, session)}
    assert states == {said_no.effect_id: "skipped", failed.effect_id: "skipped", ran: "running"}
    await saga.complete(org_id, claimed.entry.entry_id, claimed.token)
    assert await saga.claim(org_id, session, "proxy") is RollbackStatus.COMPENSATED


async def test_only_skipped_entries_make_an_empty_stack(
    saga: Saga, engine: Engine, org_id: str
) -> None:
    session = new_session()
    failed = await engine.intercept(org_id, session, "send_email", EMAIL, step_index=1)
    await engine.fail(org_id, failed.effect_id, "smtp down")
    await saga.begin(org_id, session)
    assert await saga.claim(org_id, session, "proxy") is RollbackStatus.EMPTY


async def idempotent_undo(engine: Engine, org_id: str, **changes: Any) -> None:
    """Declare send_email's compensation idempotent: a lost run of it may run again."""
    compensation = {**UNDO_EMAIL, "idempotent": True, **changes}
    await engine.register_tool(org_id, "send_email", tier="compensable", compensation=compensation)


async def test_a_live_claim_is_busy_and_a_lapsed_one_is_claimed_again_with_the_same_entry(
    saga: Saga, engine: Engine, clock: Clock, org_id: str
) -> None:
    await idempotent_undo(engine, org_id)
    session = new_session()
    await committed(engine, org_id, session, 1)
    await committed(engine, org_id, session, 2)
    await saga.begin(org_id, session)
    first = await claim(saga, org_id, session)

    clock.advance(LEASE_S - 1)
    assert await saga.claim(org_id, session, "proxy") is RollbackStatus.BUSY
    assert await saga.claim(org_id, session, "sdk") is RollbackStatus.BUSY
    clock.advance(1)
    again = await claim(saga, org_id, session)

    assert again.entry.entry_id == first.entry.entry_id  # the same idempotency key
    assert again.entry.lease_expires_us == clock.now + LEASE_S * SECOND


async def test_a_failed_attempt_with_retries_left_keeps_the_claim_and_renews_its_lease(
    saga: Saga, engine: Engine, store: Store, clock: Clock, org_id: str
) -> None:
    session = new_session()
    await committed(engine, org_id, session, 1)
    await saga.begin(org_id, session)
    claimed = await claim(saga, org_id, session)
    clock.advance(5)

    failed = await saga.fail_attempt(org_id, claimed.entry.entry_id, "smtp down", claimed.token)

    assert (failed.state, failed.attempts, failed.last_error) == ("running", 1, "smtp down")
    backoff_us = BACKOFF_MS * 1000
    assert failed.lease_expires_us == clock.now + backoff_us + LEASE_S * SECOND
    assert await session_state(store, org_id, session) == "compensating"
    done = await saga.complete(org_id, claimed.entry.entry_id, claimed.token)
    assert (done.state, done.attempts, done.last_error) == ("compensated", 2, None)


async def test_a_claim_waiting_out_a_long_backoff_is_not_taken_over(
    saga: Saga, engine: Engine, clock: Clock, org_id: str
) -> None:
    await idempotent_undo(engine, org_id, retry_backoff_ms=2 * LEASE_S * 1000)
    session = new_session()
    await committed(engine, org_id, session, 1)
    await saga.begin(org_id, session)
    claimed = await claim(saga, org_id, session)
    await saga.fail_attempt(org_id, claimed.entry.entry_id, "smtp down", claimed.token)

    clock.advance(LEASE_S * 2)  # the runner is still sleeping its backoff
    assert await saga.claim(org_id, session, "proxy") is RollbackStatus.BUSY
    clock.advance(LEASE_S)  # backoff and lease both over: the runner is gone
    assert (await claim(saga, org_id, session)).entry.entry_id == claimed.entry.entry_id


async def give_up(saga: Saga, org_id: str, session: str) -> tuple[Claim, CompensationFailed]:
    """Claim the top entry and fail it until it exhausts its retries."""
    claimed = await claim(saga, org_id, session)
    for attempt in range(MAX_RETRIES):
        await saga.fail_attempt(
            org_id, claimed.entry.entry_id, f"down {attempt + 1}", claimed.token
        )
    with pytest.raises(CompensationFailed) as raised:
        await saga.fail_attempt(org_id, claimed.entry.entry_id, "still down", claimed.token)
    return claimed, raised.value


async def test_exhausted_retries_escalate_and_stop_the_unwinding(
    saga: Saga, engine: Engine, store: Store, org_id: str
) -> None:
    session = new_session()
    older = await committed(engine, org_id, session, 1)
    newer = await committed(engine, org_id, session, 2)
    await saga.begin(org_id, session)

    claimed, error = await give_up(saga, org_id, session)

    assert (error.code, error.fn_name, error.retries, error.reason) == (
        "compensation_failed",
        "undo_send_email",
        2,
        "still down",
    )
    assert error.message == "Compensation 'undo_send_email' failed after 2 retries: still down"
    [top, bottom] = await stack_of(store, org_id, session)
    assert (top.entry_id, top.state, top.attempts, top.last_error) == (
        claimed.entry.entry_id,
        "failed",
        3,
        "still down",
    )
    assert top.lease_expires_us is None
    assert (bottom.effect_id, bottom.state) == (older, "pending")
    assert await effect_state(store, org_id, newer) == "compensation_failed"
    assert await effect_state(store, org_id, older) == "committed"
    assert await session_state(store, org_id, session) == "compensation_failed"
    assert "compensation_failed" in await event_types(store, org_id, session)


async def test_a_rollback_rerun_without_an_operator_stays_compensation_failed(
    saga: Saga, engine: Engine, store: Store, org_id: str
) -> None:
    session = new_session()
    await committed(engine, org_id, session, 1)
    await committed(engine, org_id, session, 2)
    await saga.begin(org_id, session)
    await give_up(saga, org_id, session)

    await saga.begin(org_id, session)
    assert await saga.claim(org_id, session, "proxy") is RollbackStatus.COMPENSATION_FAILED

    assert await session_state(store, org_id, session) == "compensation_failed"
    assert [e.state for e in await stack_of(store, org_id, session)] == ["failed", "pending"]


async def test_an_operator_retry_reopens_the_entry_with_fresh_retries(
    saga: Saga, engine: Engine, store: Store, org_id: str
) -> None:
    session = new_session()
    older = await committed(engine, org_id, session, 1)
    await committed(engine, org_id, session, 2)
    await saga.begin(org_id, session)
    claimed, _ = await give_up(saga, org_id, session)

    reopened = await saga.retry(org_id, claimed.entry.entry_id)

    assert (reopened.state, reopened.attempts) == ("pending", 0)
    assert await effect_state(store, org_id, claimed.entry.effect_id) == "compensating"
    assert await session_state(store, org_id, session) == "compensating"
    again = await claim(saga, org_id, session)
    assert again.entry.entry_id == claimed.entry.entry_id
    assert again.attempts_left == MAX_RETRIES + 1
    await saga.complete(org_id, again.entry.entry_id, again.token)
    assert (await claim(saga, org_id, session)).entry.effect_id == older
    assert "compensation_retried" in await event_types(store, org_id, session)


async def test_an_operator_resolve_keeps_the_note_and_lets_the_unwinding_go_on(
    saga: Saga, engine: Engine, store: Store, org_id: str
) -> None:
    session = new_session()
    older = await committed(engine, org_id, session, 1)
    await committed(engine, org_id, session, 2)
    await saga.begin(org_id, session)
    claimed, _ = await give_up(saga, org_id, session)

    resolved = await saga.resolve(org_id, claimed.entry.entry_id, "recalled by hand")

    assert (resolved.state, resolved.last_error) == ("resolved", "recalled by hand")
    assert await effect_state(store, org_id, claimed.entry.effect_id) == "compensated"
    assert await session_state(store, org_id, session) == "compensating"
    nxt = await claim(saga, org_id, session)
    assert nxt.entry.effect_id == older
    await saga.complete(org_id, nxt.entry.entry_id, nxt.token)
    assert await saga.claim(org_id, session, "proxy") is RollbackStatus.COMPENSATED
    assert "compensation_resolved" in await event_types(store, org_id, session)


async def test_only_a_failed_entry_can_be_retried_or_resolved(
    saga: Saga, engine: Engine, org_id: str
) -> None:
    session = new_session()
    await committed(engine, org_id, session, 1)
    await saga.begin(org_id, session)
    claimed = await claim(saga, org_id, session)
    for call in refusals(
        lambda: saga.retry(org_id, claimed.entry.entry_id),
        lambda: saga.resolve(org_id, claimed.entry.entry_id, "n/a"),
    ):
        with pytest.raises(InvalidStateTransition):
            await call()
    await saga.complete(org_id, claimed.entry.entry_id, claimed.token)
    for call in refusals(
        lambda: saga.complete(org_id, claimed.entry.entry_id, claimed.token),
        lambda: saga.fail_attempt(org_id, claimed.entry.entry_id, "late", claimed.token),
        lambda: saga.retry(org_id, claimed.entry.entry_id),
    ):
        with pytest.raises(InvalidStateTransition):
            await call()


async def test_a_compensation_registered_after_its_call_ran_violates_the_invariant(
    saga: Saga, engine: Engine, store: Store, org_id: str
) -> None:
    session = new_session()
    effect_id = await committed(engine, org_id, session, 1)
    [pushed] = await stack_of(store, org_id, session)
    async with store.reader() as q:
        record = await q.get_effect(org_id, effect_id)
    assert record is not None and record.executed_us is not None
    assert pushed.registered_us < record.executed_us  # as the engine writes it
    async with store.transaction() as q:
        await q.update_undo_entry(org_id, pushed.entry_id, registered_us=record.executed_us)
    await saga.begin(org_id, session)

    with pytest.raises(CompensationRegisteredTooLate) as raised:
        await saga.claim(org_id, session, "proxy")

    assert raised.value.effect_id == effect_id
    assert [e.state for e in await stack_of(store, org_id, session)] == ["pending"]
    assert await effect_state(store, org_id, effect_id) == "committed"


async def test_a_forward_call_still_running_blocks_the_unwinding(
    saga: Saga, engine: Engine, store: Store, org_id: str
) -> None:
    session = new_session()
    older = await committed(engine, org_id, session, 1)
    running = await engine.intercept(org_id, session, "send_email", EMAIL, step_index=2)
    await saga.begin(org_id, session)

    assert await saga.claim(org_id, session, "proxy") is RollbackStatus.BLOCKED

    assert [e.state for e in await stack_of(store, org_id, session)] == ["pending", "pending"]
    assert await effect_state(store, org_id, older) == "committed"
    await engine.commit(org_id, running.effect_id, "{}")  # the call ends: the unwinding may go on
    assert (await claim(saga, org_id, session)).entry.effect_id == running.effect_id


async def test_an_sdk_entry_waits_for_the_sdk_which_claims_it_by_id(
    saga: Saga, engine: Engine, store: Store, org_id: str
) -> None:
    session = new_session()
    proxy_effect = await committed(engine, org_id, session, 1)
    sdk_effect = await committed(engine, org_id, session, 2, mode="sdk")
    await saga.begin(org_id, session)
    [sdk_entry, proxy_entry] = await stack_of(store, org_id, session)
    assert (sdk_entry.runner, proxy_entry.runner) == ("sdk", "proxy")

    assert await saga.claim(org_id, session, "proxy") is RollbackStatus.WAITING_FOR_RUNNER
    with pytest.raises(InvalidStateTransition):
        await saga.claim_entry(org_id, proxy_entry.entry_id, "sdk")  # not next
    assert [e.state for e in await stack_of(store, org_id, session)] == ["pending", "pending"]
    with pytest.raises(NotFound):
        await saga.claim_entry(org_id, "no-such-entry", "sdk")
    claimed = await saga.claim_entry(org_id, sdk_entry.entry_id, "sdk")
    assert claimed.entry.effect_id == sdk_effect
    assert claimed.payload["original_result"] == {"message_id": "m-2"}
    await saga.complete(org_id, sdk_entry.entry_id, claimed.token)

    assert await saga.claim(org_id, session, "sdk") is RollbackStatus.WAITING_FOR_RUNNER
    assert (await claim(saga, org_id, session)).entry.effect_id == proxy_effect


async def test_claims_survive_a_new_saga_over_the_same_store(
    saga: Saga, engine: Engine, store: Store, clock: Clock, org_id: str
) -> None:
    """A restarted runner (a new Saga) sees a dead one's claim, and takes it after its lease."""
    await idempotent_undo(engine, org_id)
    session = new_session()
    await committed(engine, org_id, session, 1)
    await saga.begin(org_id, session)
    first = await claim(saga, org_id, session)
    restarted = Saga(store, lease_seconds=LEASE_S, clock_us=clock)
    assert await restarted.claim(org_id, session, "proxy") is RollbackStatus.BUSY
    clock.advance(LEASE_S)
    taken = await restarted.claim(org_id, session, "proxy")
    assert isinstance(taken, Claim)
    unclaimed = {"lease_expires_us": None, "updated_us": 0, "claim_token_hash": None}
    assert dataclasses.replace(taken.entry, **unclaimed) == (
        dataclasses.replace(first.entry, **unclaimed)
    )


async def test_a_lapsed_claim_of_a_compensation_not_declared_idempotent_needs_an_operator(
    saga: Saga, engine: Engine, clock: Clock, org_id: str
) -> None:
    """Its runner died mid-run: it may have run. It is not run again; the entry fails with
    a last_error saying so, and once an operator resolves it the unwinding goes on."""
    session = new_session()
    await committed(engine, org_id, session, 1)
    top = await committed(engine, org_id, session, 2)
    await saga.begin(org_id, session)
    claim = await saga.claim(org_id, session, "proxy")
    assert isinstance(claim, Claim) and claim.effect.effect_id == top
    assert claim.idempotent is False
    clock.advance(LEASE_S)  # the runner is gone
    assert await saga.claim(org_id, session, "proxy") is RollbackStatus.COMPENSATION_FAILED
    entry = next(e for e in await stack_of(engine.store, org_id, session) if e.effect_id == top)
    assert (entry.state, entry.last_error) == ("failed", LOST_RUN)
    assert (await engine.get_effect(org_id, top)).state == "compensation_failed"
    await saga.resolve(org_id, entry.entry_id, "checked by hand: the email was recalled")
    await saga.begin(org_id, session)
    nxt = await saga.claim(org_id, session, "proxy")
    assert isinstance(nxt, Claim) and nxt.effect.effect_id != top


async def test_a_report_needs_the_current_claim_token(
    saga: Saga, engine: Engine, store: Store, org_id: str
) -> None:
    """Another caller of the same org cannot settle an entry someone else holds."""
    session = new_session()
    await committed(engine, org_id, session, 1)
    await saga.begin(org_id, session)
    held = await claim(saga, org_id, session)
    entry_id = held.entry.entry_id
    assert len(held.token) >= 32
    for call in refusals(
        lambda: saga.complete(org_id, entry_id, "guessed"),
        lambda: saga.fail_attempt(org_id, entry_id, "x", "guessed"),
        lambda: saga.fail_attempt(org_id, entry_id, "x", ""),
    ):
        with pytest.raises(ClaimNotHeld):
            await call()
    [entry] = await stack_of(store, org_id, session)
    assert (entry.state, entry.attempts, entry.last_error) == ("running", 0, None)
    assert entry.claim_token_hash is not None and held.token not in entry.claim_token_hash
    done = await saga.complete(org_id, entry_id, held.token)
    assert (done.state, done.claim_token_hash) == ("compensated", None)


async def test_a_lapsed_claim_taken_over_invalidates_the_old_token(
    saga: Saga, engine: Engine, clock: Clock, org_id: str
) -> None:
    session = new_session()
    await committed(engine, org_id, session, 1)
    await saga.begin(org_id, session)
    first = await claim(saga, org_id, session)
    await saga.fail_attempt(org_id, first.entry.entry_id, "slow", first.token)  # still held
    clock.advance(LEASE_S + 10)
    second = await claim(saga, org_id, session)
    assert second.entry.entry_id == first.entry.entry_id and second.token != first.token
    for call in refusals(
        lambda: saga.complete(org_id, first.entry.entry_id, first.token),
        lambda: saga.fail_attempt(org_id, first.entry.entry_id, "late", first.token),
    ):
        with pytest.raises(ClaimNotHeld):
            await call()
    done = await saga.complete(org_id, second.entry.entry_id, second.token)
    assert done.state == "compensated"


async def test_an_sdk_entry_is_claimed_only_within_its_hand_off(
    saga: Saga, engine: Engine, store: Store, clock: Clock, org_id: str
) -> None:
    """A claim needs a rollback's hand-off (`waiting_for_runner`): never before, at most one
    lease after it, and once (tests/proxy/test_claim_handoff.py are the attacks)."""
    session = new_session()
    await committed(engine, org_id, session, 1, mode="sdk")
    [entry] = await stack_of(store, org_id, session)
    with pytest.raises(NotHandedOver) as before:
        await saga.claim_entry(org_id, entry.entry_id, "sdk")  # an open session, no undo
    assert (before.value.code, before.value.fields()["entry_id"]) == (
        "invalid_state_transition",
        entry.entry_id,
    )

    await saga.begin(org_id, session)
    assert await saga.claim(org_id, session, "proxy") is RollbackStatus.WAITING_FOR_RUNNER
    [handed_over] = await stack_of(store, org_id, session)
    assert handed_over.handed_until_us == clock.now + LEASE_S * SECOND
    clock.advance(LEASE_S)  # the hand-off lapsed unclaimed
    with pytest.raises(NotHandedOver):
        await saga.claim_entry(org_id, entry.entry_id, "sdk")

    assert await saga.claim(org_id, session, "proxy") is RollbackStatus.WAITING_FOR_RUNNER
    clock.advance(LEASE_S - 1)
    claimed = await saga.claim_entry(org_id, entry.entry_id, "sdk")
    assert claimed.entry.handed_until_us is None  # consumed
    with pytest.raises(InvalidStateTransition):
        await saga.claim_entry(org_id, entry.entry_id, "sdk")
