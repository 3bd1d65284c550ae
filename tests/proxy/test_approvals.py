"""`/approvals` through a real proxy and a real demo upstream, on both stores.

Listing (filters, limits, order, the reference's fields), approving (a proxy-executed call runs
once and its retry replays; an SDK-executed call runs on the SDK's retry), rejecting (the
session halts, the retry is refused), deciding twice, reasons and names, tenancy, timeouts
under each org policy, a restart of the proxy, and the decision metrics. Timeouts are short
(`approval_timeout_seconds = 1`, swept every 0.1 s) and waited for by polling with deadlines.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.proxy.conftest import METRICS_AUTH, ProxyHarness, spawn_proxy, write_org_config
from tests.support.servers import ProcessServer, ThreadServer, wait_until
from undolog.demo.catalog import DEMO_TOOLS
from undolog_sdk import (
    AwaitingApprovalError,
    ProxyError,
    ToolTier,
    UndoLogClient,
    UndoLogSession,
    undolog_tool,
)
from undolog_sdk.errors import ApprovalRejected

TOOL_CALL = "/mcp/tool_call"
SHORT_TIMEOUT = {"approval_timeout_seconds": 1}
AUTO_APPROVE = {"approval_timeout_seconds": 1, "auto_approve_on_timeout": True}
FAST_SWEEP = {"approval_sweep_seconds": 0.1}
NO_SWEEP = {"approval_sweep_seconds": 3600.0}  # only the sweep at start-up: none afterwards
DEADLINE = 20.0


def new_session() -> str:
    return str(uuid.uuid4())


def drop_db(session_id: str, step: int = 1, db: str = "prod", **extra: Any) -> dict[str, Any]:
    return {
        "session_id": session_id,
        "tool_name": "delete_database",
        "step_index": step,
        "args": {"db_name": db},
        **extra,
    }


def ask(c: httpx.Client, body: dict[str, Any]) -> httpx.Response:
    return c.post(TOOL_CALL, json=body)


def await_approval(c: httpx.Client, body: dict[str, Any]) -> dict[str, Any]:
    """Make an IRREVERSIBLE call and return its 202 body (with `approval_id`)."""
    response = ask(c, body)
    assert response.status_code == 202, response.text
    pending: dict[str, Any] = response.json()
    assert pending["status"] == "pending_approval"
    return pending


def listed(c: httpx.Client, **params: Any) -> list[dict[str, Any]]:
    response = c.get("/approvals", params=params)
    assert response.status_code == 200, response.text
    items: list[dict[str, Any]] = response.json()
    return items


def session_of(c: httpx.Client, session_id: str) -> dict[str, Any]:
    response = c.get(f"/sessions/{session_id}")
    assert response.status_code == 200, response.text
    view: dict[str, Any] = response.json()
    return view


def effect_state(c: httpx.Client, session_id: str, effect_id: str) -> str:
    (effect,) = [e for e in session_of(c, session_id)["effects"] if e["effect_id"] == effect_id]
    state: str = effect["state"]
    return state


def decide(
    c: httpx.Client, approval_id: str, action: str, body: Any = None, *, raw: bytes | None = None
) -> httpx.Response:
    path = f"/approvals/{approval_id}/{action}"
    if raw is not None:
        return c.post(path, content=raw, headers={"Content-Type": "application/json"})
    return c.post(path, json=body) if body is not None else c.post(path)


def runs_of(proxy: ProxyHarness, tool: str = "delete_database") -> dict[str, int]:
    """How many times the upstream ran `tool`, per effect id (its idempotency key)."""
    return proxy.counters(tool)


def error_code(response: httpx.Response) -> str:
    code: str = response.json()["code"]
    return code


# --- GET /approvals ------------------------------------------------------------------------


def test_pending_approvals_are_listed_newest_first_with_the_reference_fields(
    proxy: ProxyHarness,
) -> None:
    session = new_session()
    with proxy.client() as c:
        asked = [await_approval(c, drop_db(session, step, f"db-{step}")) for step in (1, 2, 3)]
        items = listed(c)
    assert [a["id"] for a in items] == [p["approval_id"] for p in reversed(asked)]
    newest = items[0]
    assert {"id", "org_id", "session_id", "effect_id", "tool_name", "args", "status"} <= set(newest)
    assert newest["org_id"] == proxy.org_id
    assert newest["session_id"] == session
    assert newest["effect_id"] == asked[2]["effect_id"]
    assert newest["tool_name"] == "delete_database"
    assert newest["status"] == "pending"
    # `args` is the JSON object of the call, not its raw JSON's bytes (`[123, 34, ...]`).
    assert newest["args"] == {"db_name": "db-3"}
    assert newest["arguments"] == {"db_name": "db-3"}


def test_args_come_out_as_the_json_object_everywhere_an_approval_is_shown(
    proxy: ProxyHarness,
) -> None:
    session = new_session()
    args = {"db_name": "db-1", "note": "é ✓", "n": [1, 2]}
    with proxy.client() as c:
        asked = await_approval(c, {**drop_db(session, 1, "db-1"), "args": args})
        approval_id = asked["approval_id"]
        shown = [
            *listed(c),
            *c.get("/approvals", params={"state": "all", "recent_calls": 3}).json(),
            c.get(f"/approvals/{approval_id}").json(),
            *c.get(f"/sessions/{session}").json()["approvals"],
        ]
    assert len(shown) == 4
    for approval in shown:
        assert (approval["id"], approval["args"]) == (approval_id, args), approval


def test_the_state_filter_lists_each_kind_of_decision(proxy: ProxyHarness) -> None:
    session = new_session()
    with proxy.client() as c, proxy.client(proxy.approver_key) as approver:
        approved, rejected, waiting = (
            await_approval(c, drop_db(session, step, f"db-{step}"))["approval_id"]
            for step in (1, 2, 3)
        )
        assert decide(approver, approved, "approve").status_code == 200
        assert decide(c, rejected, "reject").status_code == 200
        by_state = {state: [a["id"] for a in listed(c, state=state)]
                    for state in ("pending", "approved", "rejected")}  # fmt: skip
        default = [a["id"] for a in listed(c)]
    assert by_state == {"pending": [waiting], "approved": [approved], "rejected": [rejected]}
    assert default == [waiting]


@pytest.mark.parametrize("state", ["bogus", "", "PENDING"])
def test_an_unknown_state_is_a_400(proxy: ProxyHarness, state: str) -> None:
    with proxy.client() as c:
        response = c.get("/approvals", params={"state": state})
    assert response.status_code == 400
    assert error_code(response) == "invalid_request"


def test_approvals_need_an_api_key(proxy: ProxyHarness) -> None:
    response = httpx.get(f"{proxy.url}/approvals", timeout=10)
    assert response.status_code == 401


async def test_the_limit_caps_the_list_and_a_bad_limit_falls_back_to_100(
    proxy: ProxyHarness,
) -> None:
    session = new_session()
    async with proxy.async_client() as c:
        answers = await asyncio.gather(
            *(c.post(TOOL_CALL, json=drop_db(session, step, f"db-{step}")) for step in range(101))
        )
        assert {r.status_code for r in answers} == {202}

        async def count(limit: str) -> int:
            response = await c.get("/approvals", params={"limit": limit})
            assert response.status_code == 200, response.text
            return len(response.json())

        counts = {limit: await count(limit) for limit in
                  ("1", "7", "500", "0", "-3", "501", "abc", "2.5", "")}  # fmt: skip
    assert counts == {"1": 1, "7": 7, "500": 101,
                      "0": 100, "-3": 100, "501": 100, "abc": 100, "2.5": 100, "": 100}  # fmt: skip


def test_the_limit_keeps_the_newest(proxy: ProxyHarness) -> None:
    session = new_session()
    with proxy.client() as c:
        ids = [await_approval(c, drop_db(session, step, f"db-{step}"))["approval_id"]
               for step in (1, 2, 3, 4)]  # fmt: skip
        newest_two = [a["id"] for a in listed(c, limit=2)]
    assert newest_two == [ids[3], ids[2]]


# --- approve -------------------------------------------------------------------------------


def test_approving_a_proxy_call_runs_it_once_and_the_retry_replays_its_result(
    proxy: ProxyHarness,
) -> None:
    session = new_session()
    with proxy.client() as c, proxy.client(proxy.approver_key) as approver:
        pending = await_approval(c, drop_db(session))
        assert runs_of(proxy) == {}
        response = decide(approver, pending["approval_id"], "approve")
        assert response.status_code == 200, response.text
        answer = response.json()
        retry = ask(c, drop_db(session))
        again = ask(c, drop_db(session))
        state = effect_state(c, session, pending["effect_id"])
    assert answer == {
        "status": "approved",
        "approval_id": pending["approval_id"],
        "effect_id": pending["effect_id"],
        "execution": "committed",
        "result": {"success": True, "output": {"db_name": "prod", "status": "deleted"},
                   "error": None},
    }  # fmt: skip
    for replay in (retry, again):
        assert replay.status_code == 200
        assert replay.json() == {
            "status": "replayed",
            "effect_id": pending["effect_id"],
            "result": answer["result"],
        }
    assert runs_of(proxy) == {pending["effect_id"]: 1}
    assert state == "committed"


def test_an_approved_call_whose_tool_breaks_reports_execution_in_doubt(
    proxy: ProxyHarness,
) -> None:
    session = new_session()
    body = {"session_id": session, "tool_name": "broken", "step_index": 1, "args": {}}
    with proxy.client() as c, proxy.client(proxy.approver_key) as approver:
        c.put("/tools/broken", json={"tier": "irreversible"}).raise_for_status()
        pending = await_approval(c, body)
        response = decide(approver, pending["approval_id"], "approve")
        state = effect_state(c, session, pending["effect_id"])
        retry = c.post("/mcp/tool_call", json=body)
    assert response.status_code == 200, response.text
    answer = response.json()
    # A broken answer does not prove the tool did not run: an operator decides.
    assert (answer["status"], answer["execution"]) == ("approved", "in_doubt")
    assert isinstance(answer["error"], str) and answer["error"]
    assert "result" not in answer
    assert state == "in_doubt"
    assert (retry.status_code, retry.json()["code"]) == (409, "effect_in_doubt")
    assert runs_of(proxy, "broken") == {pending["effect_id"]: 1}


@pytest.fixture
async def sdk_client(proxy: ProxyHarness) -> AsyncIterator[UndoLogClient]:
    client = UndoLogClient(proxy.url, api_key=proxy.api_key)
    try:
        yield client
    finally:
        await client.aclose()


async def test_approving_an_sdk_call_lets_the_sdk_retry_run_the_body_once(
    proxy: ProxyHarness, sdk_client: UndoLogClient
) -> None:
    runs = 0

    @undolog_tool(tier=ToolTier.IRREVERSIBLE, client=sdk_client)
    async def publish(artifact: str) -> dict[str, str]:
        nonlocal runs
        runs += 1
        return {"artifact": artifact, "status": "published"}

    session = UndoLogSession(org_id=proxy.org_id)
    with pytest.raises(AwaitingApprovalError) as waiting:
        await publish("v2", _session=session)
    async with proxy.async_client(proxy.approver_key) as c:
        response = await c.post(f"/approvals/{waiting.value.approval_id}/approve")
    assert response.status_code == 200, response.text
    answer = response.json()
    assert (answer["status"], answer["execution"]) == ("approved", "awaiting_agent")
    assert "result" not in answer
    assert runs == 0

    assert await publish("v2", _session=session) == {"artifact": "v2", "status": "published"}
    again = UndoLogSession(org_id=proxy.org_id, session_id=session.session_id)
    assert await publish("v2", _session=again) == {"artifact": "v2", "status": "published"}
    assert runs == 1
    with proxy.client() as sync:
        (effect,) = session_of(sync, session.session_id)["effects"]
    assert (effect["state"], effect["attempts"]) == ("committed", 1)


# --- reject --------------------------------------------------------------------------------


def test_rejecting_halts_the_session_and_the_retry_is_refused(proxy: ProxyHarness) -> None:
    session = new_session()
    with proxy.client() as c:
        pending = await_approval(c, drop_db(session))
        response = decide(c, pending["approval_id"], "reject", {"reason": "not on a Friday"})
        retry = ask(c, drop_db(session))
        other_call = ask(c, drop_db(session, step=2, db="staging"))
        view = session_of(c, session)
    assert response.status_code == 200, response.text
    answer = response.json()
    assert (answer["status"], answer["approval_id"]) == ("rejected", pending["approval_id"])
    assert view["state"] == "halted"
    assert view["effects"][0]["state"] == "rejected"
    assert retry.status_code == 409
    assert error_code(retry) == "approval_rejected"
    assert retry.json()["approval_id"] == pending["approval_id"]
    assert other_call.status_code == 409
    assert error_code(other_call) == "session_closed"
    assert runs_of(proxy) == {}


async def test_the_sdk_retry_of_a_rejected_call_raises_approval_rejected(
    proxy: ProxyHarness, sdk_client: UndoLogClient
) -> None:
    runs = 0

    @undolog_tool(tier=ToolTier.IRREVERSIBLE, client=sdk_client)
    async def publish(artifact: str) -> None:
        nonlocal runs
        runs += 1

    session = UndoLogSession(org_id=proxy.org_id)
    with pytest.raises(AwaitingApprovalError) as waiting:
        await publish("v3", _session=session)
    async with proxy.async_client() as c:
        response = await c.post(f"/approvals/{waiting.value.approval_id}/reject")
    assert response.status_code == 200, response.text
    with pytest.raises(ApprovalRejected) as refused:
        await publish("v3", _session=session)
    assert isinstance(refused.value, ProxyError)
    assert refused.value.code == "approval_rejected"
    assert refused.value.approval_id == waiting.value.approval_id
    assert runs == 0


# --- one decision only ---------------------------------------------------------------------


@pytest.mark.parametrize("first", ["approve", "reject"])
@pytest.mark.parametrize("second", ["approve", "reject"])
def test_a_second_decision_is_a_409_and_changes_nothing(
    proxy: ProxyHarness, first: str, second: str
) -> None:
    session = new_session()
    with proxy.client() as c, proxy.client(proxy.approver_key) as approver:
        pending = await_approval(c, drop_db(session))
        assert decide(approver, pending["approval_id"], first).status_code == 200
        response = decide(approver, pending["approval_id"], second)
        final = "approved" if first == "approve" else "rejected"
        (record,) = listed(c, state=final)
    assert response.status_code == 409
    assert error_code(response) == "approval_already_resolved"
    assert response.json()["approval_id"] == pending["approval_id"]
    assert (record["id"], record["status"]) == (pending["approval_id"], final)
    assert runs_of(proxy) == ({pending["effect_id"]: 1} if first == "approve" else {})


# --- reason and name -----------------------------------------------------------------------


def test_the_reason_and_the_deciding_keys_name_are_stored_and_listed(
    proxy: ProxyHarness,
) -> None:
    session = new_session()
    with proxy.client() as c, proxy.client(proxy.approver_key) as approver:
        approved = await_approval(c, drop_db(session, 1, "a"))["approval_id"]
        rejected = await_approval(c, drop_db(session, 2, "b"))["approval_id"]
        anonymous = await_approval(c, drop_db(session, 3, "c"))["approval_id"]
        decide(approver, approved, "approve", {"reason": "ticket OPS-12"})
        decide(c, rejected, "reject", {"reason": "wrong database"})
        (a,) = listed(c, state="approved")
        rejected_list = listed(c, state="rejected")
        one = c.get(f"/approvals/{rejected}").json()
        still = c.get(f"/approvals/{anonymous}").json()
    assert (a["id"], a["reason"], a["decided_by"]) == (approved, "ticket OPS-12", "key:approver")
    assert a["decided_at"] is not None
    (r,) = rejected_list
    assert (r["id"], r["reason"], r["decided_by"]) == (rejected, "wrong database", "key:admin")
    assert (one["reason"], one["decided_by"]) == ("wrong database", "key:admin")
    assert (still["status"], still["reason"], still["decided_by"]) == ("pending", None, None)


@pytest.mark.parametrize("action", ["approve", "reject"])
@pytest.mark.parametrize(
    "raw",
    [b"{not json", b"[1, 2]", b'"approve"', b'{"reason": 5}', b'{"decided_by": "ana"}',
     b'{"reason": "ok", "colour": "red"}'],
    ids=["not-json", "array", "string", "reason-not-text", "decided-by-refused", "unknown-field"],
)  # fmt: skip
def test_a_malformed_decision_body_is_a_400_and_decides_nothing(
    proxy: ProxyHarness, action: str, raw: bytes
) -> None:
    with proxy.client() as c:
        pending = await_approval(c, drop_db(new_session()))
        response = decide(c, pending["approval_id"], action, raw=raw)
        (still,) = listed(c)
    assert response.status_code == 400, response.text
    assert error_code(response) == "invalid_request"
    assert (still["id"], still["status"]) == (pending["approval_id"], "pending")
    assert runs_of(proxy) == {}


def test_an_empty_decision_body_is_fine(proxy: ProxyHarness) -> None:
    with proxy.client() as c, proxy.client(proxy.approver_key) as approver:
        pending = await_approval(c, drop_db(new_session()))
        response = decide(approver, pending["approval_id"], "approve", raw=b"")
    assert response.status_code == 200, response.text


# --- tenancy -------------------------------------------------------------------------------


@pytest.mark.parametrize("action", ["approve", "reject"])
def test_another_orgs_approval_is_not_found(
    proxy: ProxyHarness, proxy_factory: Any, action: str
) -> None:
    other: ProxyHarness = proxy_factory()  # a second org, known to the shared store
    with proxy.client() as c:
        pending = await_approval(c, drop_db(new_session()))
    with proxy.client(other.api_key) as intruder:
        response = decide(intruder, pending["approval_id"], action)
        seen = listed(intruder)
        peek = intruder.get(f"/approvals/{pending['approval_id']}")
    with proxy.client() as c:
        (still,) = listed(c)
    assert response.status_code == 404
    assert error_code(response) == "not_found"
    assert peek.status_code == 404
    assert seen == []
    assert still["status"] == "pending"


@pytest.mark.parametrize("action", ["approve", "reject"])
def test_a_missing_approval_id_is_a_400(proxy: ProxyHarness, action: str) -> None:
    with proxy.client() as c:
        response = c.post(f"/approvals//{action}")
    assert response.status_code == 400
    assert error_code(response) == "invalid_request"


@pytest.mark.parametrize("action", ["approve", "reject"])
def test_an_unknown_approval_is_not_found(proxy: ProxyHarness, action: str) -> None:
    with proxy.client() as c:
        response = decide(c, str(uuid.uuid4()), action)
    assert response.status_code == 404
    assert error_code(response) == "not_found"


def test_a_claimed_org_header_that_is_not_the_keys_is_refused(proxy: ProxyHarness) -> None:
    with proxy.client() as c:
        pending = await_approval(c, drop_db(new_session()))
        response = c.post(
            f"/approvals/{pending['approval_id']}/approve", headers={"X-Org-Id": "org-other"}
        )
    assert response.status_code == 403


# --- timeouts ------------------------------------------------------------------------------


def wait_for_status(c: httpx.Client, approval_id: str, status: str) -> dict[str, Any]:
    found: dict[str, Any] = {}

    def decided() -> bool:
        record = c.get(f"/approvals/{approval_id}").json()
        found.update(record)
        return bool(record["status"] == status)

    wait_until(decided, timeout=DEADLINE, what=f"approval {approval_id} to be {status}")
    return found


def test_an_unanswered_approval_times_out_and_the_retry_is_refused(proxy_factory: Any) -> None:
    proxy: ProxyHarness = proxy_factory(org_options=SHORT_TIMEOUT, **FAST_SWEEP)
    session = new_session()
    with proxy.client() as c:
        pending = await_approval(c, drop_db(session))
        record = wait_for_status(c, pending["approval_id"], "timed_out")
        timed_out = listed(c, state="timed_out")
        retry = ask(c, drop_db(session))
        late = decide(c, pending["approval_id"], "approve")
        view = session_of(c, session)
    assert [a["id"] for a in timed_out] == [pending["approval_id"]]
    assert record["decided_by"] == "policy"
    assert retry.status_code == 409
    assert error_code(retry) == "approval_timed_out"
    assert retry.json()["approval_id"] == pending["approval_id"]
    assert late.status_code == 409
    assert error_code(late) == "approval_timed_out"
    assert view["effects"][0]["state"] == "timed_out"
    assert view["state"] == "active"
    assert runs_of(proxy) == {}


def test_an_org_that_auto_approves_runs_the_call_once_when_it_times_out(
    proxy_factory: Any,
) -> None:
    proxy: ProxyHarness = proxy_factory(org_options=AUTO_APPROVE, **FAST_SWEEP)
    session = new_session()
    with proxy.client() as c:
        pending = await_approval(c, drop_db(session))
        record = wait_for_status(c, pending["approval_id"], "auto_approved")
        wait_until(
            lambda: effect_state(c, session, pending["effect_id"]) == "committed",
            timeout=DEADLINE,
            what="the auto-approved call to be committed",
        )
        retry = ask(c, drop_db(session))
        late = decide(c, pending["approval_id"], "reject")
    assert record["decided_by"] == "policy"
    assert retry.status_code == 200
    assert retry.json()["status"] == "replayed"
    assert retry.json()["result"]["output"] == {"db_name": "prod", "status": "deleted"}
    assert late.status_code == 409
    assert error_code(late) == "approval_already_resolved"
    assert runs_of(proxy) == {pending["effect_id"]: 1}


def test_the_sweeper_keeps_going_after_an_unexpected_error(proxy_factory: Any) -> None:
    proxy: ProxyHarness = proxy_factory(org_options=SHORT_TIMEOUT, **FAST_SWEEP)
    approvals = proxy.runtime.approvals
    real_sweep = approvals.sweep
    failures = []

    async def sweep_failing_once(limit: int = 100) -> Any:
        if not failures:
            failures.append("boom")
            raise RuntimeError("an unexpected bug")
        return await real_sweep(limit)

    approvals.sweep = sweep_failing_once
    with proxy.client() as c:
        wait_until(lambda: bool(failures), timeout=DEADLINE, what="the failing sweep")
        pending = await_approval(c, drop_db(new_session()))
        wait_for_status(c, pending["approval_id"], "timed_out")


def wait_past(timeout_at: str) -> None:
    """Wait (polling the clock) until an RFC 3339 deadline has passed."""
    import datetime as dt

    deadline = dt.datetime.fromisoformat(timeout_at.replace("Z", "+00:00")).timestamp()
    wait_until(lambda: time.time() > deadline + 0.05, timeout=DEADLINE, what="the deadline")


def test_a_decision_after_the_deadline_gets_the_timeout_when_nobody_swept_yet(
    proxy_factory: Any,
) -> None:
    proxy: ProxyHarness = proxy_factory(org_options=SHORT_TIMEOUT, **NO_SWEEP)
    session = new_session()
    with proxy.client() as c:
        pending = await_approval(c, drop_db(session))
        wait_past(c.get(f"/approvals/{pending['approval_id']}").json()["timeout_at"])
        late = decide(c, pending["approval_id"], "approve")
        record = c.get(f"/approvals/{pending['approval_id']}").json()
        retry = ask(c, drop_db(session))
    assert late.status_code == 409
    assert error_code(late) == "approval_timed_out"
    assert record["status"] == "timed_out"
    assert error_code(retry) == "approval_timed_out"
    assert runs_of(proxy) == {}


def test_a_decision_after_the_deadline_of_an_auto_approving_org_still_runs_the_call_once(
    proxy_factory: Any,
) -> None:
    proxy: ProxyHarness = proxy_factory(org_options=AUTO_APPROVE, **NO_SWEEP)
    session = new_session()
    with proxy.client() as c:
        pending = await_approval(c, drop_db(session))
        wait_past(c.get(f"/approvals/{pending['approval_id']}").json()["timeout_at"])
        late = decide(c, pending["approval_id"], "reject")
        record = c.get(f"/approvals/{pending['approval_id']}").json()
        wait_until(
            lambda: effect_state(c, session, pending["effect_id"]) == "committed",
            timeout=DEADLINE,
            what="the auto-approved call to be committed",
        )
        retry = ask(c, drop_db(session))
    assert late.status_code == 409
    assert error_code(late) == "approval_already_resolved"
    assert record["status"] == "auto_approved"
    assert retry.json()["status"] == "replayed"
    assert runs_of(proxy) == {pending["effect_id"]: 1}


# --- restart -------------------------------------------------------------------------------


@pytest.fixture
def config_for(tmp_path: Path) -> Iterator[Any]:
    """Writes an org config and starts `python -m undolog serve` children on it."""
    started: list[ProcessServer] = []

    def spawn(store_url: str, upstream: ThreadServer, org_id: str, key: str) -> ProcessServer:
        config = write_org_config(tmp_path / "undolog.toml", org_id, key)
        # One key makes and approves the call: a single-person setup, allowed by the env var.
        server = spawn_proxy(store_url, upstream.url, config, log_path=tmp_path / "proxy.log",
                             UNDOLOG_ALLOW_SELF_APPROVAL="true")  # fmt: skip
        started.append(server)
        return server

    yield spawn
    for server in reversed(started):
        server.stop()


@pytest.mark.slow
def test_a_pending_approval_survives_a_kill_9_and_is_approved_after_the_restart(
    store_url: str, demo_upstream: ThreadServer, config_for: Any
) -> None:
    org_id, key = f"org-{uuid.uuid4().hex[:12]}", f"ul_test_{uuid.uuid4().hex}"
    headers = {"X-Api-Key": key}
    first: ProcessServer = config_for(store_url, demo_upstream, org_id, key)
    session = new_session()
    with httpx.Client(base_url=first.url, headers=headers, timeout=30) as c:
        for name, spec in DEMO_TOOLS.items():
            c.put(f"/tools/{name}", json=spec).raise_for_status()
        pending = await_approval(c, drop_db(session))
    first.kill()

    second: ProcessServer = config_for(store_url, demo_upstream, org_id, key)
    with httpx.Client(base_url=second.url, headers=headers, timeout=30) as c:
        (still,) = listed(c)
        response = decide(c, pending["approval_id"], "approve")
        retry = ask(c, drop_db(session))
    assert (still["id"], still["status"]) == (pending["approval_id"], "pending")
    assert response.status_code == 200, response.text
    assert response.json()["execution"] == "committed"
    assert retry.json()["status"] == "replayed"
    with httpx.Client(base_url=demo_upstream.url) as upstream:
        assert upstream.get("/counters/delete_database").json() == {pending["effect_id"]: 1}


# --- metrics -------------------------------------------------------------------------------


def samples(proxy: ProxyHarness) -> list[tuple[str, dict[str, str], float]]:
    text = httpx.get(f"{proxy.url}/metrics", headers=METRICS_AUTH, timeout=10).text
    return [
        (s.name, dict(s.labels), s.value)
        for family in text_string_to_metric_families(text)
        for s in family.samples
    ]


def value(found: list[tuple[str, dict[str, str], float]], name: str, **labels: str) -> float:
    matching = [v for n, lab, v in found if n == name and lab == labels]
    return matching[0] if matching else 0.0


def test_decisions_are_counted_by_action_and_result_and_routes_collapse_the_id(
    proxy: ProxyHarness,
) -> None:
    session = new_session()
    with proxy.client() as c, proxy.client(proxy.approver_key) as approver:
        approved = await_approval(c, drop_db(session, 1, "a"))["approval_id"]
        rejected = await_approval(c, drop_db(session, 2, "b"))["approval_id"]
        assert decide(approver, approved, "approve").status_code == 200
        assert decide(approver, approved, "approve").status_code == 409
        assert decide(c, rejected, "reject").status_code == 200
        assert decide(c, rejected, "reject", raw=b"{oops").status_code == 400
    found = samples(proxy)
    decisions = "undolog_proxy_approval_decisions_total"
    latency = "undolog_proxy_approval_decision_duration_seconds_count"
    assert value(found, decisions, action="approve", result="approved") == 1
    assert value(found, decisions, action="approve", result="approval_already_resolved") == 1
    assert value(found, decisions, action="reject", result="rejected") == 1
    # The malformed body never reached the decision: not sampled.
    assert value(found, latency, action="approve") == 2
    assert value(found, latency, action="reject") == 1
    requests = "undolog_proxy_http_requests_total"
    assert value(found, requests, route="/approvals/{id}/approve", status="200") == 1
    assert value(found, requests, route="/approvals/{id}/approve", status="409") == 1
    assert value(found, requests, route="/approvals/{id}/reject", status="200") == 1
    assert value(found, requests, route="/approvals/{id}/reject", status="400") == 1
    routes = {lab.get("route") for _, lab, _ in found if "route" in lab}
    assert not any(approved in r or rejected in r for r in routes if r)
    assert value(found, "undolog_proxy_http_request_duration_seconds_count",
                 route="/approvals/{id}/approve") == 2  # fmt: skip
