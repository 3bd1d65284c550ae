"""MCP out of the box (issue 24): the demo tools at `/mcp` as `serve --demo` publishes them,
seen by the `mcp` package's real client, and authentication failures a client can show.

The proxy is the one `serve --demo` builds (the demo tool server upstream, the demo tools
registered, `with_demo_mcp_tools` for the org), in a thread on a loopback port.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import uuid
from collections.abc import AsyncIterator
from typing import Any

import httpx
import httpx2
import pytest
from mcp import Client, MCPError
from mcp.client.streamable_http import streamable_http_client

from tests.mcp.conftest import text_of
from tests.proxy.conftest import ProxyHarness, demo_upstream, new_key, proxy_factory
from tests.support.servers import undolog_command
from undolog.demo.catalog import DEMO_MCP_TOOLS, with_demo_mcp_tools
from undolog.mcp.config import McpSettings
from undolog.proxy.edge import MCP_AUTH_ERROR

__all__ = ["demo_upstream", "proxy_factory"]  # fixtures, re-exported

MCP_HEADERS = {
    "Accept": "application/json, text/event-stream",
    "MCP-Protocol-Version": "2025-11-25",
}
LIST = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}


@pytest.fixture
def store_url(tmp_path: Any) -> str:
    return f"sqlite:///{tmp_path / 'undolog.db'}"


@pytest.fixture
def demo(proxy_factory: Any) -> ProxyHarness:
    """A proxy whose org has the demo tools at /mcp, answering a pending call at once."""
    org_id = f"org-{uuid.uuid4().hex[:12]}"
    mcp = with_demo_mcp_tools(McpSettings(approval_wait_seconds=0), org_id)
    harness: ProxyHarness = proxy_factory(org_id=org_id, mcp=mcp)
    return harness


@contextlib.asynccontextmanager
async def mcp_client(url: str, api_key: str, session_id: str | None) -> AsyncIterator[Client]:
    headers = {"X-Api-Key": api_key}
    if session_id is not None:
        headers["X-UndoLog-Session-Id"] = session_id
    async with (
        httpx2.AsyncClient(headers=headers, timeout=30) as http,
        Client(streamable_http_client(f"{url}/mcp", http_client=http)) as client,
    ):
        yield client


async def test_a_client_lists_the_demo_tools_and_calls_them_with_their_tiers(
    demo: ProxyHarness,
) -> None:
    session = str(uuid.uuid4())
    async with mcp_client(demo.url, demo.agent_key, session) as client:
        listed = {t.name: t for t in (await client.list_tools()).tools}
        assert set(DEMO_MCP_TOOLS) <= set(listed)
        assert listed["search_web"].annotations.read_only_hint is True
        assert "irreversible" in (listed["delete_database"].description or "")

        found = await client.call_tool("search_web", {"query": "undo"})
        assert not found.is_error and "Result 1 for undo" in text_of(found)
        sent = await client.call_tool("send_email", {"to": "ada@example.com", "subject": "hi"})
        assert not sent.is_error, text_of(sent)
        waiting = await client.call_tool("delete_database", {"db_name": "prod"})
        assert waiting.is_error and "approv" in text_of(waiting).lower()
    assert demo.counters("send_email") != {} and demo.counters("delete_database") == {}

    # A person approves; the client's retry gets the approved run's result. The undo stack
    # holds the e-mail, which a rollback undoes.
    with demo.client(demo.approver_key) as person:
        (pending,) = person.get("/approvals", params={"state": "pending"}).json()
        assert person.post(f"/approvals/{pending['id']}/approve").status_code == 200
    async with mcp_client(demo.url, demo.agent_key, session) as client:
        dropped = await client.call_tool("delete_database", {"db_name": "prod"})
        assert not dropped.is_error and "deleted" in text_of(dropped)
    with demo.client(demo.approver_key) as person:
        rolled = person.post(f"/sessions/{session}/rollback")
        assert rolled.json()["outcome"] == "compensated", rolled.text
    assert demo.counters("undo_send_email") != {}


@pytest.mark.security
@pytest.mark.parametrize(
    ("headers", "status", "says"),
    [
        ({}, 401, "missing"),
        ({"X-Api-Key": "ul_wrong_" + "x" * 20}, 401, "invalid or revoked"),
        ({"Authorization": "Bearer ul_wrong_" + "x" * 20}, 401, "invalid or revoked"),
    ],
)
def test_a_wrong_key_gets_401_www_authenticate_and_a_json_rpc_error_naming_it(
    demo: ProxyHarness, headers: dict[str, str], status: int, says: str
) -> None:
    with httpx.Client(base_url=demo.url, timeout=30) as c:
        answer = c.post("/mcp", json=LIST, headers={**MCP_HEADERS, **headers})
    assert answer.status_code == status
    assert answer.headers["www-authenticate"].startswith('Bearer realm="undolog"')
    error = answer.json()["error"]
    assert answer.json()["jsonrpc"] == "2.0" and error["code"] == MCP_AUTH_ERROR
    assert says in error["message"] and "API key" in error["message"]


@pytest.mark.security
async def test_the_mcp_client_shows_what_is_wrong_with_the_key(demo: ProxyHarness) -> None:
    with pytest.raises(BaseException) as caught:  # raised out of the client's task group
        async with mcp_client(demo.url, "ul_wrong_" + "x" * 20, None) as client:
            await client.list_tools()
    error = caught.value
    while isinstance(error, BaseExceptionGroup):
        error = error.exceptions[0]
    assert isinstance(error, MCPError), repr(error)
    assert "invalid or revoked" in error.error.message


@pytest.mark.security
def test_a_role_that_may_not_call_tools_is_named_and_a_bearer_key_works(
    demo: ProxyHarness,
) -> None:
    with httpx.Client(base_url=demo.url, timeout=30) as c:
        approver = {"X-Api-Key": demo.approver_key}
        refused = c.post("/mcp", json=LIST, headers={**MCP_HEADERS, **approver})
    assert refused.status_code == 403
    assert "approver key may not use POST /mcp" in refused.json()["error"]["message"]
    # The bearer form of a good key works.
    with httpx.Client(base_url=demo.url, timeout=30) as c:
        bearer = {"Authorization": f"Bearer {demo.agent_key}"}
        assert c.post("/mcp", json=LIST, headers={**MCP_HEADERS, **bearer}).status_code == 200


@pytest.mark.security
def test_mcp_stdio_with_a_wrong_key_says_so_and_exits_non_zero(demo: ProxyHarness) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("UNDOLOG_")}
    env.update(UNDOLOG_PROXY_URL=demo.url, UNDOLOG_API_KEY=new_key())
    done = subprocess.run(
        undolog_command("mcp-stdio"),
        env=env,
        input="",
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode != 0
    assert done.stderr.startswith(
        f"error: cannot serve the UndoLog gateway at {demo.url}: the API key is invalid or revoked"
    ), done.stderr
    assert "Traceback" not in done.stderr
