"""Every row of DESIGN.md's intercept decision table, through the pure `decide`."""

from __future__ import annotations

import dataclasses

import pytest

from undolog.engine.decide import Action, decide
from undolog.engine.states import ApprovalStatus, EffectState, SessionState
from undolog.store.records import EffectRecord
from undolog_sdk.tier import ToolTier

NOW = 1_700_000_000_000_000
SECOND = 1_000_000
NOT_ACTIVE = [s for s in SessionState if s is not SessionState.ACTIVE]

BASE = EffectRecord(
    effect_id="e-1",
    org_id="org-1",
    session_id="5d0f5d8c-0000-4000-8000-000000000001",
    step_index=1,
    tool_name="send_email",
    tool_version="1.0.0",
    tier="compensable",
    call_signature="ab" * 32,
    args_json="{}",
    state="executing",
    mode="proxy",
    attempts=1,
    result_json=None,
    error=None,
    lease_expires_us=NOW + 30 * SECOND,
    executed_us=NOW - SECOND,
    finished_us=None,
    created_us=NOW - SECOND,
    updated_us=NOW - SECOND,
)


def effect(state: EffectState, *, lease: int | None = None) -> EffectRecord:
    return dataclasses.replace(BASE, state=state.value, lease_expires_us=lease)


def run(
    existing: EffectRecord | None,
    *,
    tier: ToolTier = ToolTier.COMPENSABLE,
    session: SessionState = SessionState.ACTIVE,
    approval: ApprovalStatus | None = None,
    idempotent: bool = False,
) -> Action:
    return decide(
        tier=tier,
        existing=existing,
        session_state=session.value,
        approval_status=approval.value if approval else None,
        now_us=NOW,
        idempotent_upstream=idempotent,
    )


# -- no effect yet ----------------------------------------------------------------------------


def test_a_new_compensable_call_executes() -> None:
    assert run(None, tier=ToolTier.COMPENSABLE) is Action.EXECUTE_NEW


def test_a_new_irreversible_call_awaits_approval() -> None:
    assert run(None, tier=ToolTier.IRREVERSIBLE) is Action.AWAIT_NEW


@pytest.mark.parametrize("tier", [ToolTier.COMPENSABLE, ToolTier.IRREVERSIBLE], ids=str)
@pytest.mark.parametrize("session", NOT_ACTIVE, ids=str)
def test_a_new_call_in_a_session_that_is_not_active_is_refused(
    tier: ToolTier, session: SessionState
) -> None:
    assert run(None, tier=tier, session=session) is Action.SESSION_CLOSED


# -- the call ran ----------------------------------------------------------------------------

REPLAYED = [
    EffectState.COMMITTED,
    EffectState.COMPENSATING,
    EffectState.COMPENSATED,
    EffectState.COMPENSATION_FAILED,
]


@pytest.mark.parametrize("tier", [ToolTier.COMPENSABLE, ToolTier.IRREVERSIBLE], ids=str)
@pytest.mark.parametrize("state", REPLAYED, ids=str)
def test_a_call_that_committed_replays_its_result(state: EffectState, tier: ToolTier) -> None:
    assert run(effect(state), tier=tier) is Action.REPLAY


@pytest.mark.parametrize("session", NOT_ACTIVE, ids=str)
def test_a_committed_call_replays_even_after_its_session_closed(session: SessionState) -> None:
    assert run(effect(EffectState.COMMITTED), session=session) is Action.REPLAY


def test_a_failed_call_runs_again_as_a_new_attempt() -> None:
    assert run(effect(EffectState.FAILED)) is Action.RETRY_FAILED


@pytest.mark.parametrize("session", NOT_ACTIVE, ids=str)
def test_a_failed_call_is_not_retried_in_a_session_that_is_not_active(
    session: SessionState,
) -> None:
    assert run(effect(EffectState.FAILED), session=session) is Action.SESSION_CLOSED


# -- approvals -------------------------------------------------------------------------------


@pytest.mark.parametrize("approval", [ApprovalStatus.PENDING, None], ids=str)
def test_a_call_awaiting_a_decision_keeps_awaiting(approval: ApprovalStatus | None) -> None:
    existing = effect(EffectState.AWAITING_APPROVAL)
    assert run(existing, tier=ToolTier.IRREVERSIBLE, approval=approval) is Action.AWAITING


@pytest.mark.parametrize(
    "approval", [ApprovalStatus.APPROVED, ApprovalStatus.AUTO_APPROVED], ids=str
)
def test_an_approved_call_executes(approval: ApprovalStatus) -> None:
    existing = effect(EffectState.AWAITING_APPROVAL)
    assert run(existing, tier=ToolTier.IRREVERSIBLE, approval=approval) is Action.EXECUTE_APPROVED


def test_an_approved_call_does_not_execute_once_its_session_closed() -> None:
    existing = effect(EffectState.AWAITING_APPROVAL)
    action = run(
        existing,
        tier=ToolTier.IRREVERSIBLE,
        approval=ApprovalStatus.APPROVED,
        session=SessionState.HALTED,
    )
    assert action is Action.SESSION_CLOSED


@pytest.mark.parametrize(
    ("approval", "expected"),
    [(ApprovalStatus.REJECTED, Action.REJECTED), (ApprovalStatus.TIMED_OUT, Action.TIMED_OUT)],
    ids=str,
)
def test_a_refused_approval_answers_with_its_refusal(
    approval: ApprovalStatus, expected: Action
) -> None:
    existing = effect(EffectState.AWAITING_APPROVAL)
    assert run(existing, tier=ToolTier.IRREVERSIBLE, approval=approval) is expected


@pytest.mark.parametrize(
    ("state", "expected"),
    [(EffectState.REJECTED, Action.REJECTED), (EffectState.TIMED_OUT, Action.TIMED_OUT)],
    ids=str,
)
def test_an_effect_closed_by_its_approval_answers_with_its_refusal(
    state: EffectState, expected: Action
) -> None:
    assert run(effect(state), tier=ToolTier.IRREVERSIBLE) is expected


# -- executing and the lease -------------------------------------------------------------------


@pytest.mark.parametrize("idempotent", [False, True])
def test_a_call_executing_under_a_live_lease_is_in_progress(idempotent: bool) -> None:
    existing = effect(EffectState.EXECUTING, lease=NOW + 1)
    assert run(existing, idempotent=idempotent) is Action.IN_PROGRESS


@pytest.mark.parametrize("lease", [NOW, NOW - 10 * SECOND, None], ids=["now", "past", "none"])
def test_a_call_whose_lease_expired_goes_in_doubt(lease: int | None) -> None:
    assert run(effect(EffectState.EXECUTING, lease=lease)) is Action.MARK_IN_DOUBT


def test_a_call_whose_lease_expired_reruns_on_an_idempotent_upstream() -> None:
    existing = effect(EffectState.EXECUTING, lease=NOW)
    assert run(existing, idempotent=True) is Action.RERUN


@pytest.mark.parametrize("idempotent", [False, True])
def test_a_call_in_doubt_stays_in_doubt(idempotent: bool) -> None:
    assert run(effect(EffectState.IN_DOUBT), idempotent=idempotent) is Action.IN_DOUBT


def test_the_tier_of_an_existing_effect_does_not_change_its_row() -> None:
    for tier in (ToolTier.COMPENSABLE, ToolTier.IRREVERSIBLE):
        assert run(effect(EffectState.FAILED), tier=tier) is Action.RETRY_FAILED
        assert run(effect(EffectState.IN_DOUBT), tier=tier) is Action.IN_DOUBT
