"""The MCP gateway: UndoLog at `/mcp` in front of upstream MCP servers (see `gateway`).

Only the config is re-exported here: `undolog.config` imports it, and the gateway itself
imports the proxy.
"""

from undolog.mcp.config import McpSettings, McpUpstream, parse_mcp_settings

__all__ = ["McpSettings", "McpUpstream", "parse_mcp_settings"]
