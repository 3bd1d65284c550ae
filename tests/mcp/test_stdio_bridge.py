"""`undolog mcp-stdio`: the gateway for stdio-only clients, driven by the official MCP client.

The bridge runs as the desktop client would start it (a child process speaking MCP on its
stdin/stdout), in front of a real proxy whose `/mcp` gateway fronts the real memory and time
servers. Calls through it are recorded, gated and undone as through `/mcp`.
"""

from __future__ import annotations

import subprocess
import sys
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
from mcp import Client, StdioServerParameters
from mcp_types import CallToolResult, TextContent

from tests.mcp.conftest import Gateway
from tests.support.servers import free_port

pytestmark = pytest.mark.slow


def _entity(name: str) -> dict[str, Any]:
    return {"name": name, "entityType": "person", "observations": ["met through stdio"]}


def _text(result: CallToolResult) -> str:
    return "".join(c.text for c in result.content if isinstance(c, TextContent))


@asynccontextmanager
async def bridged(
    gateway: Gateway, *args: str, api_key: str | None = None
) -> AsyncIterator[Client]:
    """The official client, with `undolog mcp-stdio` as its stdio server."""
    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "undolog", "mcp-stdio", "--url", gateway.url, *args],
        env={"UNDOLOG_API_KEY": api_key or gateway.api_key},
    )
    async with Client(params, read_timeout_seconds=60) as client:
        yield client


async def test_a_stdio_client_lists_calls_and_rolls_back_through_the_gateway(
    gateway: Gateway,
) -> None:
    session = str(uuid.uuid4())
    async with bridged(gateway, "--session-id", session) as client:
        tools = {t.name for t in (await client.list_tools()).tools}
        assert {"memory.create_entities", "time.get_current_time"} <= tools
        created = await client.call_tool("memory.create_entities", {"entities": [_entity("ada")]})
        assert not created.is_error, _text(created)
        assert created.meta is not None and created.meta["undolog"]["status"] == "executed"
        waiting = await client.call_tool("memory.delete_entities", {"entityNames": ["ada"]})
    assert waiting.is_error and waiting.meta is not None
    assert waiting.meta["undolog"]["status"] == "pending_approval"  # gated, not run
    assert gateway.entities() == ["ada"]

    with gateway.rest() as rest:
        view = rest.get(f"/sessions/{session}").json()
        assert [e["tool_name"] for e in view["effects"]] == [
            "memory.create_entities", "memory.delete_entities",
        ]  # fmt: skip
        rolled = rest.post(f"/sessions/{session}/rollback", json={})
    assert rolled.status_code == 200, rolled.text
    assert rolled.json()["outcome"] == "compensated"
    assert gateway.entities() == []  # undone on the upstream


async def test_each_start_of_the_bridge_is_a_new_session(gateway: Gateway) -> None:
    for name in ("first", "second"):
        async with bridged(gateway) as client:
            made = await client.call_tool("memory.create_entities", {"entities": [_entity(name)]})
            assert not made.is_error, _text(made)
    with gateway.rest() as rest:
        sessions = rest.get("/sessions").json()
    assert len(sessions) == 2
    assert len({s["session_id"] for s in sessions}) == 2


def run_bridge(*args: str, key: str | None = "ul_nobody") -> subprocess.CompletedProcess[str]:
    env = {"PATH": "/usr/bin:/bin"}
    if key is not None:
        env["UNDOLOG_API_KEY"] = key
    return subprocess.run(
        [sys.executable, "-m", "undolog", "mcp-stdio", *args],
        env=env, input="", capture_output=True, text=True, timeout=60,
    )  # fmt: skip


def test_a_bridge_that_cannot_reach_the_gateway_says_so_in_one_line() -> None:
    done = run_bridge("--url", f"http://127.0.0.1:{free_port()}")
    assert done.returncode == 2
    assert done.stdout == ""  # stdout is the protocol's
    [line] = done.stderr.strip().splitlines()
    assert line.startswith("error: cannot serve the UndoLog gateway at http://127.0.0.1:")


def test_a_bridge_with_a_wrong_key_or_none_or_a_bad_session_is_refused(gateway: Gateway) -> None:
    wrong = run_bridge("--url", gateway.url, key="ul_not_a_key")
    assert wrong.returncode == 2 and wrong.stdout == ""
    assert len(wrong.stderr.strip().splitlines()) == 1
    assert "ul_not_a_key" not in wrong.stderr  # a key is never echoed
    missing = run_bridge("--url", gateway.url, key=None)
    assert missing.returncode == 2
    assert missing.stderr.strip() == "error: an API key is needed (--api-key or UNDOLOG_API_KEY)"
    bad = run_bridge("--url", gateway.url, "--session-id", "nope")
    assert (bad.returncode, bad.stderr.strip()) == (2, "error: --session-id 'nope' is not a UUID")
