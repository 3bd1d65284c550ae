"""The intercept decision table as one pure function (its outcomes: `Action`).

Given what the store holds for a call (the existing effect, its approval, the session) and the
tool's tier, `decide` names the action; the engine carries it out inside the intercept
transaction. Keeping the table here, free of I/O, lets every row be tested directly.
"""

from __future__ import annotations

import enum

from undolog.engine.states import REPLAYABLE_STATES, ApprovalStatus, EffectState, SessionState
from undolog.store.records import EffectRecord
from undolog_sdk.tier import ToolTier

__all__ = ["Action", "decide"]


class Action(enum.Enum):
    EXECUTE_NEW = "execute_new"  # insert executing (+ undo entry for COMPENSABLE) → Execute
    AWAIT_NEW = "await_new"  # insert awaiting_approval + approval → AwaitingApproval
    REPLAY = "replay"  # committed: hand back the recorded result
    AWAITING = "awaiting"  # still awaiting: the same approval id
    EXECUTE_APPROVED = "execute_approved"  # approved (by a person or by policy): run it now
    IN_PROGRESS = "in_progress"  # executing under a live lease: 409 in_progress
    MARK_IN_DOUBT = "mark_in_doubt"  # lease expired, not idempotent: move to in_doubt, 409
    IN_DOUBT = "in_doubt"  # already in doubt: 409 effect_in_doubt
    RERUN = "rerun"  # lease expired on an idempotent upstream: run again, same key
    RETRY_FAILED = "retry_failed"  # failed before: a new attempt on the same effect
    REJECTED = "rejected"  # 409 approval_rejected
    TIMED_OUT = "timed_out"  # 409 approval_timed_out
    SESSION_CLOSED = "session_closed"  # 409 session_closed
    DENY_NEW = "deny_new"  # a policy rule denies a new call: 403 policy_denied, only an event


def decide(
    *,
    tier: ToolTier,
    existing: EffectRecord | None,
    session_state: str,
    approval_status: str | None,
    now_us: int,
    idempotent_upstream: bool,
    rule_action: str | None = None,
) -> Action:
    """The action for one intercepted (non-SAFE) call. Each outcome is one `Action` member.

    `rule_action` is the action of the org's policy rule the call matched (`approve`, `deny`,
    `require`; None: no rule). It decides a new call only: a recorded call keeps its recorded
    decision whatever the rules say now (docs/approvals.md).
    """
    active = session_state == SessionState.ACTIVE
    if existing is None:
        if not active:
            return Action.SESSION_CLOSED
        if rule_action == "deny":
            return Action.DENY_NEW
        if rule_action == "require":
            return Action.AWAIT_NEW
        if rule_action == "approve":
            return Action.EXECUTE_NEW
        return Action.AWAIT_NEW if tier.requires_approval else Action.EXECUTE_NEW

    state = existing.state
    if state in REPLAYABLE_STATES:
        return Action.REPLAY
    if state == EffectState.AWAITING_APPROVAL:
        if approval_status in (ApprovalStatus.APPROVED, ApprovalStatus.AUTO_APPROVED):
            return Action.EXECUTE_APPROVED if active else Action.SESSION_CLOSED
        if approval_status == ApprovalStatus.REJECTED:
            return Action.REJECTED
        if approval_status == ApprovalStatus.TIMED_OUT:
            return Action.TIMED_OUT
        return Action.AWAITING
    if state == EffectState.EXECUTING:
        lease = existing.lease_expires_us
        if lease is not None and lease > now_us:
            return Action.IN_PROGRESS
        return Action.RERUN if idempotent_upstream else Action.MARK_IN_DOUBT
    if state == EffectState.IN_DOUBT:
        return Action.IN_DOUBT
    if state == EffectState.FAILED:
        return Action.RETRY_FAILED if active else Action.SESSION_CLOSED
    if state == EffectState.REJECTED:
        return Action.REJECTED
    if state == EffectState.TIMED_OUT:
        return Action.TIMED_OUT
    # pending is never visible outside its transaction; treat anything unknown as closed.
    return Action.SESSION_CLOSED
