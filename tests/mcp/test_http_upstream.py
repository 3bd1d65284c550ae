"""A Streamable HTTP upstream (an `mcp` package server on uvicorn) with a required header."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from mcp.server.mcpserver import MCPServer
from mcp_types import ToolAnnotations

from tests.mcp.conftest import Gateway, serve_gateway
from tests.support.servers import ThreadServer

pytestmark = pytest.mark.slow

TOKEN = "Bearer upstream-secret"


def _counter_app(counts: dict[str, int]) -> Any:
    server = MCPServer("counter")

    @server.tool(annotations=ToolAnnotations(read_only_hint=True))
    def peek() -> int:
        """How many bumps so far."""
        return counts["bumps"]

    @server.tool(annotations=ToolAnnotations(destructive_hint=False))
    def bump(by: int) -> int:
        """Add to the counter."""
        counts["bumps"] += by
        return counts["bumps"]

    @server.tool(annotations=ToolAnnotations(read_only_hint=False, destructive_hint=True))
    def reset() -> int:
        """Set the counter to zero."""
        counts["bumps"] = 0
        return 0

    app = server.streamable_http_app(stateless_http=True, json_response=True)

    async def require_token(scope: Any, receive: Any, send: Any) -> None:
        headers = dict(scope.get("headers", []))
        if scope["type"] == "http" and headers.get(b"authorization") != TOKEN.encode():
            await send({"type": "http.response.start", "status": 401, "headers": []})
            await send({"type": "http.response.body", "body": b""})
            return
        await app(scope, receive, send)

    return require_token


@pytest.fixture
def counts() -> dict[str, int]:
    return {"bumps": 0}


@pytest.fixture
def upstream(counts: dict[str, int]) -> Iterator[ThreadServer]:
    server = ThreadServer(_counter_app(counts)).start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def http_gateway(tmp_path: Path, upstream: ThreadServer) -> Iterator[Gateway]:
    mcp = {
        "upstreams": [
            {
                "name": "counter",
                "url": f"{upstream.url}/mcp",
                "headers": {"Authorization": TOKEN},
                "tools": {"bump": {"tier": "compensable", "compensation": {"tool": "bump"}}},
            }
        ]
    }
    with serve_gateway(mcp, f"sqlite:///{tmp_path / 'undolog.db'}", tmp_path) as gateway:
        yield gateway


async def test_an_http_upstreams_tools_keep_their_schemas_and_annotations(
    http_gateway: Gateway, era: str
) -> None:
    async with http_gateway.client(era=era) as client:
        tools = {t.name: t for t in (await client.list_tools()).tools}
    assert set(tools) == {"counter.peek", "counter.bump", "counter.reset"}
    annotations = tools["counter.peek"].annotations
    assert annotations is not None and annotations.read_only_hint is True
    assert tools["counter.bump"].input_schema["properties"]["by"]["type"] == "integer"


async def test_tiers_follow_annotations_without_config(
    http_gateway: Gateway, counts: dict[str, int], era: str
) -> None:
    async with http_gateway.client(str(uuid.uuid4()), era=era) as client:
        read = await client.call_tool("counter.peek", {})
        counts["bumps"] = 5
        write = await client.call_tool("counter.reset", {})
    assert not read.is_error
    # Not read-only and nothing in the config: irreversible, so it waits for approval.
    assert write.is_error
    assert write.meta["undolog"]["status"] == "pending_approval"  # type: ignore[index]
    assert counts["bumps"] == 5


async def test_an_upstream_that_cannot_be_reached_gives_an_is_error_result_and_a_retry_runs_again(
    http_gateway: Gateway, upstream: ThreadServer, counts: dict[str, int]
) -> None:
    session_id = str(uuid.uuid4())
    upstream.stop()
    async with http_gateway.client(session_id) as client:
        read = await client.call_tool("counter.peek", {})
        write = await client.call_tool("counter.bump", {"by": 1})
    assert read.is_error and write.is_error
    assert write.meta["undolog"]["error"]["code"] == "tool_error"  # type: ignore[index]
    with http_gateway.rest() as rest:
        (effect,) = rest.get(f"/sessions/{session_id}").json()["effects"]
    assert effect["state"] == "failed"

    back = ThreadServer(_counter_app(counts), port=upstream.port).start()
    try:
        async with http_gateway.client(session_id) as client:
            retried = await client.call_tool("counter.bump", {"by": 1})
    finally:
        back.stop()
    assert not retried.is_error, retried.content
    assert counts["bumps"] == 1
    # A failure is no result: the same call again is its retry, a new attempt of one effect.
    with http_gateway.rest() as rest:
        (effect,) = rest.get(f"/sessions/{session_id}").json()["effects"]
    assert (effect["state"], effect["attempts"]) == ("committed", 2)
