"""The official MCP client against UndoLog's /mcp, in front of real MCP servers."""

from __future__ import annotations

import uuid

import httpx
import pytest
from mcp import MCPError
from mcp_types import (
    INTERNAL_ERROR,
    INVALID_PARAMS,
    INVALID_REQUEST,
    ElicitRequestURLParams,
    ElicitResult,
)

from tests.mcp.conftest import Gateway

pytestmark = pytest.mark.slow


def _text(result) -> str:  # type: ignore[no-untyped-def]
    return "\n".join(c.text for c in result.content if getattr(c, "type", "") == "text")


async def test_tools_are_listed_under_the_upstream_prefix_with_their_annotations(
    gateway: Gateway, era: str
) -> None:
    async with gateway.client(era=era) as client:
        tools = {t.name: t for t in (await client.list_tools()).tools}
    assert "time.get_current_time" in tools
    assert "memory.create_entities" in tools
    assert tools["memory.create_entities"].input_schema["type"] == "object"


async def test_a_read_passes_straight_through(gateway: Gateway, era: str, session_id: str) -> None:
    async with gateway.client(session_id, era=era) as client:
        result = await client.call_tool("time.get_current_time", {"timezone": "UTC"})
    assert not result.is_error, _text(result)
    assert "UTC" in _text(result)


def _entity(name: str) -> dict[str, object]:
    return {"name": name, "entityType": "person", "observations": ["met at the gateway test"]}


@pytest.mark.parametrize("gateway_store", ["sqlite", "postgres"], indirect=True)
async def test_a_destructive_call_waits_for_approval_and_runs_once_after_it(
    gateway: Gateway, era: str, session_id: str
) -> None:
    async with gateway.client(session_id, era=era) as client:
        created = await client.call_tool("memory.create_entities", {"entities": [_entity("bob")]})
        assert not created.is_error, _text(created)
        args = {"entityNames": ["bob"]}
        waiting = await client.call_tool("memory.delete_entities", args)
        assert waiting.is_error
        approval = waiting.meta["undolog"]  # type: ignore[index]
        assert approval["status"] == "pending_approval"
        assert approval["approval_id"] in _text(waiting)
        assert gateway.entities() == ["bob"]  # nothing ran
        again = await client.call_tool("memory.delete_entities", args)
        assert again.meta["undolog"]["approval_id"] == approval["approval_id"]  # type: ignore[index]

        with gateway.rest() as rest:
            answer = rest.post(f"/approvals/{approval['approval_id']}/approve", json={})
        assert answer.status_code == 200, answer.text
        assert answer.json()["execution"] == "committed"
        assert gateway.entities() == []
        # Re-create it: if the retry ran the deletion again, it would vanish.
        await client.call_tool("memory.create_entities", {"entities": [_entity("carol")]})
        retried = await client.call_tool("memory.delete_entities", args)
    assert not retried.is_error, _text(retried)
    assert retried.meta["undolog"]["status"] == "replayed"  # type: ignore[index]
    assert gateway.entities() == ["carol"]


@pytest.mark.parametrize("gateway_store", ["sqlite", "postgres"], indirect=True)
async def test_rolling_back_a_session_undoes_its_memory_calls_on_the_upstream(
    gateway: Gateway, era: str, session_id: str
) -> None:
    async with gateway.client(str(uuid.uuid4()), era=era) as other:
        kept = await other.call_tool("memory.create_entities", {"entities": [_entity("kept")]})
        assert not kept.is_error, _text(kept)
    async with gateway.client(session_id, era=era) as client:
        for name in ("x", "y"):
            result = await client.call_tool("memory.create_entities", {"entities": [_entity(name)]})
            assert not result.is_error, _text(result)
    assert sorted(gateway.entities()) == ["kept", "x", "y"]
    with gateway.rest() as rest:
        answer = rest.post(f"/sessions/{session_id}/rollback")
    assert answer.status_code == 200, answer.text
    assert answer.json()["outcome"] == "compensated"
    assert gateway.entities() == ["kept"]


async def test_a_write_without_a_session_is_a_protocol_error(gateway: Gateway) -> None:
    async with gateway.client() as client:
        with pytest.raises(MCPError) as caught:
            await client.call_tool("memory.create_entities", {"entities": [_entity("z")]})
    assert caught.value.error.code == INVALID_PARAMS
    assert gateway.entities() == []


async def test_an_unknown_tool_is_a_protocol_error(gateway: Gateway, session_id: str) -> None:
    async with gateway.client(session_id) as client:
        with pytest.raises(MCPError) as caught:
            await client.call_tool("memory.no_such_tool", {})
    assert caught.value.error.code == INVALID_PARAMS


async def test_a_bug_in_a_tool_call_answers_a_generic_error_not_the_python_text(
    gateway: Gateway, era: str, session_id: str
) -> None:
    """The MCP front end's one mapping: an unexpected exception becomes `-32603` with a fixed
    message naming the request id (the details go to the log), never the exception's text."""
    engine = gateway.server.app.fastapi.state.runtime.engine  # type: ignore[attr-defined]

    async def broken(*args: object, **kwargs: object) -> None:
        raise RuntimeError("secret internals at 0xdeadbeef")

    engine.intercept = broken
    try:
        async with gateway.client(session_id, era=era) as client:
            with pytest.raises(MCPError) as caught:
                await client.call_tool("memory.create_entities", {"entities": [_entity("y")]})
    finally:
        del engine.intercept
    assert caught.value.error.code == INTERNAL_ERROR
    message = caught.value.error.message
    assert "secret" not in message and "RuntimeError" not in message
    assert "request id" in message
    assert gateway.entities() == []


def test_mcp_needs_the_api_key(gateway: Gateway) -> None:
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}
    with httpx.Client(base_url=gateway.url, timeout=30) as anonymous:
        answer = anonymous.post("/mcp", json=body, headers=_MCP_HEADERS)
    assert answer.status_code == 401


def test_a_foreign_origin_is_refused(gateway: Gateway) -> None:
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}
    with gateway.rest() as rest:
        refused = rest.post(
            "/mcp", json=body, headers={**_MCP_HEADERS, "Origin": "https://evil.example"}
        )
        same = rest.post("/mcp", json=body, headers={**_MCP_HEADERS, "Origin": gateway.url})
    assert refused.status_code == 403
    assert refused.json()["error"]["code"] == INVALID_REQUEST
    assert same.status_code == 200, same.text


_MCP_HEADERS = {
    "Accept": "application/json, text/event-stream",
    "MCP-Protocol-Version": "2025-11-25",
}


async def test_a_client_that_opens_urls_is_sent_to_the_approval_and_its_retry_gets_the_result(
    gateway: Gateway, session_id: str
) -> None:
    asked: list[ElicitRequestURLParams] = []

    async def person_approves(context: object, params: object) -> ElicitResult:
        # The user opens the URL and a person approves the call there.
        assert isinstance(params, ElicitRequestURLParams)
        asked.append(params)
        with gateway.rest() as rest:
            pending = rest.get("/approvals", params={"state": "pending"}).json()
            (approval,) = pending
            rest.post(f"/approvals/{approval['id']}/approve", json={}).raise_for_status()
        return ElicitResult(action="accept")

    async with gateway.client(
        session_id, era="2026-07-28", elicitation_callback=person_approves
    ) as client:
        created = await client.call_tool("memory.create_entities", {"entities": [_entity("dan")]})
        assert not created.is_error, _text(created)
        deleted = await client.call_tool("memory.delete_entities", {"entityNames": ["dan"]})
    assert not deleted.is_error, _text(deleted)
    assert deleted.meta["undolog"]["status"] == "replayed"  # type: ignore[index]
    assert len(asked) == 1 and "/ui/#/approvals" in asked[0].url
    assert gateway.entities() == []


async def test_a_handshake_era_client_with_elicitation_gets_the_plain_answer(
    gateway: Gateway, session_id: str
) -> None:
    async def never(context: object, params: object) -> ElicitResult:  # pragma: no cover
        raise AssertionError("no input_required on the handshake era")

    async with gateway.client(session_id, era="legacy", elicitation_callback=never) as client:
        waiting = await client.call_tool("memory.delete_entities", {"entityNames": ["nobody"]})
    assert waiting.is_error
    assert waiting.meta["undolog"]["status"] == "pending_approval"  # type: ignore[index]


async def test_the_session_can_come_from_meta_instead_of_a_header(
    gateway: Gateway, session_id: str
) -> None:
    args = {"entities": [_entity("eve")]}
    async with gateway.client() as client:
        first = await client.call_tool(
            "memory.create_entities", args, meta={"undolog/session_id": session_id}
        )
        again = await client.call_tool(
            "memory.create_entities", args, meta={"undolog/session_id": session_id}
        )
    # One session: the second call (its first answer received) is that session's next step.
    assert [first.meta["undolog"]["step_index"], again.meta["undolog"]["step_index"]] == [1, 2]  # type: ignore[index]
    with gateway.rest() as rest:
        assert len(rest.get(f"/sessions/{session_id}").json()["effects"]) == 2


async def test_an_upstream_that_refuses_the_call_gives_an_is_error_result(
    gateway: Gateway, session_id: str
) -> None:
    async with gateway.client(session_id) as client:
        refused = await client.call_tool("memory.create_entities", {"entities": "not a list"})
    assert refused.is_error
    assert gateway.entities() == []


async def test_a_client_that_negotiates_gets_the_stateless_era(gateway: Gateway) -> None:
    async with gateway.client(era="auto") as client:
        assert client.protocol_version == "2026-07-28"
        assert (await client.list_tools()).tools
