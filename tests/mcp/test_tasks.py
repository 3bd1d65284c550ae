"""MCP Tasks (2025-11-25): a task-augmented `tools/call` that needs a person becomes an
`input_required` task; `tasks/get` follows the approval and the approved run, `tasks/result`
returns the tool's result (the upstream ran once) or the refusal. Raw JSON-RPC over HTTP
against a real proxy and the real memory server (the official client sends no tasks)."""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.mcp.conftest import Gateway, gateway_config, serve_gateway
from tests.support.servers import ThreadServer, await_until
from undolog.config import KeyConfig, OrgConfig, Settings, hash_api_key
from undolog.engine.model import now_us
from undolog.mcp.config import parse_mcp_settings
from undolog.mcp.tasks import DEFAULT_TTL_MS, MAX_TTL_MS, MIN_TTL_MS, RELATED_TASK
from undolog.store import open_store
from undolog.store.records import McpTaskRecord

pytestmark = pytest.mark.slow

NOT_FOUND = -32602


@dataclass
class Raw:
    """A handshake-era MCP client speaking JSON-RPC itself: one POST per request."""

    http: httpx.AsyncClient

    async def send(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        body = {"jsonrpc": "2.0", "id": secrets.randbelow(1 << 30), "method": method,
                "params": params}  # fmt: skip
        answer = await self.http.post("/mcp", json=body)
        assert answer.status_code == 200, answer.text
        message: dict[str, Any] = answer.json()
        return message

    async def result(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        message = await self.send(method, params)
        assert "result" in message, message
        result: dict[str, Any] = message["result"]
        return result

    async def call(self, tool: str, args: dict[str, Any]) -> dict[str, Any]:
        return await self.result("tools/call", {"name": tool, "arguments": args})

    async def call_as_task(self, tool: str, args: dict[str, Any], **task: Any) -> dict[str, Any]:
        result = await self.result("tools/call", {"name": tool, "arguments": args, "task": task})
        created: dict[str, Any] = result["task"]
        return {**created, "_meta": result.get("_meta")}

    async def get(self, task_id: str) -> dict[str, Any]:
        return await self.result("tasks/get", {"taskId": task_id})


@contextlib.asynccontextmanager
async def raw(url: str, api_key: str, session_id: str | None = None) -> AsyncIterator[Raw]:
    headers = {
        "X-Api-Key": api_key,
        "Accept": "application/json, text/event-stream",
        "MCP-Protocol-Version": "2025-11-25",
    }
    if session_id is not None:
        headers["X-UndoLog-Session-Id"] = session_id
    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=30) as http:
        yield Raw(http)


def _entity(name: str) -> dict[str, object]:
    return {"name": name, "entityType": "person", "observations": ["met at the tasks test"]}


def _text(result: dict[str, Any]) -> str:
    return "\n".join(c["text"] for c in result["content"] if c.get("type") == "text")


def _held(gateway: Gateway) -> int:
    return int(gateway.server.app.fastapi.state.runtime.waits._total)


async def _pending_approval(gateway: Gateway) -> dict[str, Any]:
    with gateway.rest() as rest:
        (approval,) = rest.get("/approvals", params={"state": "pending"}).json()
    assert isinstance(approval, dict)
    return approval


# -- what the server declares ------------------------------------------------------------------


async def test_the_server_declares_task_augmented_tool_calls_and_its_tools_accept_them(
    gateway: Gateway,
) -> None:
    async with raw(gateway.url, gateway.api_key) as client:
        init = await client.result("initialize", {
            "protocolVersion": "2025-11-25", "capabilities": {},
            "clientInfo": {"name": "raw", "version": "0"}})  # fmt: skip
        tools = (await client.result("tools/list", {}))["tools"]
    # Only what is served: task-augmented tools/call; no tasks/list, no tasks/cancel.
    assert init["capabilities"]["tasks"] == {"requests": {"tools": {"call": {}}}}
    assert tools and all(t["execution"] == {"taskSupport": "optional"} for t in tools)


async def test_tasks_are_declared_to_the_handshake_era_only(gateway: Gateway, era: str) -> None:
    async with gateway.client(era=era) as client:
        declared = client.server_capabilities.tasks
        tools = (await client.list_tools()).tools
    if era == "legacy":
        assert declared is not None and declared.list is None and declared.cancel is None
        assert all(t.execution and t.execution.task_support == "optional" for t in tools)
    else:  # 2026-07-28: tasks are an extension there, not served
        assert declared is None
        assert all(t.execution is None for t in tools)


# -- an approval as a task ---------------------------------------------------------------------


@pytest.mark.parametrize("gateway_store", ["sqlite", "postgres"], indirect=True)
async def test_an_approval_is_an_input_required_task_whose_result_comes_once_approved(
    tmp_path: Path, gateway_store: str, session_id: str
) -> None:
    # A long wait configured: a task-augmented call is not held by it (the task is the wait).
    config = {**gateway_config(tmp_path / "memory.jsonl"), "approval_wait_seconds": 25}
    with serve_gateway(config, gateway_store, tmp_path) as gateway:
        async with raw(gateway.url, gateway.api_key, session_id) as client:
            created = await client.call("memory.create_entities", {"entities": [_entity("bob")]})
            assert not created["isError"], created
            call = asyncio.create_task(
                client.call_as_task("memory.delete_entities", {"entityNames": ["bob"]}, ttl=90_000)
            )
            await await_until(lambda: call.done() or _held(gateway) > 0, what="the answer")
            assert _held(gateway) == 0
            task = await call
            approval = await _pending_approval(gateway)
            assert task["status"] == "input_required"
            assert approval["id"] in task["statusMessage"]
            assert "/ui/#/approvals/pending" in task["statusMessage"]
            assert task["ttl"] == 90_000 and task["pollInterval"] > 0
            assert task["createdAt"].endswith("Z") and task["lastUpdatedAt"]
            immediate = task["_meta"]["io.modelcontextprotocol/model-immediate-response"]
            assert approval["id"] in immediate
            assert (await client.get(task["taskId"]))["status"] == "input_required"
            assert gateway.entities() == ["bob"]  # nothing ran

            # tasks/result blocks until the task ends: here, until a person approves.
            result_call = asyncio.create_task(
                client.result("tasks/result", {"taskId": task["taskId"]})
            )
            await await_until(lambda: _held(gateway) == 1, what="tasks/result to wait")
            with gateway.rest() as rest:
                answer = rest.post(f"/approvals/{approval['id']}/approve", json={})
            assert answer.json()["execution"] == "committed", answer.text
            assert gateway.entities() == []
            # Re-created: had tasks/result run the deletion again, bob would be gone.
            await client.call("memory.create_entities", {"entities": [_entity("bob")]})
            result = await asyncio.wait_for(result_call, 20)
            done = await client.get(task["taskId"])
        assert not result.get("isError"), result
        assert result["_meta"][RELATED_TASK] == {"taskId": task["taskId"]}
        assert result["_meta"]["undolog"]["status"] == "replayed"
        assert done["status"] == "completed"
        assert gateway.entities() == ["bob"]
        assert _held(gateway) == 0

        # Delivered like a tools/call answer: the same call again is a new call.
        async with raw(gateway.url, gateway.api_key, session_id) as client:
            again = await client.call("memory.delete_entities", {"entityNames": ["bob"]})
        assert again["_meta"]["undolog"]["status"] == "pending_approval"
        assert again["_meta"]["undolog"]["approval_id"] != approval["id"]


async def test_a_rejected_approval_fails_the_task_with_the_refusal(
    gateway: Gateway, session_id: str
) -> None:
    async with raw(gateway.url, gateway.api_key, session_id) as client:
        await client.call("memory.create_entities", {"entities": [_entity("ann")]})
        task = await client.call_as_task("memory.delete_entities", {"entityNames": ["ann"]})
        approval = await _pending_approval(gateway)
        with gateway.rest() as rest:
            rest.post(f"/approvals/{approval['id']}/reject", json={}).raise_for_status()
        state = await client.get(task["taskId"])
        result = await client.result("tasks/result", {"taskId": task["taskId"]})
    assert state["status"] == "failed"
    assert result["isError"]
    assert result["_meta"]["undolog"]["error"]["code"] == "approval_rejected"
    assert result["_meta"][RELATED_TASK] == {"taskId": task["taskId"]}
    assert gateway.entities() == ["ann"]


async def test_a_call_that_needs_no_person_completes_at_once(
    gateway: Gateway, session_id: str
) -> None:
    async with raw(gateway.url, gateway.api_key, session_id) as client:
        task = await client.call_as_task("memory.create_entities", {"entities": [_entity("cy")]})
        assert gateway.entities() == ["cy"]  # ran before the task was answered
        state = await client.get(task["taskId"])
        result = await client.result("tasks/result", {"taskId": task["taskId"]})
    assert task["status"] == state["status"] == "completed"
    assert task["ttl"] == DEFAULT_TTL_MS
    assert not result["isError"]
    assert result["_meta"]["undolog"]["status"] == "executed"
    assert result["_meta"][RELATED_TASK] == {"taskId": task["taskId"]}


async def test_a_read_without_a_session_is_a_completed_task_too(gateway: Gateway) -> None:
    async with raw(gateway.url, gateway.api_key) as client:
        task = await client.call_as_task("time.get_current_time", {"timezone": "UTC"})
        result = await client.result("tasks/result", {"taskId": task["taskId"]})
    assert task["status"] == "completed"
    assert "UTC" in _text(result)


async def test_protocol_errors_stay_json_rpc_errors_with_a_task(
    gateway: Gateway, session_id: str
) -> None:
    async with raw(gateway.url, gateway.api_key, session_id) as client:
        unknown = await client.send(
            "tools/call", {"name": "memory.nope", "arguments": {}, "task": {}}
        )
        bad_ttl = await client.send(
            "tools/call", {"name": "memory.read_graph", "arguments": {}, "task": {"ttl": "x"}}
        )
    assert unknown["error"]["code"] == -32602
    assert bad_ttl["error"]["code"] == -32602


async def test_a_tasks_ttl_is_the_clients_within_bounds(gateway: Gateway) -> None:
    async with raw(gateway.url, gateway.api_key) as client:
        args = {"timezone": "UTC"}
        short = await client.call_as_task("time.get_current_time", args, ttl=1)
        long = await client.call_as_task("time.get_current_time", args, ttl=10**15)
    assert (short["ttl"], long["ttl"]) == (MIN_TTL_MS, MAX_TTL_MS)


# -- waits: the caps, a client that leaves -----------------------------------------------------


async def test_tasks_result_over_the_wait_cap_is_a_clear_error_not_a_hang(
    gateway: Gateway, session_id: str
) -> None:
    gateway.server.app.fastapi.state.runtime.waits.max_per_key = 1
    async with raw(gateway.url, gateway.api_key, session_id) as client:
        task = await client.call_as_task("memory.delete_entities", {"entityNames": ["x"]})
        first = asyncio.create_task(client.result("tasks/result", {"taskId": task["taskId"]}))
        await await_until(lambda: _held(gateway) == 1, what="the first tasks/result to wait")
        second = await client.send("tasks/result", {"taskId": task["taskId"]})
        first.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await first
    assert second["error"]["code"] == -32600
    assert second["error"]["data"]["code"] == "rate_limited"
    # The client that left frees its wait.
    await await_until(lambda: _held(gateway) == 0, what="the first wait to end")


# -- scoping: ids are unguessable and the caller's own -----------------------------------------


@dataclass
class Keys:
    url: str
    org_id: str
    admin: str
    agent_a: str
    agent_b: str
    other_org: str


@pytest.fixture
def keys(tmp_path: Path, gateway_store: str) -> Iterator[Keys]:
    """One gateway, two orgs: the first with an admin and two agent keys."""
    from undolog.proxy import create_app

    org_id, other = (f"org-{secrets.token_hex(6)}" for _ in range(2))
    upstreams = [
        {**u, "orgs": [org_id]} for u in gateway_config(tmp_path / "memory.jsonl")["upstreams"]
    ]
    admin, agent_a, agent_b, other_admin = (
        "ul_test_" + secrets.token_urlsafe(18) for _ in range(4)
    )
    settings = Settings(
        database_url=gateway_store,
        upstream_timeout_seconds=20.0,
        lease_seconds=30.0,
        log_level="warning",
        orgs=(
            OrgConfig(
                org_id=org_id,
                keys=(
                    KeyConfig(name="admin", role="admin", key_hash=hash_api_key(admin)),
                    KeyConfig(name="agent-a", role="agent", key_hash=hash_api_key(agent_a)),
                    KeyConfig(name="agent-b", role="agent", key_hash=hash_api_key(agent_b)),
                ),
            ),
            OrgConfig(
                org_id=other,
                keys=(KeyConfig(name="admin", role="admin", key_hash=hash_api_key(other_admin)),),
            ),
        ),
        mcp=parse_mcp_settings({"approval_wait_seconds": 0, "upstreams": upstreams}),
    )
    server = ThreadServer(create_app(settings)).start()
    try:
        yield Keys(server.url, org_id, admin, agent_a, agent_b, other_admin)
    finally:
        server.stop()


@pytest.mark.security
@pytest.mark.parametrize("gateway_store", ["sqlite", "postgres"], indirect=True)
async def test_a_task_is_found_only_by_its_own_org_and_agent_key(keys: Keys) -> None:
    session_id = str(uuid.uuid4())
    async with raw(keys.url, keys.agent_a, session_id) as a:
        task = await a.call_as_task("memory.delete_entities", {"entityNames": ["x"]})
        assert (await a.get(task["taskId"]))["status"] == "input_required"
    task_id = task["taskId"]
    for key in (keys.agent_b, keys.other_org):  # another agent's task, another org's task
        async with raw(keys.url, key) as other:
            for method in ("tasks/get", "tasks/result"):
                refused = await other.send(method, {"taskId": task_id})
                assert refused["error"]["code"] == NOT_FOUND, (key, method, refused)
                assert "not found" in refused["error"]["message"].lower()
    async with raw(keys.url, keys.agent_a) as a:
        for unknown in (str(uuid.uuid4()), "", task_id.upper(), task_id + "0"):
            assert (await a.send("tasks/get", {"taskId": unknown}))["error"]["code"] == NOT_FOUND
    async with raw(keys.url, keys.admin) as admin:  # an org-wide key sees the org's tasks
        assert (await admin.get(task_id))["status"] == "input_required"


@pytest.mark.security
@pytest.mark.parametrize("gateway_store", ["sqlite", "postgres"], indirect=True)
async def test_a_malformed_task_id_is_not_found_never_an_internal_error(gateway: Gateway) -> None:
    # A NUL byte reached PostgreSQL, which refuses it in text: -32603 "internal error".
    real = str(uuid.uuid4())
    malformed = ["\x00", real + "\x00", real[:8] + "\x00" + real[9:], "\u00e9" * 36, "x" * 10_000,
                 "{" + real + "}", "urn:uuid:" + real, real.replace("-", "")]  # fmt: skip
    async with raw(gateway.url, gateway.api_key) as client:
        for method in ("tasks/get", "tasks/result"):
            for task_id in malformed:
                refused = await client.send(method, {"taskId": task_id})
                assert refused["error"]["code"] == NOT_FOUND, (method, task_id[:20], refused)
                assert "not found" in refused["error"]["message"].lower()
            for not_a_string in (None, 5, [], {}):
                refused = await client.send(method, {"taskId": not_a_string})
                assert refused["error"]["code"] == NOT_FOUND, (method, not_a_string, refused)
            missing = await client.send(method, {})
            assert missing["error"]["code"] == NOT_FOUND, (method, missing)


# -- durable: any process, after a restart -----------------------------------------------------


@pytest.mark.parametrize("gateway_store", ["sqlite", "postgres"], indirect=True)
async def test_a_new_proxy_on_the_same_store_answers_an_old_task(
    tmp_path: Path, gateway_store: str, session_id: str
) -> None:
    config = gateway_config(tmp_path / "memory.jsonl")
    with serve_gateway(config, gateway_store, tmp_path) as first:
        async with raw(first.url, first.api_key, session_id) as client:
            await client.call("memory.create_entities", {"entities": [_entity("dan")]})
            task = await client.call_as_task("memory.delete_entities", {"entityNames": ["dan"]})
        org_id, api_key = first.org_id, first.api_key
    with serve_gateway(config, gateway_store, tmp_path, org_id=org_id, api_key=api_key) as second:
        async with raw(second.url, api_key) as client:
            assert (await client.get(task["taskId"]))["status"] == "input_required"
            approval = await _pending_approval(second)
            with second.rest() as rest:
                rest.post(f"/approvals/{approval['id']}/approve", json={}).raise_for_status()
            state = await client.get(task["taskId"])
            result = await client.result("tasks/result", {"taskId": task["taskId"]})
    assert state["status"] == "completed"
    assert not result["isError"]
    assert second.entities() == []


@pytest.mark.parametrize("gateway_store", ["sqlite", "postgres"], indirect=True)
async def test_an_expired_task_is_not_found_and_its_row_goes(
    gateway: Gateway, gateway_store: str
) -> None:
    store = await open_store(gateway_store)
    try:
        now = now_us()
        kept = McpTaskRecord(
            task_id=str(uuid.uuid4()), org_id=gateway.org_id, owner_key_id=None, session_id=None,
            effect_id=None, approval_id=None, tool_name="time.get_current_time",
            result_json='{"content": [], "isError": false}', created_us=now - 120_000_000,
            ttl_ms=MIN_TTL_MS, expires_us=now + 3_600_000_000,
        )  # fmt: skip
        expired = replace(kept, task_id=str(uuid.uuid4()), expires_us=now - 1)
        async with store.transaction() as q:
            await q.insert_mcp_task(kept)
            await q.insert_mcp_task(expired)
        async with raw(gateway.url, gateway.api_key) as client:
            assert (await client.get(kept.task_id))["status"] == "completed"
            gone = await client.send("tasks/get", {"taskId": expired.task_id})
            assert gone["error"]["code"] == NOT_FOUND
            # Creating a task deletes expired ones.
            await client.call_as_task("time.get_current_time", {"timezone": "UTC"})
        async with store.reader() as q:
            assert await q.get_mcp_task(gateway.org_id, expired.task_id) is None
            assert await q.get_mcp_task(gateway.org_id, kept.task_id) == kept
    finally:
        await store.close()


# -- final: the status a task ends in does not change ------------------------------------------


@pytest.mark.parametrize("gateway_store", ["sqlite", "postgres"], indirect=True)
async def test_a_task_that_ended_stays_as_it_ended_when_its_effect_moves_on(
    gateway: Gateway, gateway_store: str, session_id: str
) -> None:
    # The approved run in flight, then lost after sending (in doubt), then resolved by an
    # operator as committed: the task went working -> failed, and failed is final (the spec).
    store = await open_store(gateway_store)
    try:
        async with raw(gateway.url, gateway.api_key, session_id) as client:
            task = await client.call_as_task("memory.delete_entities", {"entityNames": ["eve"]})
            approval = await _pending_approval(gateway)
            org_id, effect_id = gateway.org_id, approval["effect_id"]
            async with store.transaction() as q:
                assert await q.update_approval(
                    org_id, approval["id"], expect_status="pending", status="approved",
                    decided_us=now_us(),
                )  # fmt: skip
                assert await q.update_effect(
                    org_id, effect_id, expect_state="awaiting_approval", state="executing",
                    updated_us=now_us(),
                )  # fmt: skip
            working = await client.get(task["taskId"])
            async with store.transaction() as q:
                assert await q.update_effect(
                    org_id, effect_id, expect_state="executing", state="in_doubt",
                    error="the connection was lost after sending", updated_us=now_us(),
                )  # fmt: skip
            failed = await client.get(task["taskId"])
            with gateway.rest() as rest:
                resolved = rest.post(
                    f"/effects/{effect_id}/resolve", json={"outcome": "committed", "result": {}}
                )
            assert resolved.status_code == 200, resolved.text
            after = await client.get(task["taskId"])
            result = await client.result("tasks/result", {"taskId": task["taskId"]})
        async with store.reader() as q:
            kept = await q.get_mcp_task(org_id, task["taskId"])
    finally:
        await store.close()
    assert working["status"] == "working"
    assert failed["status"] == "failed"
    assert after == failed  # the same status, message and lastUpdatedAt
    assert result["isError"]
    assert result["_meta"]["undolog"]["error"]["code"] == "effect_in_doubt"
    assert kept is not None and kept.result_json is not None
    assert kept.ended_us is not None and kept.answers_effect is False
