"""`UndoLogSession`: a v4 session id by default, steps 1, 2, 3, …, an async context manager."""

from __future__ import annotations

import uuid

import pytest

from undolog_sdk.session import UndoLogSession


def test_the_default_session_id_is_a_fresh_uuid4_string() -> None:
    first = UndoLogSession(org_id="org-a")
    second = UndoLogSession(org_id="org-a")
    assert isinstance(first.session_id, str)
    parsed = uuid.UUID(first.session_id)
    assert parsed.version == 4
    assert str(parsed) == first.session_id
    assert first.session_id != second.session_id


def test_a_given_session_id_is_kept() -> None:
    session_id = str(uuid.uuid4())
    assert UndoLogSession(org_id="org-a", session_id=session_id).session_id == session_id


def test_next_step_returns_one_then_two_then_three() -> None:
    session = UndoLogSession(org_id="org-a")
    assert session._step_index == 0
    assert [session.next_step() for _ in range(3)] == [1, 2, 3]


def test_a_call_ids_step_is_fixed_and_never_a_counter_step() -> None:
    first, other = UndoLogSession(org_id="org-a"), UndoLogSession(org_id="org-b")
    step = first.step_for_call("call_abc123")
    # Pinned: a run saved by one version of the SDK and resumed by another signs the call
    # the same way only while this number stays what it is.
    assert step == 3_527_047_635
    assert other.step_for_call("call_abc123") == step
    assert 2**31 <= step < 2**32  # the counter's steps are 1, 2, 3...: never this high
    assert first.step_for_call("call_abc124") != step
    assert first._step_index == 0  # the counter is untouched
    with pytest.raises(ValueError, match="must not be empty"):
        first.step_for_call("")


def test_the_step_counter_is_not_in_the_repr() -> None:
    session = UndoLogSession(org_id="org-a", session_id="6f1c2d3e-4b5a-4c6d-8e7f-9a0b1c2d3e4f")
    session.next_step()
    text = repr(session)
    assert "_step_index" not in text
    assert "org-a" in text and "6f1c2d3e-4b5a-4c6d-8e7f-9a0b1c2d3e4f" in text


async def test_the_session_is_an_async_context_manager_that_yields_itself() -> None:
    session = UndoLogSession(org_id="org-a")
    async with session as entered:
        assert entered is session
        assert entered.next_step() == 1


async def test_leaving_the_session_with_an_error_lets_the_error_through() -> None:
    class Boom(Exception):
        pass

    with pytest.raises(Boom):
        async with UndoLogSession(org_id="org-a"):
            raise Boom
