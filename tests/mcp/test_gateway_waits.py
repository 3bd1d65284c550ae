"""The gateway's long wait: a `tools/call` that needs a person is held up to
`approval_wait_seconds`; approved meanwhile, the client gets the tool's result in the same
call. The official MCP client against a real proxy and the real memory server."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from tests.mcp.conftest import Gateway, gateway_config, serve_gateway
from tests.support.servers import await_until

pytestmark = pytest.mark.slow


def _entity(name: str) -> dict[str, object]:
    return {"name": name, "entityType": "person", "observations": ["met at the wait test"]}


def _text(result: Any) -> str:
    return "\n".join(c.text for c in result.content if getattr(c, "type", "") == "text")


def _held(gateway: Gateway) -> int:
    runtime = gateway.server.app.fastapi.state.runtime
    return int(runtime.waits._total)


@pytest.mark.parametrize("gateway_store", ["sqlite", "postgres"], indirect=True)
async def test_a_call_approved_while_it_waits_answers_with_the_tools_result(
    tmp_path: Path, gateway_store: str, session_id: str
) -> None:
    config = {**gateway_config(tmp_path / "memory.jsonl"), "approval_wait_seconds": 25}
    with serve_gateway(config, gateway_store, tmp_path) as gateway:
        async with gateway.client(session_id) as client:
            created = await client.call_tool("memory.create_entities",
                                             {"entities": [_entity("bob")]})  # fmt: skip
            assert not created.is_error, _text(created)
            call = asyncio.create_task(
                client.call_tool("memory.delete_entities", {"entityNames": ["bob"]})
            )
            await await_until(lambda: _held(gateway) == 1, what="the call to wait")
            with gateway.rest() as rest:
                (approval,) = rest.get("/approvals").json()
                answer = rest.post(f"/approvals/{approval['id']}/approve", json={})
            assert answer.status_code == 200, answer.text
            result = await asyncio.wait_for(call, 20)
        assert not result.is_error, _text(result)
        assert result.meta["undolog"]["status"] == "replayed"  # type: ignore[index]
        assert gateway.entities() == []  # deleted once, by the approved run
        assert _held(gateway) == 0


async def test_a_call_not_decided_in_time_answers_pending(tmp_path: Path, session_id: str) -> None:
    config = {**gateway_config(tmp_path / "memory.jsonl"), "approval_wait_seconds": 1}
    database = f"sqlite:///{tmp_path / 'undolog.db'}"
    with serve_gateway(config, database, tmp_path) as gateway:
        async with gateway.client(session_id) as client:
            await client.call_tool("memory.create_entities", {"entities": [_entity("eve")]})
            waiting = await client.call_tool("memory.delete_entities", {"entityNames": ["eve"]})
        assert waiting.is_error
        assert waiting.meta["undolog"]["status"] == "pending_approval"  # type: ignore[index]
        assert gateway.entities() == ["eve"]


async def test_a_call_rejected_while_it_waits_is_refused(tmp_path: Path, session_id: str) -> None:
    config = {**gateway_config(tmp_path / "memory.jsonl"), "approval_wait_seconds": 25}
    database = f"sqlite:///{tmp_path / 'undolog.db'}"
    with serve_gateway(config, database, tmp_path) as gateway:
        async with gateway.client(session_id) as client:
            await client.call_tool("memory.create_entities", {"entities": [_entity("ann")]})
            call = asyncio.create_task(
                client.call_tool("memory.delete_entities", {"entityNames": ["ann"]})
            )
            await await_until(lambda: _held(gateway) == 1, what="the call to wait")
            with gateway.rest() as rest:
                (approval,) = rest.get("/approvals").json()
                rest.post(f"/approvals/{approval['id']}/reject", json={}).raise_for_status()
            result = await asyncio.wait_for(call, 20)
        assert result.is_error
        assert "reject" in _text(result).lower()
        assert gateway.entities() == ["ann"]
