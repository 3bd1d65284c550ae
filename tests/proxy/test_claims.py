"""Claim tokens on undo entries, through a real proxy on both stores (issue 11).

Before: any caller of the org could `POST /undo/{entry}/fail` an entry another runner held,
so a compensation that ran was marked `failed`. Now `/claim` hands the runner a fresh token
and `/complete` and `/fail` require it: 400 without one, 409 `claim_not_held` with one that is
not the entry's current claim (a guess, or the token of a claim that lapsed and was taken over).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from tests.proxy.conftest import ProxyHarness
from tests.support.servers import wait_until

pytestmark = pytest.mark.security

TOOL_CALL = "/mcp/tool_call"
LOCAL = {"tier": "compensable", "compensation": {"fn_name": "undo_local", "max_retries": 1}}
# A lapsed claim is taken over only for a compensation declared idempotent (a runner that
# died mid-run may have run it); any other waits for an operator (tests/proxy/test_rollback*).
LOCAL_IDEMPOTENT = {
    "tier": "compensable",
    "compensation": {"fn_name": "undo_local", "max_retries": 1, "idempotent": True},
}


def sdk_entry(c: httpx.Client, session: str, spec: dict[str, Any] = LOCAL) -> str:
    """A committed SDK-executed call rolled back: its entry waits for an SDK runner."""
    c.put("/tools/local_write", json=spec).raise_for_status()
    body = {"session_id": session, "tool_name": "local_write", "step_index": 1,
            "args": {"n": 1}, "mode": "sdk"}  # fmt: skip
    effect = c.post(TOOL_CALL, json=body).json()["effect_id"]
    c.post(f"/effects/{effect}/commit", json={"result": {"row": 1}}).raise_for_status()
    waiting = c.post(f"/sessions/{session}/rollback").json()
    assert waiting["outcome"] == "waiting_for_runner", waiting
    return str(waiting["next_entry"]["entry_id"])


def near_miss(token: str) -> str:
    """The token with its last character changed (to one it is not already)."""
    return token[:-1] + ("A" if token[-1] != "A" else "B")


def code_of(response: httpx.Response) -> tuple[int, str]:
    return response.status_code, response.json()["code"]


def test_another_caller_cannot_fail_or_complete_an_entry_someone_else_holds(
    proxy: ProxyHarness,
) -> None:
    session = str(uuid.uuid4())
    with proxy.client() as holder, proxy.client() as intruder:
        entry = sdk_entry(holder, session)
        claimed = holder.post(f"/undo/{entry}/claim")
        assert claimed.status_code == 200, claimed.text
        token = claimed.json()["claim_token"]
        assert isinstance(token, str) and len(token) >= 32
        assert claimed.headers["Cache-Control"] == "no-store"

        # The attack of issue 11: fail it twice (max_retries 1) while the holder runs it.
        attempts = [
            intruder.post(f"/undo/{entry}/fail", json={"error": "sabotage"}),
            intruder.post(f"/undo/{entry}/fail", json={"error": "x", "claim_token": "guess"}),
            intruder.post(f"/undo/{entry}/complete"),
            intruder.post(f"/undo/{entry}/complete", json={"claim_token": near_miss(token)}),
            intruder.post(f"/undo/{entry}/fail", json={"error": "x", "claim_token": 7}),
        ]
        still = holder.get(f"/sessions/{session}").json()["undo_stack"][0]
        done = holder.post(f"/undo/{entry}/complete", json={"claim_token": token})
        finished = holder.post(f"/sessions/{session}/rollback")

    assert [code_of(a) for a in attempts] == [
        (400, "invalid_request"),
        (409, "claim_not_held"),
        (400, "invalid_request"),
        (409, "claim_not_held"),
        (400, "invalid_request"),
    ]
    assert "claim_token" in attempts[0].json()["message"]
    assert attempts[1].json()["entry_id"] == entry
    assert (still["state"], still["attempts"], still["last_error"]) == ("running", 0, None)
    assert "claim_token" not in still and "claim_token_hash" not in still
    assert done.status_code == 200, done.text
    assert (done.json()["state"], done.json()["attempts"]) == ("compensated", 1)
    assert finished.json()["outcome"] == "compensated", finished.text


def test_a_token_is_good_for_every_attempt_of_its_claim_and_no_longer(proxy: ProxyHarness) -> None:
    session = str(uuid.uuid4())
    with proxy.client() as c:
        entry = sdk_entry(c, session)
        token = c.post(f"/undo/{entry}/claim").json()["claim_token"]
        once = c.post(f"/undo/{entry}/fail", json={"error": "busy", "claim_token": token})
        done = c.post(f"/undo/{entry}/complete", json={"claim_token": token})
        again = c.post(f"/undo/{entry}/complete", json={"claim_token": token})
    assert (once.json()["state"], once.json()["attempts"]) == ("running", 1)
    assert done.json()["state"] == "compensated"
    assert code_of(again) == (409, "invalid_state_transition")


def test_a_lapsed_claim_taken_over_invalidates_the_old_token(
    proxy_factory: Callable[..., ProxyHarness],
) -> None:
    proxy = proxy_factory(lease_seconds=2.0)
    session = str(uuid.uuid4())
    with proxy.client() as c:
        entry = sdk_entry(c, session, LOCAL_IDEMPOTENT)
        first = c.post(f"/undo/{entry}/claim").json()["claim_token"]
        taken: dict[str, Any] = {}

        def take_over() -> bool:
            # The rollback hands the entry again once the claim's lease lapsed (until then it
            # answers 409 in_progress); only a handed entry may be claimed.
            if c.post(f"/sessions/{session}/rollback").status_code != 200:
                return False
            answer = c.post(f"/undo/{entry}/claim")
            if answer.status_code == 200:
                taken.update(answer.json())
            return answer.status_code == 200

        wait_until(take_over, timeout=30, what="the lapsed claim to be claimed again")
        second = taken["claim_token"]
        late_fail = c.post(f"/undo/{entry}/fail", json={"error": "late", "claim_token": first})
        late_done = c.post(f"/undo/{entry}/complete", json={"claim_token": first})
        done = c.post(f"/undo/{entry}/complete", json={"claim_token": second})
    assert second != first
    assert code_of(late_fail) == (409, "claim_not_held")
    assert code_of(late_done) == (409, "claim_not_held")
    assert done.status_code == 200, done.text
    assert done.json()["state"] == "compensated"
