"""An upstream that cannot be reached leaves the proxy serving the others, and is tried again.

Each proxy has one good upstream (`mcp-server-time` over stdio) and one that is down: a command
that does not exist, one that exits at once, or a Streamable HTTP url where nothing listens
until the test starts a server there.
"""

from __future__ import annotations

import contextlib
import secrets
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from mcp.server.mcpserver import MCPServer
from mcp_types import CallToolResult, TextContent, ToolAnnotations

from tests.mcp.conftest import Gateway
from tests.proxy.conftest import role_keys
from tests.support.servers import ThreadServer, await_until, free_port
from undolog.config import OrgConfig, Settings
from undolog.mcp import upstreams
from undolog.mcp.config import parse_mcp_settings

pytestmark = pytest.mark.slow

SECRET = "Bearer do-not-log-" + secrets.token_hex(8)
TIME = {
    "name": "time",
    "transport": "stdio",
    "command": sys.executable,
    "args": ["-m", "mcp_server_time", "--local-timezone", "UTC"],
}


@contextlib.contextmanager
def _proxy(tmp_path: Path, *upstream: dict[str, Any]) -> Iterator[Gateway]:
    from undolog.proxy import create_app

    org_id, key = f"org-{secrets.token_hex(6)}", "ul_test_" + secrets.token_urlsafe(18)
    settings = Settings(
        database_url=f"sqlite:///{tmp_path / 'undolog.db'}",
        upstream_timeout_seconds=20.0,
        log_level="warning",
        orgs=(OrgConfig(org_id=org_id, keys=role_keys(key)),),
        mcp=parse_mcp_settings({"upstreams": [TIME, *upstream]}),
    )
    server = ThreadServer(create_app(settings)).start()
    try:
        yield Gateway(server.url, key, org_id, tmp_path / "unused", server)
    finally:
        server.stop()


def _text(result: CallToolResult) -> str:
    return "\n".join(c.text for c in result.content if isinstance(c, TextContent))


def _spawn_counter(tmp_path: Path) -> tuple[dict[str, Any], Path]:
    """A stdio upstream that notes each start in a file, then exits before it answers."""
    spawns = tmp_path / "spawns"
    note = "import sys; open(sys.argv[1], 'a').write('spawned\\n')"
    return {"name": "broken", "command": sys.executable, "args": ["-c", note, str(spawns)]}, spawns


def _counter_app() -> Any:
    server = MCPServer("counter")

    @server.tool(annotations=ToolAnnotations(read_only_hint=True))
    def peek() -> int:
        """Always 7."""
        return 7

    app = server.streamable_http_app(stateless_http=True, json_response=True)

    async def require_token(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and dict(scope["headers"]).get(b"authorization") != (
            SECRET.encode()
        ):
            await send({"type": "http.response.start", "status": 401, "headers": []})
            await send({"type": "http.response.body", "body": b""})
            return
        await app(scope, receive, send)

    return require_token


@pytest.mark.parametrize("kind", ["missing_command", "exits_at_once"])
async def test_the_proxy_serves_the_other_upstreams_when_one_cannot_be_started(
    tmp_path: Path, kind: str
) -> None:
    broken = (
        {"name": "broken", "command": str(tmp_path / "no-such-server")}
        if kind == "missing_command"
        else _spawn_counter(tmp_path)[0]
    )
    session_id = str(uuid.uuid4())
    with _proxy(tmp_path, broken) as gateway:
        with gateway.rest() as rest:
            assert rest.get("/health").status_code == 200
        async with gateway.client(session_id) as client:
            names = {t.name for t in (await client.list_tools()).tools}
            read = await client.call_tool("time.get_current_time", {"timezone": "UTC"})
            down = await client.call_tool("broken.anything", {"x": 1})
        async with gateway.client() as client:
            down_without_session = await client.call_tool("broken.anything", {})
        with gateway.rest() as rest:
            session = rest.get(f"/sessions/{session_id}")

    assert "time.get_current_time" in names
    assert all(name.startswith("time.") for name in names)
    assert not read.is_error, _text(read)
    for result in (down, down_without_session):
        assert result.is_error
        assert result.meta["undolog"]["error"]["code"] == "tool_error"  # type: ignore[index]
        assert "'broken'" in _text(result)
    # The tool's tier is unknown while its upstream is down: nothing was recorded.
    assert session.status_code == 404


async def test_a_down_upstream_is_not_respawned_on_every_request(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(upstreams, "RETRY_SECONDS", 3600.0)
    broken, spawns = _spawn_counter(tmp_path)
    with _proxy(tmp_path, broken) as gateway:
        async with gateway.client(str(uuid.uuid4())) as client:
            for _ in range(3):
                await client.list_tools()
                assert (await client.call_tool("broken.anything", {})).is_error
    assert spawns.read_text().splitlines() == ["spawned"]  # at start, and not since


async def test_an_http_upstream_that_starts_listening_later_is_listed_and_called(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(upstreams, "RETRY_SECONDS", 0.05)
    port = free_port()
    counter = {
        "name": "counter",
        "url": f"http://127.0.0.1:{port}/mcp",
        "headers": {"Authorization": SECRET},
    }
    with _proxy(tmp_path, counter) as gateway:
        async with gateway.client() as client:
            before = {t.name for t in (await client.list_tools()).tools}
            down = await client.call_tool("counter.peek", {})
        assert "counter.peek" not in before and "time.get_current_time" in before
        assert down.is_error
        assert "'counter'" in _text(down)
        assert SECRET not in _text(down)

        upstream = ThreadServer(_counter_app(), port=port).start()
        try:
            async with gateway.client() as client:

                async def listed() -> bool:
                    tools = (await client.list_tools()).tools
                    return "counter.peek" in {t.name for t in tools}

                await await_until(listed, what="the counter upstream's tools")
                read = await client.call_tool("counter.peek", {})
        finally:
            upstream.stop()
    assert not read.is_error, _text(read)
    assert "7" in _text(read)
