"""A claim is only good for an entry a rollback handed to the SDK runner (attack tests, both
stores, a real proxy and the org's agent key).

Before: `POST /undo/{entry}/claim` on an entry of an open session claimed it outright, so an
agent refused by a selective undo (409 `dependent_effects`: later calls may rely on the entry)
could claim the entry itself and run its compensation anyway, with no rollback and no `force`.
Now `/claim` answers 409 `invalid_state_transition` unless a rollback (full or selective)
answered `waiting_for_runner` with that entry, within a lease (docs/undo.md).
"""

from __future__ import annotations

import uuid
from typing import Any

import httpx
import pytest

from tests.proxy.conftest import ProxyHarness

pytestmark = pytest.mark.security

TOOL_CALL = "/mcp/tool_call"
LOCAL = {"tier": "compensable", "compensation": {"fn_name": "undo_local", "max_retries": 1}}


def sdk_write(agent: httpx.Client, session: str, step: int) -> str:
    """An SDK-executed compensable call, committed; its undo entry's id."""
    body = {"session_id": session, "tool_name": "local_write", "step_index": step,
            "args": {"n": step}, "mode": "sdk"}  # fmt: skip
    effect = agent.post(TOOL_CALL, json=body).json()["effect_id"]
    agent.post(f"/effects/{effect}/commit", json={"result": {"row": step}}).raise_for_status()
    stack = agent.get(f"/sessions/{session}").json()["undo_stack"]
    return str(next(e["entry_id"] for e in stack if e["effect_id"] == effect))


def two_writes(proxy: ProxyHarness, agent: httpx.Client, session: str) -> tuple[str, str]:
    with proxy.client() as admin:
        admin.put("/tools/local_write", json=LOCAL).raise_for_status()
    return sdk_write(agent, session, 1), sdk_write(agent, session, 2)


def stack_states(agent: httpx.Client, session: str) -> dict[str, Any]:
    data = agent.get(f"/sessions/{session}").json()
    return {
        "session": data["state"],
        "entries": [e["state"] for e in data["undo_stack"]],
        "effects": sorted(e["state"] for e in data["effects"]),
    }


def test_an_agent_cannot_claim_past_a_refused_selective_undo(proxy: ProxyHarness) -> None:
    session = str(uuid.uuid4())
    with proxy.client(proxy.agent_key) as agent:
        first, _second = two_writes(proxy, agent, session)
        refused = agent.post(f"/sessions/{session}/rollback", json={"entries": [first]})
        assert (refused.status_code, refused.json()["code"]) == (409, "dependent_effects")

        # The attack: claim the refused entry directly, then report it compensated.
        claimed = agent.post(f"/undo/{first}/claim")
        token = claimed.json().get("claim_token", "none")
        reported = agent.post(f"/undo/{first}/complete", json={"claim_token": token})
        after = stack_states(agent, session)

    assert claimed.status_code == 409, claimed.text
    body = claimed.json()
    assert body["code"] == "invalid_state_transition"
    assert "claim_token" not in body and "payload" not in body
    assert body["message"] == (
        f"Undo entry '{first}' was not handed to a runner: claim it after "
        "POST /sessions/{id}/rollback answers waiting_for_runner with it as next_entry"
    )
    assert body["entry_id"] == first
    assert reported.status_code == 409, reported.text
    assert after == {
        "session": "active",
        "entries": ["pending", "pending"],
        "effects": ["committed", "committed"],
    }


def test_an_agent_cannot_claim_an_entry_of_an_open_session_nobody_undid(
    proxy: ProxyHarness,
) -> None:
    session = str(uuid.uuid4())
    with proxy.client(proxy.agent_key) as agent:
        _first, second = two_writes(proxy, agent, session)  # the top one: no dependents
        claimed = agent.post(f"/undo/{second}/claim")
        after = stack_states(agent, session)
    assert (claimed.status_code, claimed.json()["code"]) == (409, "invalid_state_transition")
    assert after["entries"] == ["pending", "pending"]


def test_a_forced_selective_undo_hands_the_entry_and_its_claim_works_once(
    proxy: ProxyHarness,
) -> None:
    session = str(uuid.uuid4())
    with proxy.client(proxy.agent_key) as agent:
        first, _second = two_writes(proxy, agent, session)
        handed = agent.post(
            f"/sessions/{session}/rollback", json={"entries": [first], "force": True}
        )
        assert handed.json()["outcome"] == "waiting_for_runner", handed.text
        assert handed.json()["next_entry"]["entry_id"] == first
        claimed = agent.post(f"/undo/{first}/claim")
        again = agent.post(f"/undo/{first}/claim")  # one hand-off, one claim
        token = claimed.json()["claim_token"]
        done = agent.post(f"/undo/{first}/complete", json={"claim_token": token})
        finished = agent.post(
            f"/sessions/{session}/rollback", json={"entries": [first], "force": True}
        )
        after = stack_states(agent, session)

    assert claimed.status_code == 200, claimed.text
    assert (again.status_code, again.json()["code"]) == (409, "invalid_state_transition")
    assert done.json()["state"] == "compensated", done.text
    assert finished.json()["outcome"] == "compensated", finished.text
    assert after == {
        "session": "active",
        "entries": ["pending", "compensated"],
        "effects": ["committed", "compensated"],
    }


def test_a_full_rollback_hands_the_top_entry_only(proxy: ProxyHarness) -> None:
    session = str(uuid.uuid4())
    with proxy.client(proxy.agent_key) as agent:
        first, second = two_writes(proxy, agent, session)
        waiting = agent.post(f"/sessions/{session}/rollback")
        assert waiting.json()["next_entry"]["entry_id"] == second, waiting.text
        early = agent.post(f"/undo/{first}/claim")
        claimed = agent.post(f"/undo/{second}/claim")
    assert (early.status_code, early.json()["code"]) == (409, "invalid_state_transition")
    assert claimed.status_code == 200, claimed.text
