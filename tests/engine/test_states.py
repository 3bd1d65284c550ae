"""The lifecycles' transition tables and the one gate every effect move passes."""

from __future__ import annotations

import itertools

import pytest

from undolog.engine.states import (
    EFFECT_TRANSITIONS,
    REPLAYABLE_STATES,
    SESSION_TRANSITIONS,
    EffectState,
    SessionState,
    check_effect_transition,
    check_session_transition,
)
from undolog_sdk.errors import InvalidStateTransition, NotExecuting

E = EffectState
S = SessionState

# The effect lifecycle exactly as DESIGN.md ("Concepts", "Effect") and the engine need it.
ALLOWED_EFFECT_MOVES = {
    (E.PENDING, E.EXECUTING),
    (E.PENDING, E.AWAITING_APPROVAL),
    (E.EXECUTING, E.COMMITTED),
    (E.EXECUTING, E.FAILED),
    (E.EXECUTING, E.IN_DOUBT),
    (E.EXECUTING, E.EXECUTING),  # an idempotent upstream re-run after its lease expired
    (E.AWAITING_APPROVAL, E.EXECUTING),
    (E.AWAITING_APPROVAL, E.REJECTED),
    (E.AWAITING_APPROVAL, E.TIMED_OUT),
    (E.COMMITTED, E.COMPENSATING),
    (E.FAILED, E.EXECUTING),  # a retry is a new attempt
    (E.IN_DOUBT, E.COMMITTED),  # resolved
    (E.IN_DOUBT, E.FAILED),  # resolved
    (E.COMPENSATING, E.COMPENSATED),
    (E.COMPENSATING, E.COMPENSATION_FAILED),
    (E.COMPENSATION_FAILED, E.COMPENSATING),
    (E.COMPENSATION_FAILED, E.COMPENSATED),
}
ILLEGAL_EFFECT_MOVES = sorted(
    set(itertools.product(E, E)) - ALLOWED_EFFECT_MOVES, key=lambda m: (m[0].value, m[1].value)
)

ALLOWED_SESSION_MOVES = {
    (S.ACTIVE, S.COMPLETED),
    (S.ACTIVE, S.FAILED),
    (S.ACTIVE, S.COMPENSATING),
    (S.ACTIVE, S.HALTED),
    (S.FAILED, S.COMPENSATING),
    (S.HALTED, S.COMPENSATING),
    (S.COMPENSATING, S.COMPENSATED),
    (S.COMPENSATING, S.COMPENSATION_FAILED),
    (S.COMPENSATION_FAILED, S.COMPENSATING),
    (S.COMPENSATION_FAILED, S.COMPENSATED),
}


def move_id(move: tuple[EffectState | SessionState, EffectState | SessionState]) -> str:
    return f"{move[0].value}->{move[1].value}"


def test_the_effect_table_has_a_row_for_every_state_and_exactly_the_designed_moves() -> None:
    assert set(EFFECT_TRANSITIONS) == set(E)
    table = {(cur, tgt) for cur, targets in EFFECT_TRANSITIONS.items() for tgt in targets}
    assert table == ALLOWED_EFFECT_MOVES


def test_the_session_table_has_a_row_for_every_state_and_exactly_the_designed_moves() -> None:
    assert set(SESSION_TRANSITIONS) == set(S)
    table = {(cur, tgt) for cur, targets in SESSION_TRANSITIONS.items() for tgt in targets}
    assert table == ALLOWED_SESSION_MOVES


@pytest.mark.parametrize("move", sorted(ALLOWED_EFFECT_MOVES), ids=move_id)
def test_every_allowed_effect_move_passes(move: tuple[EffectState, EffectState]) -> None:
    check_effect_transition("e-1", move[0].value, move[1].value)


@pytest.mark.parametrize(
    "move", [m for m in ILLEGAL_EFFECT_MOVES if m[1] is not E.COMMITTED], ids=move_id
)
def test_an_illegal_effect_move_raises_invalid_state_transition(
    move: tuple[EffectState, EffectState],
) -> None:
    with pytest.raises(InvalidStateTransition) as caught:
        check_effect_transition("e-1", move[0].value, move[1].value)
    error = caught.value
    assert error.code == "invalid_state_transition"
    assert (error.effect_id, error.current_state, error.target_state) == (
        "e-1",
        move[0].value,
        move[1].value,
    )


@pytest.mark.parametrize(
    "current", [cur for cur, tgt in ILLEGAL_EFFECT_MOVES if tgt is E.COMMITTED], ids=str
)
def test_committing_an_effect_that_is_not_executing_raises_not_executing(
    current: EffectState,
) -> None:
    with pytest.raises(NotExecuting) as caught:
        check_effect_transition("e-1", current.value, E.COMMITTED.value)
    assert (caught.value.code, caught.value.effect_id) == ("not_executing", "e-1")


def test_the_refusals_carry_the_reference_messages() -> None:
    with pytest.raises(InvalidStateTransition) as invalid:
        check_effect_transition("e-42", "committed", "executing")
    assert (
        str(invalid.value)
        == "Effect 'e-42' is in state 'committed', cannot transition to 'executing'"
    )
    with pytest.raises(NotExecuting) as not_executing:
        check_effect_transition("e-42", "failed", "committed")
    assert str(not_executing.value) == "Cannot commit effect 'e-42': not in 'executing' state"


def test_nothing_moves_back_to_pending_and_rejected_timed_out_compensated_are_final() -> None:
    assert all(E.PENDING not in targets for targets in EFFECT_TRANSITIONS.values())
    for final in (E.REJECTED, E.TIMED_OUT, E.COMPENSATED):
        assert EFFECT_TRANSITIONS[final] == frozenset()


def test_replayable_states_are_committed_and_everything_reachable_only_through_it() -> None:
    reachable = {E.COMMITTED}
    frontier = [E.COMMITTED]
    while frontier:
        for nxt in EFFECT_TRANSITIONS[frontier.pop()]:
            if nxt not in reachable:
                reachable.add(nxt)
                frontier.append(nxt)
    assert reachable == REPLAYABLE_STATES


def test_an_unknown_state_name_is_refused() -> None:
    with pytest.raises(ValueError):
        check_effect_transition("e-1", "replayed", "committed")


@pytest.mark.parametrize("move", sorted(ALLOWED_SESSION_MOVES), ids=move_id)
def test_every_allowed_session_move_passes(move: tuple[SessionState, SessionState]) -> None:
    check_session_transition("s-1", move[0].value, move[1].value)


@pytest.mark.parametrize(
    "move",
    [
        (S.COMPLETED, S.ACTIVE),
        (S.COMPLETED, S.COMPENSATING),
        (S.COMPENSATED, S.ACTIVE),
        (S.FAILED, S.ACTIVE),
        (S.HALTED, S.ACTIVE),
        (S.ACTIVE, S.COMPENSATED),
        (S.ACTIVE, S.ACTIVE),
    ],
    ids=move_id,
)
def test_an_illegal_session_move_raises_invalid_state_transition(
    move: tuple[SessionState, SessionState],
) -> None:
    with pytest.raises(InvalidStateTransition) as caught:
        check_session_transition("s-1", move[0].value, move[1].value)
    assert (caught.value.current_state, caught.value.target_state) == (
        move[0].value,
        move[1].value,
    )
