"""The REST routes besides the tool call, through a real proxy on both stores: the tool
registry, sessions with their effects, undo stacks and approvals, operator resolution of
in-doubt effects, and the generated OpenAPI document."""

from __future__ import annotations

import uuid
from typing import Any

import httpx
import pytest

from tests.proxy.conftest import ProxyHarness
from tests.support.servers import wait_until

TOOL_CALL = "/mcp/tool_call"
UNDO = {"fn_name": "undo_it", "max_retries": 2, "retry_backoff_ms": 10}


def call(
    c: httpx.Client, session: str, tool: str, args: dict[str, Any], step: int, **extra: Any
) -> httpx.Response:
    body = {"session_id": session, "tool_name": tool, "step_index": step, "args": args, **extra}
    return c.post(TOOL_CALL, json=body)


def assert_code(response: httpx.Response, status: int, code: str) -> None:
    assert response.status_code == status, response.text
    assert response.json()["code"] == code


# --- the tool registry -------------------------------------------------------------------

BAD_TOOLS = {
    "an unknown tier": {"tier": "dangerous"},
    "a missing tier": {"version": "1.0.0"},
    "a compensable tool without a compensation": {"tier": "compensable"},
    "a compensation that is no object": {"tier": "compensable", "compensation": "undo"},
    "a compensation without fn_name": {"tier": "compensable", "compensation": {"args": {}}},
    "a compensation with an unknown field": {
        "tier": "compensable",
        "compensation": {**UNDO, "when": "later"},
    },
    "a compensation with negative retries": {
        "tier": "compensable",
        "compensation": {**UNDO, "max_retries": -1},
    },
    "an unknown field": {"tier": "safe", "owner": "me"},
    "a version that is no string": {"tier": "safe", "version": None},
    "idempotent_upstream that is no boolean": {"tier": "safe", "idempotent_upstream": "false"},
    "an upstream_url (no longer accepted)": {"tier": "safe", "upstream_url": "http://x"},
    "an upstream that is no string": {"tier": "safe", "upstream": 8090},
    "an upstream nobody configured": {"tier": "safe", "upstream": "elsewhere"},
}


def test_registering_a_malformed_tool_is_400_and_registers_nothing(
    proxy: ProxyHarness, subtests: pytest.Subtests
) -> None:
    with proxy.client() as c:
        for case, spec in BAD_TOOLS.items():
            with subtests.test(case):
                assert_code(c.put("/tools/new_tool", json=spec), 400, "invalid_request")
        for content in (b"", b"[]", b"{"):
            with subtests.test(body=content):
                assert_code(c.put("/tools/new_tool", content=content), 400, "invalid_request")
        with subtests.test("a NUL in the tool name"):
            assert_code(c.put("/tools/new%00tool", json={"tier": "safe"}), 400, "invalid_request")
        names = [t["name"] for t in c.get("/tools").json()]
    assert not [n for n in names if n.startswith("new")]


def test_registered_tools_are_listed_with_their_settings(proxy: ProxyHarness) -> None:
    with proxy.client() as c:
        put = c.put(
            "/tools/refund",
            json={
                "tier": "compensable",
                "version": "2.1.0",
                "compensation": {**UNDO, "args": {"reason": "undo"}},
                "idempotent_upstream": True,
                "upstream": "default",
            },
        )
        assert put.status_code == 200, put.text
        assert c.put("/tools/lookup", json={"tier": "safe"}).status_code == 200
        tools = {t["name"]: t for t in c.get("/tools").json()}
    assert put.json() == tools["refund"]
    refund = tools["refund"]
    assert refund["tier"] == "compensable"
    assert refund["version"] == "2.1.0"
    assert refund["compensation"]["fn_name"] == "undo_it"
    assert refund["compensation"]["args"] == {"reason": "undo"}
    assert refund["idempotent_upstream"] is True
    assert refund["upstream"] == "default"
    assert tools["lookup"]["tier"] == "safe"
    assert tools["lookup"]["compensation"] is None
    assert {"send_email", "delete_database", "search_web"} <= set(tools)


def test_registering_a_tool_again_replaces_it(proxy: ProxyHarness) -> None:
    with proxy.client() as c:
        c.put("/tools/t", json={"tier": "safe"}).raise_for_status()
        c.put("/tools/t", json={"tier": "irreversible", "version": "2"}).raise_for_status()
        [tool] = [t for t in c.get("/tools").json() if t["name"] == "t"]
    assert (tool["tier"], tool["version"]) == ("irreversible", "2")


def test_tools_of_another_org_are_not_listed(proxy: ProxyHarness, proxy_factory: Any) -> None:
    other: ProxyHarness = proxy_factory()
    with proxy.client() as c:
        c.put("/tools/private_tool", json={"tier": "safe"}).raise_for_status()
    with other.client() as c:
        names = [t["name"] for t in c.get("/tools").json()]
        response = call(c, str(uuid.uuid4()), "private_tool", {}, 1)
    assert "private_tool" not in names
    assert_code(response, 404, "tool_not_registered")


# --- sessions ----------------------------------------------------------------------------


def test_a_session_shows_effects_in_step_order_the_undo_stack_newest_first_and_approvals(
    proxy: ProxyHarness,
) -> None:
    session = str(uuid.uuid4())
    email = {"to": "ada@example.com", "subject": "hi"}
    with proxy.client() as c:
        record = call(c, session, "create_record", {"table": "t"}, 3).json()
        sent = call(c, session, "send_email", email, 1).json()
        call(c, session, "search_web", {"query": "q"}, 2).raise_for_status()
        pending = call(c, session, "delete_database", {"db_name": "prod"}, 4).json()
        for _ in range(2):
            assert call(c, session, "send_email", email, 1).json()["status"] == "replayed"
        response = c.get(f"/sessions/{session}")
    assert response.status_code == 200
    view = response.json()
    assert view["session_id"] == session
    assert view["state"] == "active"
    assert view["last_step"] == 4

    effects = view["effects"]
    assert [e["step_index"] for e in effects] == [1, 3, 4]
    assert [e["tool_name"] for e in effects] == ["send_email", "create_record", "delete_database"]
    assert [e["state"] for e in effects] == ["committed", "committed", "awaiting_approval"]
    assert [e["replay_count"] for e in effects] == [2, 0, 0]
    assert effects[0]["effect_id"] == sent["effect_id"]
    assert effects[0]["args"] == email
    assert effects[0]["result"] == sent["result"]
    assert effects[1]["effect_id"] == record["effect_id"]

    undo = view["undo_stack"]
    assert [u["fn_name"] for u in undo] == ["undo_send_email", "delete_record"]
    assert [u["effect_id"] for u in undo] == [sent["effect_id"], record["effect_id"]]
    assert undo[0]["seq"] > undo[1]["seq"]
    assert all(u["state"] == "pending" for u in undo)

    [approval] = view["approvals"]
    assert approval["id"] == pending["approval_id"]
    assert approval["effect_id"] == effects[2]["effect_id"]
    assert approval["tool_name"] == "delete_database"
    assert approval["args"] == {"db_name": "prod"}
    assert approval["status"] == "pending"


def test_an_unknown_session_is_404(proxy: ProxyHarness) -> None:
    with proxy.client() as c:
        assert_code(c.get(f"/sessions/{uuid.uuid4()}"), 404, "not_found")


def test_sessions_are_listed_for_the_org(proxy: ProxyHarness) -> None:
    sessions = [str(uuid.uuid4()) for _ in range(3)]
    with proxy.client() as c:
        for session in sessions:
            call(c, session, "echo", {"n": 1}, 1).raise_for_status()
        listed = c.get("/sessions").json()
        limited = c.get("/sessions", params={"limit": 2}).json()
    assert {s["session_id"] for s in listed} == set(sessions)
    assert all(s["state"] == "active" for s in listed)
    assert len(limited) == 2


# --- in-doubt effects and their resolution -----------------------------------------------

EMAIL = {"to": "grace@example.com", "subject": "status"}


@pytest.fixture
def short_lease_proxy(proxy_factory: Any) -> ProxyHarness:
    harness: ProxyHarness = proxy_factory(lease_seconds=0.2)
    return harness


def in_doubt_effect(c: httpx.Client, session: str) -> str:
    """An SDK-executed call that never reports back, retried until its lease runs out."""
    first = call(c, session, "send_email", EMAIL, 1, mode="sdk")
    assert first.json()["status"] == "execute"

    def answers_in_doubt() -> bool:
        retry = call(c, session, "send_email", EMAIL, 1, mode="sdk")
        assert retry.status_code == 409, retry.text
        code: str = retry.json()["code"]
        assert code in ("in_progress", "effect_in_doubt")
        return code == "effect_in_doubt"

    wait_until(answers_in_doubt, timeout=10, what="the lease to expire")
    effect_id: str = first.json()["effect_id"]
    assert c.get(f"/effects/{effect_id}").json()["state"] == "in_doubt"
    return effect_id


def test_an_in_doubt_effect_resolved_as_committed_is_replayed(
    short_lease_proxy: ProxyHarness,
) -> None:
    session = str(uuid.uuid4())
    result = {"success": True, "output": {"message_id": "by-hand"}, "error": None}
    with short_lease_proxy.client() as c:
        effect_id = in_doubt_effect(c, session)
        # It stays in doubt, however often the call is retried.
        assert_code(call(c, session, "send_email", EMAIL, 1, mode="sdk"), 409, "effect_in_doubt")
        resolved = c.post(
            f"/effects/{effect_id}/resolve", json={"outcome": "committed", "result": result}
        )
        assert resolved.status_code == 200, resolved.text
        assert resolved.json()["state"] == "committed"
        retry = call(c, session, "send_email", EMAIL, 1)
    assert retry.json() == {"status": "replayed", "effect_id": effect_id, "result": result}
    assert short_lease_proxy.counters("send_email") == {}


def test_an_in_doubt_effect_resolved_as_committed_carries_no_error(
    short_lease_proxy: ProxyHarness,
) -> None:
    with short_lease_proxy.client() as c:
        effect_id = in_doubt_effect(c, str(uuid.uuid4()))
        resolved = c.post(
            f"/effects/{effect_id}/resolve",
            json={"outcome": "committed", "result": {"success": True}},
        )
    assert resolved.json()["state"] == "committed"
    assert resolved.json()["error"] is None


def test_an_in_doubt_effect_resolved_as_failed_runs_again_on_retry(
    short_lease_proxy: ProxyHarness,
) -> None:
    session = str(uuid.uuid4())
    with short_lease_proxy.client() as c:
        effect_id = in_doubt_effect(c, session)
        resolved = c.post(
            f"/effects/{effect_id}/resolve", json={"outcome": "failed", "error": "never sent"}
        )
        assert resolved.json()["state"] == "failed"
        retry = call(c, session, "send_email", EMAIL, 1)
        effect = c.get(f"/effects/{effect_id}").json()
    assert retry.json()["status"] == "executed"
    assert retry.json()["effect_id"] == effect_id
    assert effect["attempts"] == 2
    assert short_lease_proxy.counters("send_email") == {effect_id: 1}


def test_the_late_runner_of_an_in_doubt_effect_can_still_commit_it(
    short_lease_proxy: ProxyHarness,
) -> None:
    session = str(uuid.uuid4())
    result = {"success": True, "output": "late", "error": None}
    with short_lease_proxy.client() as c:
        effect_id = in_doubt_effect(c, session)
        commit = c.post(f"/effects/{effect_id}/commit", json={"result": result})
        assert commit.status_code == 200, commit.text
        retry = call(c, session, "send_email", EMAIL, 1, mode="sdk")
    assert retry.json()["result"] == result


def test_a_resolution_that_is_malformed_is_400(
    short_lease_proxy: ProxyHarness, subtests: pytest.Subtests
) -> None:
    with short_lease_proxy.client() as c:
        effect_id = in_doubt_effect(c, str(uuid.uuid4()))
        for case, payload in {
            "an unknown outcome": {"outcome": "maybe"},
            "no outcome": {"result": {}},
            "committed without a result": {"outcome": "committed"},
            "an error that is no string": {"outcome": "failed", "error": 5},
        }.items():
            with subtests.test(case):
                response = c.post(f"/effects/{effect_id}/resolve", json=payload)
                assert_code(response, 400, "invalid_request")
        assert c.get(f"/effects/{effect_id}").json()["state"] == "in_doubt"


def test_resolving_an_effect_that_is_not_in_doubt_is_409(proxy: ProxyHarness) -> None:
    with proxy.client() as c:
        executed = call(c, str(uuid.uuid4()), "send_email", EMAIL, 1).json()
        response = c.post(
            f"/effects/{executed['effect_id']}/resolve",
            json={"outcome": "committed", "result": {"success": True}},
        )
        effect = c.get(f"/effects/{executed['effect_id']}").json()
    assert_code(response, 409, "invalid_state_transition")
    assert effect["result"] == executed["result"]


def test_resolving_an_unknown_effect_is_404(proxy: ProxyHarness) -> None:
    with proxy.client() as c:
        response = c.post(f"/effects/{uuid.uuid4()}/resolve", json={"outcome": "failed"})
    assert_code(response, 404, "not_found")


# --- OpenAPI -----------------------------------------------------------------------------


def test_the_openapi_document_describes_the_tool_call_route(proxy: ProxyHarness) -> None:
    with httpx.Client(base_url=proxy.url) as anonymous:
        response = anonymous.get("/openapi.json")
    assert response.status_code == 200
    spec = response.json()
    assert spec["openapi"].startswith("3.")
    post = spec["paths"]["/mcp/tool_call"]["post"]
    schema = post["requestBody"]["content"]["application/json"]["schema"]
    assert set(schema["required"]) == {"session_id", "tool_name", "args"}
    assert {"session_id", "tool_name", "tool_version", "step_index", "args"} <= set(
        schema["properties"]
    )
    for path in ("/tools/{name}", "/effects/{id}/commit", "/effects/{id}/resolve", "/sessions"):
        assert path in spec["paths"]
