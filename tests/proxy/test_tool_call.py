"""`POST /mcp/tool_call` through a real proxy, a real demo upstream, on both stores.

Covers the outcomes of the reference (executed, replayed, pending_approval), logical and
transport failures of the upstream, SAFE and unregistered tools, engine-assigned steps and the
SDK execution mode with its commit/fail routes.
"""

from __future__ import annotations

import uuid
from typing import Any

import httpx

from tests.proxy.conftest import ProxyHarness
from tests.support.servers import free_port
from undolog.config import UpstreamConfig
from undolog.demo.catalog import DEMO_TOOLS

TOOL_CALL = "/mcp/tool_call"


def call(
    client: httpx.Client,
    session_id: str,
    tool: str,
    args: dict[str, Any],
    step: int | None = None,
    *,
    headers: dict[str, str] | None = None,
    **extra: Any,
) -> httpx.Response:
    body: dict[str, Any] = {"session_id": session_id, "tool_name": tool, "args": args, **extra}
    if step is not None:
        body["step_index"] = step
    return client.post(TOOL_CALL, json=body, headers=headers)


def new_session() -> str:
    return str(uuid.uuid4())


def session_effects(client: httpx.Client, session_id: str) -> list[dict[str, Any]]:
    response = client.get(f"/sessions/{session_id}")
    assert response.status_code == 200, response.text
    effects: list[dict[str, Any]] = response.json()["effects"]
    return effects


def upstream_calls(proxy: ProxyHarness, tool: str) -> list[dict[str, Any]]:
    with proxy.upstream() as upstream:
        return [c for c in upstream.get("/calls").json() if c["tool"] == tool]


def closed_port_url() -> str:
    """A loopback URL nothing listens on (the port was free a moment ago)."""
    return f"http://127.0.0.1:{free_port()}"


EMAIL = {"to": "ada@example.com", "subject": "hello"}


# --- executed and replayed ---------------------------------------------------------------


def test_a_compensable_call_is_executed_and_answers_the_tool_result(
    proxy: ProxyHarness,
) -> None:
    with proxy.client() as c:
        response = call(c, new_session(), "send_email", EMAIL, step=1)
    assert response.status_code == 200, response.text
    body = response.json()
    assert set(body) == {"status", "effect_id", "result"}
    assert body["status"] == "executed"
    uuid.UUID(body["effect_id"])
    assert body["result"] == {
        "success": True,
        "output": {"message_id": "msg-1", "to": "ada@example.com", "status": "sent"},
        "error": None,
    }
    assert response.headers["X-UndoLog-Step-Index"] == "1"


def test_a_retried_call_replays_the_identical_result_without_running_the_tool(
    proxy: ProxyHarness,
) -> None:
    session = new_session()
    with proxy.client() as c:
        first = call(c, session, "send_email", EMAIL, step=1)
        second = call(c, session, "send_email", EMAIL, step=1)
    assert first.status_code == second.status_code == 200
    executed, replayed = first.json(), second.json()
    assert replayed["status"] == "replayed"
    assert replayed["effect_id"] == executed["effect_id"]
    assert replayed["result"] == executed["result"]
    assert second.headers["X-UndoLog-Step-Index"] == "1"
    assert proxy.counters("send_email") == {executed["effect_id"]: 1}


def test_the_upstream_gets_the_effect_id_as_idempotency_key_and_the_request_id(
    proxy: ProxyHarness,
) -> None:
    with proxy.client() as c:
        response = call(c, new_session(), "send_email", EMAIL, step=1)
    assert response.status_code == 200
    [seen] = upstream_calls(proxy, "send_email")
    assert seen["idempotency_key"] == response.json()["effect_id"]
    assert seen["effect_id"] == response.json()["effect_id"]
    assert seen["request_id"] == response.headers["X-Request-Id"]


def test_a_client_request_id_is_forwarded_to_the_upstream(proxy: ProxyHarness) -> None:
    with proxy.client() as c:
        response = call(
            c, new_session(), "send_email", EMAIL, step=1, headers={"X-Request-Id": "trace-42"}
        )
    assert response.headers["X-Request-Id"] == "trace-42"
    [seen] = upstream_calls(proxy, "send_email")
    assert seen["request_id"] == "trace-42"


# --- logical failures --------------------------------------------------------------------


def test_a_logical_failure_is_executed_with_success_false_and_replays(
    proxy: ProxyHarness,
) -> None:
    session = new_session()
    with proxy.client() as c:
        first = call(c, session, "fail", {}, step=1)
        retry = call(c, session, "fail", {}, step=1)
    assert first.status_code == 200, first.text
    body = first.json()
    assert body["status"] == "executed"
    assert body["result"]["success"] is False
    assert body["result"]["error"]
    assert retry.json()["status"] == "replayed"
    assert retry.json()["result"] == body["result"]
    assert proxy.counters("fail") == {body["effect_id"]: 1}


def test_insufficient_funds_is_a_logical_failure_that_replays(proxy: ProxyHarness) -> None:
    session = new_session()
    args = {"from_account": "alice", "to_account": "bob", "amount": 10**6}
    with proxy.client() as c:
        first = call(c, session, "transfer_funds", args, step=1)
        retry = call(c, session, "transfer_funds", args, step=1)
        effects = session_effects(c, session)
    assert first.status_code == 200
    assert first.json()["status"] == "executed"
    assert first.json()["result"]["success"] is False
    assert retry.json()["status"] == "replayed"
    assert proxy.counters("transfer_funds") == {first.json()["effect_id"]: 1}
    assert [e["state"] for e in effects] == ["committed"]


# --- transport failures ------------------------------------------------------------------


def point_tool_at(c: httpx.Client, tool: str, upstream: str | None) -> None:
    """Re-register a demo tool with a configured upstream (None: back to `default`)."""
    spec = {**DEMO_TOOLS[tool], "upstream": upstream}
    c.put(f"/tools/{tool}", json=spec).raise_for_status()


def with_dead_upstream(proxy_factory: Any) -> ProxyHarness:
    """A proxy whose config also names `dead`: an upstream on a port nobody listens on."""
    harness: ProxyHarness = proxy_factory(upstreams=(UpstreamConfig("dead", closed_port_url()),))
    return harness


def test_an_unreachable_upstream_is_a_tool_error_and_a_retry_is_a_new_attempt(
    proxy_factory: Any,
) -> None:
    proxy = with_dead_upstream(proxy_factory)
    session = new_session()
    with proxy.client() as c:
        point_tool_at(c, "send_email", "dead")
        first = call(c, session, "send_email", EMAIL, step=1)
        assert first.status_code == 502
        assert first.json()["code"] == "tool_error"
        [effect] = session_effects(c, session)
        fetched = c.get(f"/effects/{effect['effect_id']}").json()
        assert fetched["state"] == "failed"
        assert fetched["attempts"] == 1
        assert fetched["error"]

        retry = call(c, session, "send_email", EMAIL, step=1)
        assert retry.status_code == 502
        assert retry.json()["code"] == "tool_error"
        again = c.get(f"/effects/{effect['effect_id']}").json()
        undo_stack = c.get(f"/sessions/{session}").json()["undo_stack"]
    assert again["state"] == "failed"
    assert again["attempts"] == 2
    # A new attempt of the same effect pushes no second compensation.
    assert [u["effect_id"] for u in undo_stack] == [effect["effect_id"]]


def test_a_failed_call_retried_against_a_healthy_upstream_commits_on_the_same_effect(
    proxy_factory: Any,
) -> None:
    proxy = with_dead_upstream(proxy_factory)
    session = new_session()
    with proxy.client() as c:
        point_tool_at(c, "send_email", "dead")
        assert call(c, session, "send_email", EMAIL, step=1).status_code == 502
        point_tool_at(c, "send_email", None)
        retry = call(c, session, "send_email", EMAIL, step=1)
        assert retry.status_code == 200, retry.text
        effect = c.get(f"/effects/{retry.json()['effect_id']}").json()
    assert retry.json()["status"] == "executed"
    assert effect["state"] == "committed"
    assert effect["attempts"] == 2
    assert proxy.counters("send_email") == {retry.json()["effect_id"]: 1}


def test_a_non_tool_result_error_body_is_an_ambiguous_outcome(proxy: ProxyHarness) -> None:
    session = new_session()
    with proxy.client() as c:
        response = call(c, session, "broken", {}, step=1)
        assert response.status_code == 409
        assert response.json()["code"] == "effect_in_doubt"
        [effect] = session_effects(c, session)
    assert effect["state"] == "in_doubt"


def test_an_upstream_slower_than_the_timeout_is_an_ambiguous_outcome(proxy_factory: Any) -> None:
    proxy: ProxyHarness = proxy_factory(upstream_timeout_seconds=0.5)
    session = new_session()
    with proxy.client() as c:
        response = call(c, session, "slow", {"seconds": 2}, step=1)
        assert response.status_code == 409
        assert response.json()["code"] == "effect_in_doubt"
        [effect] = session_effects(c, session)
    assert effect["state"] == "in_doubt"


# --- tiers -------------------------------------------------------------------------------


def test_an_irreversible_call_waits_for_approval_and_never_reaches_the_upstream(
    proxy: ProxyHarness,
) -> None:
    session = new_session()
    args = {"db_name": "prod"}
    with proxy.client() as c:
        first = call(c, session, "delete_database", args, step=1)
        retry = call(c, session, "delete_database", args, step=1)
    assert first.status_code == 202, first.text
    body = first.json()
    assert body["status"] == "pending_approval"
    uuid.UUID(body["approval_id"])
    assert isinstance(body["retry_after"], int)
    assert body["retry_after"] > 0
    assert retry.status_code == 202
    assert retry.json()["approval_id"] == body["approval_id"]
    assert proxy.counters("delete_database") == {}


def test_a_safe_call_executes_and_records_nothing_in_the_session(proxy: ProxyHarness) -> None:
    session = new_session()
    with proxy.client() as c:
        email = call(c, session, "send_email", EMAIL, step=1)
        search = call(c, session, "search_web", {"query": "undo logs"}, step=2)
        effects = session_effects(c, session)
    assert search.status_code == 200, search.text
    assert search.json()["status"] == "executed"
    assert search.json()["result"]["success"] is True
    assert [e["effect_id"] for e in effects] == [email.json()["effect_id"]]


def test_a_safe_call_runs_again_on_every_retry(proxy: ProxyHarness) -> None:
    session = new_session()
    with proxy.client() as c:
        first = call(c, session, "search_web", {"query": "q"}, step=1)
        second = call(c, session, "search_web", {"query": "q"}, step=1)
    assert first.json()["status"] == second.json()["status"] == "executed"
    assert sum(proxy.counters("search_web").values()) == 2


def test_an_unregistered_tool_is_404_with_the_reference_message(proxy: ProxyHarness) -> None:
    with proxy.client() as c:
        response = call(c, new_session(), "delete_invoice", {}, step=1)
    assert response.status_code == 404
    body = response.json()
    assert body["code"] == "tool_not_registered"
    assert body["message"] == (f"Tool 'delete_invoice' is not registered for org '{proxy.org_id}'")


# --- steps -------------------------------------------------------------------------------


def test_calls_without_a_step_get_the_next_steps_of_the_session(proxy: ProxyHarness) -> None:
    session = new_session()
    with proxy.client() as c:
        steps = [
            call(c, session, "echo", {"n": n}).headers["X-UndoLog-Step-Index"] for n in (1, 2, 3)
        ]
        # The same call again, after its answer was received, is a new call: the next step.
        repeat = call(c, session, "echo", {"n": 1})
        effects = session_effects(c, session)
    assert steps == ["1", "2", "3"]
    assert repeat.headers["X-UndoLog-Step-Index"] == "4"
    assert repeat.json()["status"] == "executed"
    assert [e["step_index"] for e in effects] == [1, 2, 3, 4]


def test_an_unnumbered_retry_of_a_pending_approval_maps_to_the_same_call(
    proxy: ProxyHarness,
) -> None:
    session = new_session()
    with proxy.client() as c:
        first = call(c, session, "delete_database", {"db_name": "prod"})
        retry = call(c, session, "delete_database", {"db_name": "prod"})
    assert first.status_code == retry.status_code == 202
    assert retry.json()["approval_id"] == first.json()["approval_id"]
    assert retry.headers["X-UndoLog-Step-Index"] == first.headers["X-UndoLog-Step-Index"] == "1"


# --- SDK-executed calls ------------------------------------------------------------------


def sdk_call(c: httpx.Client, session: str, args: dict[str, Any]) -> httpx.Response:
    return call(c, session, "send_email", args, step=1, mode="sdk")


def test_sdk_mode_answers_execute_without_calling_the_upstream(proxy: ProxyHarness) -> None:
    with proxy.client() as c:
        response = sdk_call(c, new_session(), EMAIL)
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["status"] == "execute"
    uuid.UUID(body["effect_id"])
    assert body["attempt"] == 1
    assert response.headers["X-UndoLog-Step-Index"] == "1"
    assert proxy.counters("send_email") == {}


def test_sdk_mode_can_be_chosen_by_header(proxy: ProxyHarness) -> None:
    with proxy.client() as c:
        response = call(
            c, new_session(), "send_email", EMAIL, step=1, headers={"X-UndoLog-Mode": "sdk"}
        )
    assert response.json()["status"] == "execute"
    assert proxy.counters("send_email") == {}


def test_an_sdk_commit_is_replayed_to_a_retry(proxy: ProxyHarness) -> None:
    session = new_session()
    result = {"success": True, "output": {"message_id": "local-1"}, "error": None}
    with proxy.client() as c:
        effect_id = sdk_call(c, session, EMAIL).json()["effect_id"]
        committed = c.post(f"/effects/{effect_id}/commit", json={"result": result})
        assert committed.status_code == 200, committed.text
        assert committed.json()["state"] == "committed"
        retry = sdk_call(c, session, EMAIL)
    assert retry.status_code == 200
    assert retry.json() == {"status": "replayed", "effect_id": effect_id, "result": result}
    assert proxy.counters("send_email") == {}


def test_an_sdk_fail_makes_the_retry_a_second_attempt(proxy: ProxyHarness) -> None:
    session = new_session()
    with proxy.client() as c:
        effect_id = sdk_call(c, session, EMAIL).json()["effect_id"]
        failed = c.post(f"/effects/{effect_id}/fail", json={"error": "smtp down"})
        assert failed.status_code == 200, failed.text
        assert failed.json()["state"] == "failed"
        retry = sdk_call(c, session, EMAIL)
    assert retry.json()["status"] == "execute"
    assert retry.json()["effect_id"] == effect_id
    assert retry.json()["attempt"] == 2


def test_an_sdk_failure_message_with_a_nul_character_is_still_recorded(
    proxy: ProxyHarness,
) -> None:
    with proxy.client() as c:
        effect_id = sdk_call(c, new_session(), EMAIL).json()["effect_id"]
        failed = c.post(f"/effects/{effect_id}/fail", json={"error": "bad\x00byte"})
    assert failed.status_code == 200, failed.text
    assert failed.json()["state"] == "failed"
    assert failed.json()["error"].startswith("bad")


def test_committing_an_effect_twice_is_409_not_executing(proxy: ProxyHarness) -> None:
    with proxy.client() as c:
        effect_id = sdk_call(c, new_session(), EMAIL).json()["effect_id"]
        url = f"/effects/{effect_id}/commit"
        assert c.post(url, json={"result": {"success": True}}).status_code == 200
        again = c.post(url, json={"result": {"success": True}})
    assert again.status_code == 409
    assert again.json()["code"] == "not_executing"


def test_committing_an_unknown_effect_is_404(proxy: ProxyHarness) -> None:
    with proxy.client() as c:
        response = c.post(f"/effects/{uuid.uuid4()}/commit", json={"result": None})
    assert response.status_code == 404
    assert response.json()["code"] == "not_found"


def test_a_commit_without_a_result_is_400(proxy: ProxyHarness) -> None:
    with proxy.client() as c:
        effect_id = sdk_call(c, new_session(), EMAIL).json()["effect_id"]
        response = c.post(f"/effects/{effect_id}/commit", json={"output": 1})
        effect = c.get(f"/effects/{effect_id}").json()
    assert response.status_code == 400
    assert response.json()["code"] == "invalid_request"
    assert effect["state"] == "executing"


def test_a_concurrent_duplicate_of_an_executing_call_is_409_in_progress(
    proxy: ProxyHarness,
) -> None:
    session = new_session()
    with proxy.client() as c:
        first = sdk_call(c, session, EMAIL)
        duplicate = sdk_call(c, session, EMAIL)
    assert first.json()["status"] == "execute"
    assert duplicate.status_code == 409
    body = duplicate.json()
    assert body["code"] == "in_progress"
    assert body["effect_id"] == first.json()["effect_id"]
    assert int(duplicate.headers["Retry-After"]) == body["retry_after"] >= 1
