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
