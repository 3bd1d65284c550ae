"""Lifecycles of effects, sessions, undo entries and approvals, each with one transition table.

These are pure: no I/O, no clock. `check_effect_transition` is the only gate an effect's state
passes through; the engine calls it before every write that moves an effect. The states are
wire values, defined once in the SDK (`undolog_sdk.wire`) and re-exported here.
"""

from __future__ import annotations

from undolog_sdk.errors import InvalidStateTransition, NotExecuting
from undolog_sdk.wire import ApprovalStatus, EffectState, SessionState, UndoState

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
