"""Rollback through a real proxy in front of the demo tool server, on both stores.

`POST /sessions/{id}/rollback` unwinds the undo stack newest first; the demo upstream's call
log (`/calls`), per-key counters (`/counters/{tool}`, `/executions/{tool}`) and state
(`/state`) show what really ran. Compensation failures are injected per test by registering a
tool whose compensation carries `fail_times` (the demo compensations fail that many times per
idempotency key, then succeed). The operator commands (`undolog sessions ...`,
`undolog undo ...`) run as child processes against the same proxy.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import uuid
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import httpx
import orjson
import pytest

from tests.proxy.conftest import ProxyHarness
from tests.support.servers import undolog_command
from undolog.store import EventRecord, Queries, open_store

T = TypeVar("T")

TOOL_CALL = "/mcp/tool_call"
EMAIL = {"to": "ada@example.com", "subject": "Your refund"}
TRANSFER = {"from_account": "ops", "to_account": "ada", "amount": 120}
RECORD = {"table": "refunds", "data": {"id": 7}}
WRITES: list[tuple[str, dict[str, Any]]] = [
    ("send_email", EMAIL),
    ("transfer_funds", TRANSFER),
    ("create_record", RECORD),
]
COMPENSATIONS = ("undo_send_email", "reverse_transfer", "delete_record", "echo")


def new_session() -> str:
    return str(uuid.uuid4())


def call(
    client: httpx.Client, session: str, tool: str, args: dict[str, Any], step: int, **extra: Any
) -> httpx.Response:
    body = {"session_id": session, "tool_name": tool, "step_index": step, "args": args, **extra}
    return client.post(TOOL_CALL, json=body)


def executed(client: httpx.Client, session: str, tool: str, args: dict[str, Any], step: int) -> Any:
    """Make a call that must run; its ToolResult."""
    response = call(client, session, tool, args, step)
    assert response.status_code == 200, response.text
    assert response.json()["status"] == "executed", response.text
    return response.json()["result"]


def rollback(client: httpx.Client, session: str) -> httpx.Response:
    return client.post(f"/sessions/{session}/rollback")


def view(client: httpx.Client, session: str) -> dict[str, Any]:
    response = client.get(f"/sessions/{session}")
    assert response.status_code == 200, response.text
    data: dict[str, Any] = response.json()
    return data


def register(client: httpx.Client, name: str, fn_name: str, **compensation: Any) -> None:
    """Register `name` (a demo upstream tool) with a compensation of our own."""
    spec = {
        "tier": "compensable",
        "compensation": {"fn_name": fn_name, "max_retries": 3, "retry_backoff_ms": 10,
                         **compensation},
    }  # fmt: skip
    client.put(f"/tools/{name}", json=spec).raise_for_status()


def compensation_calls(proxy: ProxyHarness, session: str) -> list[dict[str, Any]]:
    with proxy.upstream() as upstream:
        calls: list[dict[str, Any]] = upstream.get("/calls").json()
    return [c for c in calls if c["session_id"] == session and c["tool"] in COMPENSATIONS]


def executions(proxy: ProxyHarness, tool: str) -> dict[str, int]:
    with proxy.upstream() as upstream:
        data: dict[str, int] = upstream.get(f"/executions/{tool}").json()
    return data


def upstream_state(proxy: ProxyHarness) -> dict[str, Any]:
    with proxy.upstream() as upstream:
        data: dict[str, Any] = upstream.get("/state").json()
    return data


def on_store(proxy: ProxyHarness, work: Callable[[Queries], Awaitable[T]], *, write: bool) -> T:
    """Run `work` on the proxy's store, from the test's side."""

    async def run() -> T:
        store = await open_store(proxy.database_url)
        try:
            async with store.transaction() if write else store.reader() as q:
                return await work(q)
        finally:
            await store.close()

    return asyncio.run(run())


def events(proxy: ProxyHarness, session: str) -> list[EventRecord]:
    return on_store(proxy, lambda q: q.list_events(proxy.org_id, session_id=session), write=False)


def entry_of(data: dict[str, Any], effect_id: str) -> dict[str, Any]:
    [entry] = [u for u in data["undo_stack"] if u["effect_id"] == effect_id]
    found: dict[str, Any] = entry
    return found


def effect_of(data: dict[str, Any], effect_id: str) -> dict[str, Any]:
    [effect] = [e for e in data["effects"] if e["effect_id"] == effect_id]
    found: dict[str, Any] = effect
    return found


def three_writes(client: httpx.Client, session: str) -> list[tuple[str, dict[str, Any], Any]]:
    """send_email, transfer_funds, create_record: (effect id, args, ToolResult) oldest first."""
    done: list[tuple[str, dict[str, Any], Any]] = []
    for step, (tool, args) in enumerate(WRITES, 1):
        response = call(client, session, tool, args, step)
        assert response.json()["status"] == "executed", response.text
        done.append((response.json()["effect_id"], args, response.json()["result"]))
    return done


def cli(proxy: ProxyHarness, *args: str) -> subprocess.CompletedProcess[str]:
    """`undolog <args> --url <proxy> --api-key <key>` as a child process."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("UNDOLOG_")}
    return subprocess.run(
        undolog_command(*args, "--url", proxy.url, "--api-key", proxy.api_key),
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


# -- the happy path ------------------------------------------------------------------------------


def test_a_rollback_runs_each_compensation_newest_first_with_the_forward_call(
    proxy: ProxyHarness,
) -> None:
    session = new_session()
    with proxy.client() as client:
        writes = three_writes(client, session)
        answer = rollback(client, session)
        data = view(client, session)

    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert (body["session_id"], body["outcome"], body["state"]) == (
        session,
        "compensated",
        "compensated",
    )
    assert body["next_entry"] is None
    assert [u["state"] for u in body["undo_stack"]] == ["compensated"] * 3
    calls = compensation_calls(proxy, session)
    assert [c["tool"] for c in calls] == ["delete_record", "reverse_transfer", "undo_send_email"]
    for made, (effect_id, args, result) in zip(calls, reversed(writes), strict=True):
        entry = entry_of(data, effect_id)
        assert made["idempotency_key"] == entry["entry_id"]
        assert made["effect_id"] == effect_id
        assert made["args"] == {"original_args": args, "original_result": result}
        assert (entry["state"], entry["attempts"]) == ("compensated", 1)
        assert effect_of(data, effect_id)["state"] == "compensated"
    assert data["state"] == "compensated"


def test_a_rollback_restores_the_upstream_state(proxy: ProxyHarness) -> None:
    session = new_session()
    with proxy.client() as client:
        [(_, _, email), (_, _, _), (_, _, record)] = three_writes(client, session)
        before = upstream_state(proxy)
        assert before["balances"] == {"ops": 880, "ada": 1120}
        assert rollback(client, session).json()["outcome"] == "compensated"

    after = upstream_state(proxy)
    assert after["messages"][email["output"]["message_id"]]["status"] == "recalled"
    assert after["balances"] == {"ops": 1000, "ada": 1000}
    assert after["records"][record["output"]["record_id"]]["status"] == "deleted"
    [transfer] = after["transfers"].values()
    assert transfer["status"] == "reversed"


def test_captured_compensation_args_reach_the_compensation(proxy: ProxyHarness) -> None:
    session = new_session()
    with proxy.client() as client:
        register(client, "create_record", "delete_record", args={"reason": "rollback"})
        result = executed(client, session, "create_record", RECORD, 1)
        assert rollback(client, session).json()["outcome"] == "compensated"

    [made] = compensation_calls(proxy, session)
    assert made["args"] == {
        "reason": "rollback",
        "original_args": RECORD,
        "original_result": result,
    }


def test_the_rollback_events_are_in_the_log(proxy: ProxyHarness) -> None:
    session = new_session()
    with proxy.client() as client:
        three_writes(client, session)
        rollback(client, session)

    types = [e.type for e in events(proxy, session)]
    assert types.count("session_compensating") == 1
    assert types.count("compensation_started") == 3
    assert types.count("compensation_completed") == 3
    assert types[-1] == "session_compensated"


def test_a_second_rollback_is_idempotent_and_calls_nothing_again(proxy: ProxyHarness) -> None:
    session = new_session()
    with proxy.client() as client:
        three_writes(client, session)
        first = rollback(client, session)
        calls = compensation_calls(proxy, session)
        second = rollback(client, session)

    assert (first.status_code, second.status_code) == (200, 200)
    assert second.json()["outcome"] == "compensated"
    assert second.json()["undo_stack"] == first.json()["undo_stack"]
    assert compensation_calls(proxy, session) == calls
    assert all(n == 1 for n in executions(proxy, "reverse_transfer").values())


def test_a_session_with_an_empty_undo_stack_answers_the_informational_outcome(
    proxy: ProxyHarness,
) -> None:
    session = new_session()
    with proxy.client() as client:
        waiting = call(client, session, "delete_database", {"db_name": "staging"}, 1)
        assert waiting.status_code == 202, waiting.text
        answer = rollback(client, session)
        again = rollback(client, session)

    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert (body["outcome"], body["code"], body["state"]) == (
        "empty_undo_stack",
        "empty_undo_stack",
        "compensated",
    )
    assert body["message"] == f"Undo stack for session '{session}' is empty"
    assert body["undo_stack"] == []
    assert again.status_code == 200
    assert again.json()["state"] == "compensated"


def test_failed_and_logically_failed_calls_are_skipped_not_compensated(
    proxy: ProxyHarness,
) -> None:
    session = new_session()
    with proxy.client() as client:
        sent = call(client, session, "send_email", EMAIL, 1).json()["effect_id"]
        # Idempotent: its broken answer fails it (a retry may run it again), not in doubt.
        spec = {"tier": "compensable", "compensation": {"fn_name": "echo"},
                "idempotent_upstream": True}  # fmt: skip
        client.put("/tools/broken", json=spec).raise_for_status()
        broken = call(client, session, "broken", {"n": 1}, 2)
        assert (broken.status_code, broken.json()["code"]) == (502, "tool_error")
        said_no = call(client, session, "fail", {"n": 1}, 3)
        assert said_no.json()["result"]["success"] is False
        answer = rollback(client, session)
        data = view(client, session)

    assert answer.json()["outcome"] == "compensated", answer.text
    by_step = {e["step_index"]: e for e in data["effects"]}
    assert [by_step[s]["state"] for s in (1, 2, 3)] == ["compensated", "failed", "committed"]
    assert by_step[3]["effect_id"] == said_no.json()["effect_id"]
    states = {u["effect_id"]: u["state"] for u in data["undo_stack"]}
    assert states == {
        sent: "compensated",
        by_step[2]["effect_id"]: "skipped",
        by_step[3]["effect_id"]: "skipped",
    }
    assert [c["tool"] for c in compensation_calls(proxy, session)] == ["undo_send_email"]


# -- retries and escalation ----------------------------------------------------------------------


def test_a_compensation_that_fails_twice_then_succeeds_takes_three_attempts_under_one_key(
    proxy: ProxyHarness,
) -> None:
    session = new_session()
    with proxy.client() as client:
        register(client, "send_email", "undo_send_email", args={"fail_times": 2})
        email = call(client, session, "send_email", EMAIL, 1).json()["effect_id"]
        answer = rollback(client, session)
        data = view(client, session)

    assert answer.status_code == 200, answer.text
    assert answer.json()["outcome"] == "compensated"
    entry = entry_of(data, email)
    assert (entry["state"], entry["attempts"], entry["last_error"]) == ("compensated", 3, None)
    assert proxy.counters("undo_send_email") == {entry["entry_id"]: 3}
    assert executions(proxy, "undo_send_email") == {entry["entry_id"]: 1}
    assert [e.type for e in events(proxy, session)].count("compensation_retrying") == 2


def escalated(
    proxy: ProxyHarness, client: httpx.Client, session: str
) -> tuple[str, str, httpx.Response]:
    """An email (older) and a transfer whose reversal never succeeds, rolled back once.

    Returns (email effect id, transfer effect id, the rollback's answer).
    """
    register(client, "transfer_funds", "reverse_transfer", args={"fail_times": 1000},
             max_retries=2)  # fmt: skip
    email = call(client, session, "send_email", EMAIL, 1).json()["effect_id"]
    transfer = call(client, session, "transfer_funds", TRANSFER, 2).json()["effect_id"]
    answer = rollback(client, session)
    assert answer.status_code == 502, answer.text
    return email, transfer, answer


def test_a_compensation_that_never_succeeds_escalates_and_stops_the_unwinding(
    proxy: ProxyHarness,
) -> None:
    session = new_session()
    with proxy.client() as client:
        email, transfer, answer = escalated(proxy, client, session)
        data = view(client, session)

    body = answer.json()
    reason = "reverse_transfer: injected failure 3 of 1000"
    assert (body["code"], body["outcome"], body["state"]) == (
        "compensation_failed",
        "compensation_failed",
        "compensation_failed",
    )
    assert body["message"] == f"Compensation 'reverse_transfer' failed after 2 retries: {reason}"
    assert (body["fn_name"], body["retries"], body["reason"]) == ("reverse_transfer", 2, reason)
    assert answer.headers["X-Request-Id"] == body["request_id"]
    failed = entry_of(data, transfer)
    assert (failed["state"], failed["attempts"], failed["last_error"]) == ("failed", 3, reason)
    assert body["next_entry"] == failed
    assert effect_of(data, transfer)["state"] == "compensation_failed"
    assert data["state"] == "compensation_failed"
    assert entry_of(data, email)["state"] == "pending"  # older entries are not run past it
    assert effect_of(data, email)["state"] == "committed"
    assert [c["tool"] for c in compensation_calls(proxy, session)] == ["reverse_transfer"] * 3
    [event] = [e for e in events(proxy, session) if e.type == "compensation_failed"]
    payload = orjson.loads(event.payload_json)
    assert (event.effect_id, payload["entry_id"], payload["error"]) == (
        transfer,
        failed["entry_id"],
        reason,
    )


def test_a_rerun_before_an_operator_acts_runs_nothing_and_stays_failed(
    proxy: ProxyHarness,
) -> None:
    session = new_session()
    with proxy.client() as client:
        escalated(proxy, client, session)
        calls = compensation_calls(proxy, session)
        again = rollback(client, session)
        data = view(client, session)

    assert (again.status_code, again.json()["code"]) == (502, "compensation_failed")
    assert again.json()["state"] == "compensation_failed"
    assert data["state"] == "compensation_failed"
    assert compensation_calls(proxy, session) == calls


def test_resolving_the_failed_entry_with_a_note_lets_the_unwinding_go_on(
    proxy: ProxyHarness,
) -> None:
    session = new_session()
    with proxy.client() as client:
        email, transfer, failed = escalated(proxy, client, session)
        entry_id = entry_of(failed.json(), transfer)["entry_id"]
        resolved = client.post(f"/undo/{entry_id}/resolve", json={"note": "reversed by hand"})
        assert resolved.status_code == 200, resolved.text
        assert (resolved.json()["state"], resolved.json()["last_error"]) == (
            "resolved",
            "resolved by key:admin: reversed by hand",  # who resolved it, from the key
        )
        assert view(client, session)["state"] == "compensating"
        answer = rollback(client, session)
        data = view(client, session)

    assert answer.status_code == 200, answer.text
    assert answer.json()["outcome"] == "compensated"
    assert (entry_of(data, transfer)["state"], entry_of(data, transfer)["last_error"]) == (
        "resolved",
        "resolved by key:admin: reversed by hand",
    )
    assert effect_of(data, transfer)["state"] == "compensated"
    assert entry_of(data, email)["state"] == "compensated"
    assert data["state"] == "compensated"
    tools = [c["tool"] for c in compensation_calls(proxy, session)]
    assert tools == ["reverse_transfer"] * 3 + ["undo_send_email"]
    [event] = [e for e in events(proxy, session) if e.type == "compensation_resolved"]
    assert orjson.loads(event.payload_json)["note"] == "resolved by key:admin: reversed by hand"


def test_an_operator_retry_after_the_upstream_recovers_finishes_the_rollback(
    proxy: ProxyHarness,
) -> None:
    # Three failures per key, two retries: the rollback gives up; the retry's first call works.
    session = new_session()
    with proxy.client() as client:
        register(client, "create_record", "delete_record", args={"fail_times": 3}, max_retries=2)
        email = call(client, session, "send_email", EMAIL, 1).json()["effect_id"]
        record = call(client, session, "create_record", RECORD, 2).json()["effect_id"]
        failed = rollback(client, session)
        assert failed.status_code == 502, failed.text
        entry_id = entry_of(failed.json(), record)["entry_id"]

    with proxy.client() as client:
        retried = client.post(f"/undo/{entry_id}/retry")
        assert retried.status_code == 200, retried.text
        assert (retried.json()["state"], retried.json()["attempts"]) == ("pending", 0)
        refused = call(client, session, "create_record", RECORD, 9)  # compensating: closed
        assert (refused.status_code, refused.json()["code"]) == (409, "session_closed")
        answer = rollback(client, session)
        data = view(client, session)

    assert answer.status_code == 200, answer.text
    assert answer.json()["outcome"] == "compensated"
    assert (entry_of(data, record)["state"], entry_of(data, record)["attempts"]) == (
        "compensated",
        1,
    )
    assert proxy.counters("delete_record")[entry_id] == 4
    assert executions(proxy, "delete_record")[entry_id] == 1
    email_entry = entry_of(data, email)["entry_id"]
    assert executions(proxy, "undo_send_email")[email_entry] == 1
    assert "compensation_retried" in [e.type for e in events(proxy, session)]


def test_undo_entry_routes_refuse_what_they_cannot_do(
    proxy_factory: Callable[..., ProxyHarness],
) -> None:
    proxy, stranger = proxy_factory(), proxy_factory()
    session = new_session()
    with proxy.client() as client, stranger.client() as other:
        email = call(client, session, "send_email", EMAIL, 1).json()["effect_id"]
        entry_id = view(client, session)["undo_stack"][0]["entry_id"]
        assert entry_of(view(client, session), email)["state"] == "pending"
        answers = {
            "retry of a pending entry": client.post(f"/undo/{entry_id}/retry"),
            "resolve of a pending entry": client.post(
                f"/undo/{entry_id}/resolve", json={"note": "n"}
            ),
            "resolve without a note": client.post(f"/undo/{entry_id}/resolve"),
            "resolve with a bad note": client.post(f"/undo/{entry_id}/resolve", json={"note": 1}),
            "retry of an unknown entry": client.post(f"/undo/{uuid.uuid4()}/retry"),
            "another org's entry": other.post(f"/undo/{entry_id}/retry"),
            "complete of an unclaimed entry": client.post(
                f"/undo/{entry_id}/complete", json={"claim_token": "t"}
            ),
            "complete without a claim token": client.post(f"/undo/{entry_id}/complete"),
        }
    codes = {case: (r.status_code, r.json()["code"]) for case, r in answers.items()}
    assert codes == {
        "retry of a pending entry": (409, "invalid_state_transition"),
        "resolve of a pending entry": (409, "invalid_state_transition"),
        "resolve without a note": (400, "invalid_request"),
        "resolve with a bad note": (400, "invalid_request"),
        "retry of an unknown entry": (404, "not_found"),
        "another org's entry": (404, "not_found"),
        "complete of an unclaimed entry": (409, "invalid_state_transition"),
        "complete without a claim token": (400, "invalid_request"),
    }


# -- sessions that cannot be rolled back, or are closed by it -----------------------------------


def test_rollback_of_an_unknown_or_foreign_session_is_not_found(
    proxy_factory: Callable[..., ProxyHarness],
) -> None:
    proxy, stranger = proxy_factory(), proxy_factory()
    session = new_session()
    with proxy.client() as client, stranger.client() as other:
        call(client, session, "send_email", EMAIL, 1)
        unknown = rollback(client, new_session())
        foreign = rollback(other, session)
        data = view(client, session)

    assert (unknown.status_code, unknown.json()["code"]) == (404, "not_found")
    assert (foreign.status_code, foreign.json()["code"]) == (404, "not_found")
    assert data["state"] == "active"
    assert compensation_calls(proxy, session) == []


def test_a_completed_session_is_not_rolled_back(proxy: ProxyHarness) -> None:
    session = new_session()
    with proxy.client() as client:
        call(client, session, "send_email", EMAIL, 1)
        done = client.post(f"/sessions/{session}/complete")
        answer = rollback(client, session)

    assert (done.status_code, done.json()["state"]) == (200, "completed")
    assert (answer.status_code, answer.json()["code"]) == (409, "invalid_state_transition")
    assert compensation_calls(proxy, session) == []


@pytest.mark.parametrize("how", ["compensated", "compensation_failed"])
def test_a_rolled_back_session_refuses_new_calls(proxy: ProxyHarness, how: str) -> None:
    session = new_session()
    with proxy.client() as client:
        if how == "compensated":
            call(client, session, "send_email", EMAIL, 1)
            rollback(client, session)
        else:
            escalated(proxy, client, session)
        refused = call(client, session, "create_record", RECORD, 9)

    assert (refused.status_code, refused.json()["code"]) == (409, "session_closed")
    assert refused.json()["state"] == how


# -- the invariant -------------------------------------------------------------------------------


def test_a_compensation_registered_too_late_refuses_the_rollback(proxy: ProxyHarness) -> None:
    session = new_session()
    with proxy.client() as client:
        email = call(client, session, "send_email", EMAIL, 1).json()["effect_id"]
        later = call(client, session, "create_record", RECORD, 2).json()["effect_id"]
        entry_id = entry_of(view(client, session), later)["entry_id"]

        async def push_late(q: Queries) -> bool:
            effect = await q.get_effect(proxy.org_id, later)
            assert effect is not None and effect.executed_us is not None
            return await q.update_undo_entry(
                proxy.org_id, entry_id, registered_us=effect.executed_us + 1
            )

        assert on_store(proxy, push_late, write=True)
        answer = rollback(client, session)
        data = view(client, session)

    assert (answer.status_code, answer.json()["code"]) == (500, "compensation_registered_too_late")
    assert answer.json()["effect_id"] == later
    assert answer.json()["message"] == (
        f"Compensation registered after action executed for effect '{later}', invariant violated"
    )
    assert [u["state"] for u in data["undo_stack"]] == ["pending", "pending"]
    assert {e["effect_id"]: e["state"] for e in data["effects"]} == {
        email: "committed",
        later: "committed",
    }
    assert compensation_calls(proxy, session) == []


# -- unsettled forward calls and SDK-run entries -------------------------------------------------

LOCAL = {"tier": "compensable", "compensation": {"fn_name": "undo_local", "max_retries": 1}}


def sdk_execute(client: httpx.Client, session: str, step: int) -> str:
    """An SDK-executed call told to run (its effect is executing until committed)."""
    response = call(client, session, "local_write", {"n": step}, step, mode="sdk")
    assert response.json()["status"] == "execute", response.text
    return str(response.json()["effect_id"])


@pytest.mark.parametrize("state", ["executing", "in_doubt"])
def test_an_unsettled_forward_call_on_top_blocks_the_unwinding(
    proxy: ProxyHarness, state: str
) -> None:
    session = new_session()
    with proxy.client() as client:
        client.put("/tools/local_write", json=LOCAL).raise_for_status()
        email = call(client, session, "send_email", EMAIL, 1).json()["effect_id"]
        local = sdk_execute(client, session, 2)
        if state == "in_doubt":

            async def lose(q: Queries) -> bool:
                return await q.update_effect(proxy.org_id, local, state="in_doubt")

            assert on_store(proxy, lose, write=True)
        answer = rollback(client, session)
        data = view(client, session)

    assert (answer.status_code, answer.json()["code"]) == (409, "effect_in_doubt")
    assert answer.json()["next_entry"]["effect_id"] == local
    assert [u["state"] for u in data["undo_stack"]] == ["pending", "pending"]
    assert effect_of(data, email)["state"] == "committed"
    assert compensation_calls(proxy, session) == []

    with proxy.client() as client:  # the call is settled as failed: nothing to undo there
        path = "fail" if state == "executing" else "resolve"
        settled = client.post(f"/effects/{local}/{path}", json={"outcome": "failed", "error": "x"})
        assert settled.status_code == 200, settled.text
        after = rollback(client, session)
        data = view(client, session)
    assert after.json()["outcome"] == "compensated", after.text
    assert (entry_of(data, local)["state"], entry_of(data, email)["state"]) == (
        "skipped",
        "compensated",
    )


def test_a_mixed_stack_hands_sdk_entries_to_the_sdk_in_lifo_order(proxy: ProxyHarness) -> None:
    session = new_session()
    with proxy.client() as client:
        client.put("/tools/local_write", json=LOCAL).raise_for_status()
        email = call(client, session, "send_email", EMAIL, 1).json()["effect_id"]
        local = sdk_execute(client, session, 2)
        committed = client.post(f"/effects/{local}/commit", json={"result": {"row": 2}})
        assert committed.status_code == 200, committed.text
        record = call(client, session, "create_record", RECORD, 3).json()["effect_id"]

        waiting = rollback(client, session)
        assert waiting.status_code == 200, waiting.text
        body = waiting.json()
        assert (body["outcome"], body["state"]) == ("waiting_for_runner", "compensating")
        assert body["next_entry"]["effect_id"] == local
        assert [c["tool"] for c in compensation_calls(proxy, session)] == ["delete_record"]
        assert rollback(client, session).json()["outcome"] == "waiting_for_runner"  # idempotent
        refused = call(client, session, "send_email", EMAIL, 9)
        assert (refused.status_code, refused.json()["code"]) == (409, "session_closed")

        local_entry = body["next_entry"]["entry_id"]
        email_entry = entry_of(body, email)["entry_id"]
        early = client.post(f"/undo/{email_entry}/claim")
        assert (early.status_code, early.json()["code"]) == (409, "invalid_state_transition")
        claimed = client.post(f"/undo/{local_entry}/claim")
        assert claimed.status_code == 200, claimed.text
        assert claimed.json()["payload"] == {
            "original_args": {"n": 2},
            "original_result": {"row": 2},
        }
        assert (claimed.json()["state"], claimed.json()["attempts_left"]) == ("running", 2)
        token = claimed.json()["claim_token"]
        assert rollback(client, session).status_code == 409  # the SDK holds the top entry
        once = client.post(
            f"/undo/{local_entry}/fail", json={"error": "disk busy", "claim_token": token}
        )
        assert (once.json()["state"], once.json()["attempts"]) == ("running", 1)
        done = client.post(f"/undo/{local_entry}/complete", json={"claim_token": token})
        assert (done.json()["state"], done.json()["attempts"]) == ("compensated", 2)

        finished = rollback(client, session)
        data = view(client, session)

    assert finished.json()["outcome"] == "compensated", finished.text
    assert [c["tool"] for c in compensation_calls(proxy, session)] == [
        "delete_record",
        "undo_send_email",
    ]
    assert {e["effect_id"]: e["state"] for e in data["effects"]} == {
        email: "compensated",
        local: "compensated",
        record: "compensated",
    }


def test_an_sdk_compensation_that_gives_up_escalates_like_a_proxy_one(
    proxy: ProxyHarness,
) -> None:
    session = new_session()
    with proxy.client() as client:
        client.put("/tools/local_write", json=LOCAL).raise_for_status()
        call(client, session, "send_email", EMAIL, 1)
        local = sdk_execute(client, session, 2)
        client.post(f"/effects/{local}/commit", json={"result": {"row": 2}}).raise_for_status()
        entry_id = rollback(client, session).json()["next_entry"]["entry_id"]
        token = client.post(f"/undo/{entry_id}/claim").json()["claim_token"]
        once = {"error": "disk busy", "claim_token": token}
        client.post(f"/undo/{entry_id}/fail", json=once).raise_for_status()
        gave_up = client.post(
            f"/undo/{entry_id}/fail", json={"error": "disk gone", "claim_token": token}
        )
        answer = rollback(client, session)

    assert (gave_up.status_code, gave_up.json()["code"]) == (502, "compensation_failed")
    assert (
        gave_up.json()["message"] == "Compensation 'undo_local' failed after 1 retries: disk gone"
    )
    assert (answer.status_code, answer.json()["state"]) == (502, "compensation_failed")
    assert compensation_calls(proxy, session) == []  # the email's undo is not run past it


# -- concurrency ---------------------------------------------------------------------------------


def test_two_rollbacks_at_once_run_each_compensation_once(proxy: ProxyHarness) -> None:
    session = new_session()
    with proxy.client() as client:
        register(client, "send_email", "undo_send_email", args={"fail_times": 1})
        three_writes(client, session)

    def go(_: int) -> httpx.Response:
        with proxy.client() as client:
            return rollback(client, session)

    with ThreadPoolExecutor(2) as pool:
        answers = list(pool.map(go, range(2)))

    outcomes = sorted(f"{r.status_code} {r.json().get('outcome')}" for r in answers)
    assert set(outcomes) <= {"200 compensated", "409 in_progress"}, [r.text for r in answers]
    assert "200 compensated" in outcomes
    with proxy.client() as client:
        assert view(client, session)["state"] == "compensated"
    calls = compensation_calls(proxy, session)
    assert [c["tool"] for c in calls if c["tool"] != "undo_send_email"] == [
        "delete_record",
        "reverse_transfer",
    ]
    for tool in ("delete_record", "reverse_transfer", "undo_send_email"):
        assert list(executions(proxy, tool).values()) == [1]
