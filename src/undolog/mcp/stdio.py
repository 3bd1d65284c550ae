"""`undolog mcp-stdio`: the MCP gateway for clients that only speak stdio.

A desktop client starts this as its MCP server (a command, not a URL). It speaks MCP over
stdin/stdout to the client and forwards every request to a running proxy's `/mcp` over
Streamable HTTP, with the API key and the UndoLog session id as headers, so each call is
recorded, undoable and gated exactly as through `/mcp` itself. It keeps no state: each process
start is a new UndoLog session unless one is given (`--session-id`), so restarting the client
starts a new undoable unit.

Only protocol traffic goes to stdout; diagnostics go to stderr.
"""

from __future__ import annotations

import contextlib
import uuid
from typing import Any

import httpx2
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel import Server
from mcp.server.stdio import stdio_server
from mcp_types import (
    CallToolRequestParams,
    CallToolResult,
    GetPromptRequestParams,
    GetPromptResult,
    ListPromptsResult,
    ListResourcesResult,
    ListResourceTemplatesResult,
    ListToolsResult,
    PaginatedRequestParams,
    ReadResourceRequestParams,
    ReadResourceResult,
)

import undolog

__all__ = ["StdioBridge", "new_session_id", "run_bridge"]

SESSION_HEADER = "X-UndoLog-Session-Id"


def new_session_id() -> str:
    return str(uuid.uuid4())


def _cursor(params: PaginatedRequestParams | None) -> str | None:
    return params.cursor if params is not None else None


class StdioBridge:
    """An MCP server on stdio whose every request is answered by the gateway at `url`."""

    def __init__(
        self, url: str, api_key: str, session_id: str, *, timeout_seconds: float = 120.0
    ) -> None:
        self.endpoint = url.rstrip("/") + "/mcp"
        self.headers = {"X-Api-Key": api_key, SESSION_HEADER: session_id}
        self.timeout_seconds = timeout_seconds
        self._client: Client | None = None

    @property
    def client(self) -> Client:
        if self._client is None:  # pragma: no cover - handlers run only inside `serve`
            raise RuntimeError("the bridge is not connected")
        return self._client

    @contextlib.asynccontextmanager
    async def connected(self) -> Any:
        """Connect to the gateway (raises if it cannot be reached or refuses the key)."""
        async with contextlib.AsyncExitStack() as stack:
            http = await stack.enter_async_context(
                httpx2.AsyncClient(headers=self.headers, timeout=self.timeout_seconds)
            )
            transport = streamable_http_client(self.endpoint, http_client=http)
            self._client = await stack.enter_async_context(
                Client(transport, read_timeout_seconds=self.timeout_seconds)
            )
            try:
                yield self
            finally:
                self._client = None

    def server(self) -> Server[Any]:
        """The stdio-side server: tools always; resources and prompts when the gateway has
        them (what it advertised when the bridge connected)."""
        server: Server[Any] = Server(
            "undolog",
            version=undolog.__version__,
            instructions=(
                "Tools behind UndoLog: calls are recorded exactly once, can be undone, and "
                "irreversible ones wait for a person's approval."
            ),
            on_list_tools=self._list_tools,
            on_call_tool=self._call_tool,
        )
        capabilities = self.client.server_capabilities
        add = server.add_request_handler
        if capabilities is not None and capabilities.resources is not None:
            add("resources/list", PaginatedRequestParams, self._list_resources)
            add("resources/templates/list", PaginatedRequestParams, self._list_templates)
            add("resources/read", ReadResourceRequestParams, self._read_resource)
        if capabilities is not None and capabilities.prompts is not None:
            add("prompts/list", PaginatedRequestParams, self._list_prompts)
            add("prompts/get", GetPromptRequestParams, self._get_prompt)
        return server

    async def serve_stdio(self) -> None:
        """Serve the client on this process's stdin/stdout until it closes them."""
        server = self.server()
        async with stdio_server() as (read_stream, write_stream):
            await server.run(read_stream, write_stream, server.create_initialization_options())

    # -- handlers: each forwards one request; the gateway's MCP errors pass through ------------

    async def _list_tools(
        self, ctx: ServerRequestContext[Any], params: PaginatedRequestParams | None
    ) -> ListToolsResult:
        return await self.client.list_tools(cursor=_cursor(params), cache_mode="bypass")

    async def _call_tool(
        self, ctx: ServerRequestContext[Any], params: CallToolRequestParams
    ) -> CallToolResult:
        # The client's `_meta` (a session id in `undolog/session_id`, say) goes along.
        return await self.client.call_tool(params.name, params.arguments or {}, meta=params.meta)

    async def _list_resources(
        self, ctx: ServerRequestContext[Any], params: PaginatedRequestParams | None
    ) -> ListResourcesResult:
        return await self.client.list_resources(cursor=_cursor(params), cache_mode="bypass")

    async def _list_templates(
        self, ctx: ServerRequestContext[Any], params: PaginatedRequestParams | None
    ) -> ListResourceTemplatesResult:
        return await self.client.list_resource_templates(
            cursor=_cursor(params), cache_mode="bypass"
        )

    async def _read_resource(
        self, ctx: ServerRequestContext[Any], params: ReadResourceRequestParams
    ) -> ReadResourceResult:
        return await self.client.read_resource(str(params.uri), cache_mode="bypass")

    async def _list_prompts(
        self, ctx: ServerRequestContext[Any], params: PaginatedRequestParams | None
    ) -> ListPromptsResult:
        return await self.client.list_prompts(cursor=_cursor(params), cache_mode="bypass")

    async def _get_prompt(
        self, ctx: ServerRequestContext[Any], params: GetPromptRequestParams
    ) -> GetPromptResult:
        return await self.client.get_prompt(params.name, params.arguments)


async def run_bridge(url: str, api_key: str, session_id: str) -> None:
    """Connect to the gateway, then serve stdio until the client goes away."""
    bridge = StdioBridge(url, api_key, session_id)
    async with bridge.connected():
        await bridge.serve_stdio()
