"""Lifecycles of effects, sessions, undo entries and approvals, each with one transition table.

These are pure: no I/O, no clock. `check_effect_transition` is the only gate an effect's state
passes through; the engine calls it before every write that moves an effect.
"""

from __future__ import annotations

import enum

from undolog_sdk.errors import InvalidStateTransition, NotExecuting

__all__ = [
    "EFFECT_TRANSITIONS",
    "REPLAYABLE_STATES",
    "SESSION_TRANSITIONS",
    "ApprovalStatus",
    "EffectState",
    "SessionState",
    "UndoState",
    "check_effect_transition",
    "check_session_transition",
]


class EffectState(enum.StrEnum):
    PENDING = "pending"  # intent recorded, nothing decided yet (never stored past its txn)
    EXECUTING = "executing"  # the tool may be running; guarded by a lease
    COMMITTED = "committed"  # ran and its result is recorded: retries replay it
    FAILED = "failed"  # ran and failed: a retry is a new attempt on the same effect
    AWAITING_APPROVAL = "awaiting_approval"  # IRREVERSIBLE: waits for a person
    REJECTED = "rejected"  # a person said no
    TIMED_OUT = "timed_out"  # nobody decided in time, and the org does not auto-approve
    IN_DOUBT = "in_doubt"  # the lease expired mid-run: outcome unknown until resolved
    COMPENSATING = "compensating"  # its compensation is running
    COMPENSATED = "compensated"  # undone
    COMPENSATION_FAILED = "compensation_failed"  # the undo gave up: a person must act


class SessionState(enum.StrEnum):
    ACTIVE = "active"  # accepting calls
    COMPLETED = "completed"  # ended normally
    FAILED = "failed"  # ended badly; may be rolled back
    COMPENSATING = "compensating"  # its undo stack is unwinding
    COMPENSATED = "compensated"  # everything undoable was undone
    COMPENSATION_FAILED = "compensation_failed"  # the unwinding stopped at a failed entry
    HALTED = "halted"  # a person rejected one of its calls


class UndoState(enum.StrEnum):
    PENDING = "pending"  # on the stack, not run
    RUNNING = "running"  # claimed by a runner
    COMPENSATED = "compensated"  # ran successfully
    FAILED = "failed"  # exhausted its retries
    SKIPPED = "skipped"  # its forward call never committed: nothing to undo
    RESOLVED = "resolved"  # an operator marked it handled by hand


class ApprovalStatus(enum.StrEnum):
    PENDING = "pending"
    APPROVED = "approved"
    REJECTED = "rejected"
    TIMED_OUT = "timed_out"
    AUTO_APPROVED = "auto_approved"


_E = EffectState
EFFECT_TRANSITIONS: dict[EffectState, frozenset[EffectState]] = {
    _E.PENDING: frozenset({_E.EXECUTING, _E.AWAITING_APPROVAL}),
    # executing → executing: a new attempt of an idempotent upstream after its lease expired.
    _E.EXECUTING: frozenset({_E.COMMITTED, _E.FAILED, _E.IN_DOUBT, _E.EXECUTING}),
    _E.AWAITING_APPROVAL: frozenset({_E.EXECUTING, _E.REJECTED, _E.TIMED_OUT}),
    _E.COMMITTED: frozenset({_E.COMPENSATING}),
    _E.FAILED: frozenset({_E.EXECUTING}),
    # The runner that outlived its lease (or an operator) still knows the real outcome.
    _E.IN_DOUBT: frozenset({_E.COMMITTED, _E.FAILED}),
    _E.COMPENSATING: frozenset({_E.COMPENSATED, _E.COMPENSATION_FAILED}),
    _E.COMPENSATION_FAILED: frozenset({_E.COMPENSATING, _E.COMPENSATED}),
    _E.REJECTED: frozenset(),
    _E.TIMED_OUT: frozenset(),
    _E.COMPENSATED: frozenset(),
}

# States whose recorded result a retry of the same call gets back: the tool ran and committed.
REPLAYABLE_STATES = frozenset(
    {_E.COMMITTED, _E.COMPENSATING, _E.COMPENSATED, _E.COMPENSATION_FAILED}
)

_S = SessionState
SESSION_TRANSITIONS: dict[SessionState, frozenset[SessionState]] = {
    _S.ACTIVE: frozenset({_S.COMPLETED, _S.FAILED, _S.COMPENSATING, _S.HALTED}),
    _S.FAILED: frozenset({_S.COMPENSATING}),
    _S.HALTED: frozenset({_S.COMPENSATING}),
    _S.COMPENSATING: frozenset({_S.COMPENSATED, _S.COMPENSATION_FAILED}),
    _S.COMPENSATION_FAILED: frozenset({_S.COMPENSATING, _S.COMPENSATED}),
    _S.COMPLETED: frozenset(),
    _S.COMPENSATED: frozenset(),
}


def check_effect_transition(effect_id: str, current: str, target: str) -> None:
    """Refuse an illegal move of an effect.

    Raises:
        NotExecuting: a commit (→ committed) of an effect that is not executing.
        InvalidStateTransition: any other move the table does not allow.
    """
    cur, tgt = EffectState(current), EffectState(target)
    if tgt in EFFECT_TRANSITIONS[cur]:
        return
    if tgt is EffectState.COMMITTED:
        raise NotExecuting(effect_id)
    raise InvalidStateTransition(effect_id, cur.value, tgt.value)


def check_session_transition(session_id: str, current: str, target: str) -> None:
    cur, tgt = SessionState(current), SessionState(target)
    if tgt not in SESSION_TRANSITIONS[cur]:
        raise InvalidStateTransition(session_id, cur.value, tgt.value)
