"""Tools of the HTTP tool server published at `/mcp` (`McpSettings.tool_server_tools`).

The gateway's upstreams are MCP servers; the demo's tool server speaks UndoLog's HTTP tool
protocol (`POST /tools/{name}`). So that an MCP client sees the demo tools out of the box,
`serve --demo` names them here, and the gateway lists them unprefixed with the tier the org's
registry gives them (the tier a call gets, whatever the listing says). A call goes through
`run_call` as one through `POST /mcp/tool_call` does, and the executor POSTs it to the tool
server; a SAFE one without a session is passed through unrecorded, as an upstream's SAFE tool.
"""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING, Any

from mcp_types import CallToolResult, TextContent, Tool, ToolAnnotations

from undolog.mcp.config import ToolServerTool
from undolog_sdk.errors import ToolNotRegistered
from undolog_sdk.tier import ToolTier

if TYPE_CHECKING:
    from undolog.runtime import Runtime

__all__ = ["ToolServerTools"]

_NOTES = {
    ToolTier.SAFE.value: "UndoLog tier: safe (runs freely).",
    ToolTier.COMPENSABLE.value: "UndoLog tier: compensable (recorded; a rollback undoes it).",
    ToolTier.IRREVERSIBLE.value: "UndoLog tier: irreversible (waits for a person's approval).",
}


class ToolServerTools:
    """The tool server's tools each org may see at `/mcp`."""

    def __init__(self, tools: tuple[ToolServerTool, ...]) -> None:
        self._by_org: dict[str, dict[str, ToolServerTool]] = {}
        for tool in tools:
            for org_id in tool.orgs:
                self._by_org.setdefault(org_id, {})[tool.name] = tool

    def get(self, org_id: str, name: str) -> ToolServerTool | None:
        return self._by_org.get(org_id, {}).get(name)

    async def tier(self, runtime: Runtime, org_id: str, name: str) -> str | None:
        """The org's registered tier of the tool (None: not registered, so not offered)."""
        try:
            return (await runtime.engine.get_tool(org_id, name)).tier
        except ToolNotRegistered:
            return None

    async def listed(self, runtime: Runtime, org_id: str) -> list[Tool]:
        """The org's published tools that its registry knows, as MCP `Tool`s."""
        found = []
        for tool in self._by_org.get(org_id, {}).values():
            tier = await self.tier(runtime, org_id, tool.name)
            if tier is None:
                continue
            annotations = ToolAnnotations(
                read_only_hint=tier == ToolTier.SAFE.value,
                destructive_hint=tier == ToolTier.IRREVERSIBLE.value,
            )
            found.append(
                Tool(
                    name=tool.name,
                    description=f"{tool.description} {_NOTES.get(tier, '')}".strip(),
                    input_schema=dict(tool.input_schema),
                    annotations=annotations,
                )
            )
        return found

    @staticmethod
    async def pass_through(
        runtime: Runtime, org_id: str, name: str, args: Any, request_id: str
    ) -> CallToolResult:
        """A SAFE call without a session: straight to the tool server, nothing recorded.

        Raises:
            ToolTransportError: the tool server was not reached or gave no ToolResult.
        """
        result = await runtime.executor.call(
            name, args, org_id=org_id, session_id=None,
            effect_id=str(uuid.uuid4()), request_id=request_id,
        )  # fmt: skip
        return CallToolResult(
            content=[TextContent(type="text", text=result.to_json())], is_error=not result.success
        )
