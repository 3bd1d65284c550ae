"""Resources and prompts pass through the gateway read-only, and nothing is recorded.

The upstreams, in config order: `notes`, an `mcp` package server over Streamable HTTP with a
static resource, a resource template and a prompt; `plain`, a lowlevel server over Streamable
HTTP that serves tools and static resources only (no templates: it answers method-not-found;
no prompts capability), one of its URIs also listed by `notes`; and `mcp-server-time` over
stdio, which declares resources and prompts but has none.
"""

from __future__ import annotations

import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from mcp import Client, MCPError
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel import Server
from mcp.server.mcpserver import MCPServer
from mcp_types import (
    INTERNAL_ERROR,
    INVALID_PARAMS,
    METHOD_NOT_FOUND,
    SERVER_INFO_META_KEY,
    CallToolRequestParams,
    CallToolResult,
    DiscoverResult,
    ListResourcesResult,
    ListToolsResult,
    PaginatedRequestParams,
    ReadResourceRequestParams,
    ReadResourceResult,
    Resource,
    ServerCapabilities,
    TextContent,
    TextResourceContents,
    Tool,
)

from tests.mcp.conftest import Gateway, serve_gateway
from tests.support.servers import ThreadServer

pytestmark = pytest.mark.slow

NOTES = {"ideas": "a gateway for prompts", "todo": "buy milk"}
TIME = {
    "name": "time",
    "transport": "stdio",
    "command": sys.executable,
    "args": ["-m", "mcp_server_time", "--local-timezone", "UTC"],
}


def _notes_app() -> Any:
    server = MCPServer("notes")

    @server.resource("notes://index", name="index", description="The notes' names.")
    def index() -> str:
        return "\n".join(sorted(NOTES))

    @server.resource("notes://{name}", name="note", description="One note.")
    def note(name: str) -> str:
        return NOTES[name]  # an unknown name fails: the upstream's own error

    @server.prompt(description="Summarize one note.")
    def summarize(name: str, style: str = "short") -> str:
        return f"Summarize the note '{name}' in a {style} style."

    return server.streamable_http_app(stateless_http=True, json_response=True)


PLAIN_RESOURCES = [
    Resource(name="readme", uri="plain://readme"),
    Resource(name="shadowed", uri="notes://index", description="plain's copy"),
]


def _plain_app() -> Any:
    """Tools and static resources, on the lowlevel server: no templates, no prompts."""

    async def list_tools(
        ctx: ServerRequestContext[Any], params: PaginatedRequestParams | None
    ) -> ListToolsResult:
        return ListToolsResult(tools=[Tool(name="noop", input_schema={"type": "object"})])

    async def call_tool(
        ctx: ServerRequestContext[Any], params: CallToolRequestParams
    ) -> CallToolResult:
        return CallToolResult(content=[TextContent(type="text", text="ok")])

    async def list_resources(
        ctx: ServerRequestContext[Any], params: PaginatedRequestParams | None
    ) -> ListResourcesResult:
        return ListResourcesResult(resources=PLAIN_RESOURCES)

    async def read_resource(
        ctx: ServerRequestContext[Any], params: ReadResourceRequestParams
    ) -> ReadResourceResult:
        if params.uri not in {r.uri for r in PLAIN_RESOURCES}:
            raise MCPError(INVALID_PARAMS, f"plain has no {params.uri}")
        text = f"plain's {params.uri}"
        return ReadResourceResult(contents=[TextResourceContents(uri=params.uri, text=text)])

    server: Server[Any] = Server(
        "plain",
        on_list_tools=list_tools,
        on_call_tool=call_tool,
        on_list_resources=list_resources,
        on_read_resource=read_resource,
    )
    return server.streamable_http_app(stateless_http=True, json_response=True)


@pytest.fixture
def notes() -> Iterator[ThreadServer]:
    server = ThreadServer(_notes_app()).start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def plain() -> Iterator[ThreadServer]:
    server = ThreadServer(_plain_app()).start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def rp_gateway(tmp_path: Path, notes: ThreadServer, plain: ThreadServer) -> Iterator[Gateway]:
    mcp = {
        "upstreams": [
            {"name": "notes", "url": f"{notes.url}/mcp"},
            {"name": "plain", "url": f"{plain.url}/mcp"},
            TIME,
        ]
    }
    with serve_gateway(mcp, f"sqlite:///{tmp_path / 'undolog.db'}", tmp_path) as gateway:
        yield gateway


async def _capabilities(client: Client, era: str) -> ServerCapabilities:
    """What the gateway advertises: at `initialize`, or (2026-07-28) at `server/discover`."""
    if era == "legacy":
        return client.server_capabilities
    # A pinned-version client synthesizes its discover result: ask the gateway.
    raw = await client.session.send_discover(client.protocol_version)
    return DiscoverResult.model_validate(raw).capabilities


def _text(result: ReadResourceResult) -> str:
    return "\n".join(c.text for c in result.contents if isinstance(c, TextResourceContents))


async def test_prompts_are_listed_under_the_upstream_prefix_with_their_arguments(
    rp_gateway: Gateway, era: str
) -> None:
    async with rp_gateway.client(era=era) as client:
        capabilities = await _capabilities(client, era)
        prompts = (await client.list_prompts()).prompts
    assert capabilities.prompts is not None
    assert [p.name for p in prompts] == ["notes.summarize"]  # plain and time have none
    (prompt,) = prompts
    assert prompt.description == "Summarize one note."
    arguments = {a.name: a.required for a in prompt.arguments or []}
    assert arguments == {"name": True, "style": False}


async def test_resources_and_templates_of_every_upstream_are_listed_with_their_uris(
    rp_gateway: Gateway, era: str
) -> None:
    async with rp_gateway.client(era=era) as client:
        capabilities = await _capabilities(client, era)
        resources = (await client.list_resources()).resources
        templates = (await client.list_resource_templates()).resource_templates
    assert capabilities.resources is not None
    assert not capabilities.resources.subscribe  # subscriptions are not served
    # notes://index is listed by notes and plain: notes comes first in the config, and wins.
    assert sorted(r.uri for r in resources) == ["notes://index", "plain://readme"]
    index = next(r for r in resources if r.uri == "notes://index")
    assert index.description == "The notes' names."
    assert [(t.uri_template, t.name) for t in templates] == [("notes://{name}", "note")]


async def test_a_prompt_is_got_from_its_upstream_with_its_arguments(
    rp_gateway: Gateway, era: str
) -> None:
    async with rp_gateway.client(era=era) as client:
        result = await client.get_prompt("notes.summarize", {"name": "todo", "style": "long"})
    (message,) = result.messages
    assert message.role == "user"
    assert isinstance(message.content, TextContent)
    assert message.content.text == "Summarize the note 'todo' in a long style."
    stamp = (result.meta or {}).get(SERVER_INFO_META_KEY)
    assert stamp is None or stamp["name"] == "undolog"  # notes' own stamp is not passed on


async def test_static_and_templated_resources_are_read_from_the_upstream_that_has_them(
    rp_gateway: Gateway, era: str
) -> None:
    # Read before any listing: the gateway lists the upstreams to find where a URI lives.
    async with rp_gateway.client(era=era) as client:
        index = await client.read_resource("notes://index")
        todo = await client.read_resource("notes://todo")
        readme = await client.read_resource("plain://readme")
    assert _text(index) == "ideas\ntodo"  # notes' copy: the first upstream to list the URI
    assert _text(todo) == "buy milk"  # through notes' template
    assert _text(readme) == "plain's plain://readme"
    assert [c.uri for c in todo.contents] == ["notes://todo"]


async def test_unknown_prompts_and_resources_are_invalid_params(
    rp_gateway: Gateway, era: str
) -> None:
    async with rp_gateway.client(era=era) as client:
        for name in ("notes.nope", "nobody.summarize", "summarize"):
            with pytest.raises(MCPError) as caught:
                await client.get_prompt(name, {"name": "todo"})
            assert caught.value.code == INVALID_PARAMS, name
        with pytest.raises(MCPError) as unknown:
            await client.read_resource("nowhere://at-all")
        # Matched by notes' template, refused by notes: its error passes through.
        with pytest.raises(MCPError) as refused:
            await client.read_resource("notes://missing")
    assert unknown.value.code == INVALID_PARAMS
    assert unknown.value.data == {"uri": "nowhere://at-all"}
    assert refused.value.code == INTERNAL_ERROR
    assert refused.value.data == {"uri": "notes://missing"}  # notes' error data, not ours


async def test_upstreams_without_templates_or_prompts_are_skipped_and_not_advertised(
    tmp_path: Path, plain: ThreadServer, era: str
) -> None:
    mcp = {"upstreams": [{"name": "plain", "url": f"{plain.url}/mcp"}]}
    with serve_gateway(mcp, f"sqlite:///{tmp_path / 'undolog.db'}", tmp_path) as gateway:
        async with gateway.client(era=era) as client:
            capabilities = await _capabilities(client, era)
            resources = (await client.list_resources()).resources
            templates = (await client.list_resource_templates()).resource_templates
            with pytest.raises(MCPError) as prompts:
                await client.list_prompts()
    assert capabilities.resources is not None and capabilities.prompts is None
    assert sorted(r.uri for r in resources) == ["notes://index", "plain://readme"]
    assert templates == []  # plain answers method-not-found: skipped silently
    assert prompts.value.code == METHOD_NOT_FOUND


async def test_an_upstream_that_is_down_has_its_items_absent_and_reading_them_names_it(
    rp_gateway: Gateway, notes: ThreadServer, era: str
) -> None:
    async with rp_gateway.client(era=era) as client:
        assert len((await client.list_prompts()).prompts) == 1
        assert len((await client.list_resources()).resources) == 2
        assert len((await client.list_resource_templates()).resource_templates) == 1
        notes.stop()
        prompts = (await client.list_prompts(cache_mode="bypass")).prompts
        resources = (await client.list_resources(cache_mode="bypass")).resources
        templates = await client.list_resource_templates(cache_mode="bypass")
        failures = []
        for read in ("notes://index", "notes://todo"):
            with pytest.raises(MCPError) as caught:
                await client.read_resource(read, cache_mode="bypass")
            failures.append(caught.value)
        with pytest.raises(MCPError) as prompt:
            await client.get_prompt("notes.summarize", {"name": "todo"})
        failures.append(prompt.value)
        readme = await client.read_resource("plain://readme")
    assert prompts == []
    # notes://index is still notes' (plain's copy stays shadowed): absent while notes is down.
    assert [r.uri for r in resources] == ["plain://readme"]
    assert templates.resource_templates == []
    for failure in failures:
        assert failure.code == INTERNAL_ERROR
        assert failure.data == {"upstream": "notes"}
        assert "'notes' is unavailable" in failure.message
    assert _text(readme) == "plain's plain://readme"


async def test_prompts_and_resources_are_not_recorded(rp_gateway: Gateway, era: str) -> None:
    session_id = str(uuid.uuid4())
    async with rp_gateway.client(session_id, era=era) as client:
        await client.list_prompts()
        await client.get_prompt("notes.summarize", {"name": "ideas"})
        await client.list_resources()
        await client.list_resource_templates()
        await client.read_resource("notes://index")
        await client.read_resource("notes://ideas")
    with rp_gateway.rest() as rest:
        assert rest.get(f"/sessions/{session_id}").status_code == 404
