"""The `[mcp]` table of the config file: upstream MCP servers and the policy for their tools.

```toml
[mcp]
allowed_origins = ["https://agent.example.com"]   # browsers' Origin values /mcp accepts
approval_url = "https://undolog.example.com/ui/#/approvals/pending"   # optional

[[mcp.upstreams]]
name = "memory"                  # the tools' prefix: memory.create_entities
transport = "stdio"              # or "http" (Streamable HTTP), with url and headers
command = "npx"
args = ["-y", "@modelcontextprotocol/server-memory"]
env = { MEMORY_FILE_PATH = "/var/lib/agent/memory.jsonl" }

[mcp.upstreams.tools.create_entities]
tier = "compensable"
compensation.tool = "delete_entities"
compensation.args = { entityNames = "$.original_args.entities[*].name" }
```

A tool's tier is the config's when it names one. Otherwise it follows the tool's annotations
(`readOnlyHint` → safe, anything else → irreversible): annotations come from the upstream,
which may not be trusted, so they can only ever make a tool *stricter* than safe by default,
and the config always wins. Parsing is pure: it raises `ValueError` naming the bad key.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from undolog_sdk.tier import TIER_VALUES, ToolTier, check_compensation_integer

__all__ = [
    "McpCompensation",
    "McpSettings",
    "McpToolPolicy",
    "McpUpstream",
    "parse_mcp_settings",
    "tier_for",
]

TRANSPORTS = ("stdio", "http")
PREFIX_SEPARATOR = "."

DEFAULT_APPROVAL_WAIT_SECONDS = 50
_MCP_KEYS = frozenset({"allowed_origins", "approval_url", "approval_wait_seconds", "upstreams"})
_UPSTREAM_KEYS = frozenset(
    {"name", "transport", "command", "args", "env", "cwd", "url", "headers", "tools"}
)
_TOOL_KEYS = frozenset({"tier", "compensation"})
_COMPENSATION_KEYS = frozenset({"tool", "args", "max_retries", "retry_backoff_ms"})


@dataclass(frozen=True)
class McpCompensation:
    """Undo a call with another tool of the same upstream.

    `args` maps the compensation's arguments: a string starting with `$` is a path into
    `{"original_args", "original_result"}` (`$.original_args.entities[*].name`), anything
    else is taken literally. See `undolog.mcp.mapping`.
    """

    tool: str
    args: Mapping[str, Any] = field(default_factory=dict)
    max_retries: int = 3
    retry_backoff_ms: int = 1000


@dataclass(frozen=True)
class McpToolPolicy:
    tier: str | None = None
    compensation: McpCompensation | None = None


@dataclass(frozen=True)
class McpUpstream:
    """One upstream MCP server, reached over stdio (a child process) or Streamable HTTP."""

    name: str
    transport: str
    command: str | None = None
    args: tuple[str, ...] = ()
    env: Mapping[str, str] | None = None
    cwd: str | None = None
    url: str | None = None
    headers: Mapping[str, str] = field(default_factory=dict)
    tools: Mapping[str, McpToolPolicy] = field(default_factory=dict)

    def prefixed(self, tool: str) -> str:
        return f"{self.name}{PREFIX_SEPARATOR}{tool}"


@dataclass(frozen=True)
class McpSettings:
    """`approval_url` is where a person approves a call (`{approval_id}` is filled in); by
    default the dashboard's pending approvals on the URL the client reached the proxy by."""

    upstreams: tuple[McpUpstream, ...] = ()
    allowed_origins: tuple[str, ...] = ()
    approval_url: str | None = None
    # How long a `tools/call` that needs an approval waits for the decision before answering
    # "pending" (0 to 55 s: under the ~60 s request timeout of MCP clients; docs/mcp.md).
    approval_wait_seconds: int = DEFAULT_APPROVAL_WAIT_SECONDS


def tier_for(policy: McpToolPolicy | None, read_only_hint: bool | None) -> str:
    """The tier a gateway tool is registered with: the config's, else the annotation's."""
    if policy is not None and policy.tier is not None:
        return policy.tier
    return ToolTier.SAFE.value if read_only_hint is True else ToolTier.IRREVERSIBLE.value


def _str_map(where: str, value: Any) -> dict[str, str]:
    if not isinstance(value, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    ):
        raise ValueError(f"{where}: expected a table of strings")
    return dict(value)


def _bounded(where: str, name: str, value: Any) -> int:
    """A compensation integer within the range every store holds (`COMPENSATION_LIMITS`)."""
    try:
        return check_compensation_integer(name, value)
    except ValueError as exc:
        raise ValueError(f"{where}: {exc}") from None


def _unknown(where: str, item: Mapping[str, Any], allowed: frozenset[str]) -> None:
    unknown = set(item) - allowed
    if unknown:
        raise ValueError(f"{where}: unknown keys {sorted(unknown)}")


def _compensation(where: str, raw: Any) -> McpCompensation:
    if not isinstance(raw, dict):
        raise ValueError(f"{where}: expected a table")
    _unknown(where, raw, _COMPENSATION_KEYS)
    tool = raw.get("tool")
    if not isinstance(tool, str) or not tool:
        raise ValueError(f"{where}.tool must be a non-empty string")
    args = raw.get("args", {})
    if not isinstance(args, dict):
        raise ValueError(f"{where}.args: expected a table")
    return McpCompensation(
        tool=tool,
        args=args,
        max_retries=_bounded(where, "max_retries", raw.get("max_retries", 3)),
        retry_backoff_ms=_bounded(where, "retry_backoff_ms", raw.get("retry_backoff_ms", 1000)),
    )


def _tool_policy(where: str, raw: Any) -> McpToolPolicy:
    if not isinstance(raw, dict):
        raise ValueError(f"{where}: expected a table")
    _unknown(where, raw, _TOOL_KEYS)
    tier = raw.get("tier")
    if tier is not None and tier not in TIER_VALUES:
        raise ValueError(f"{where}.tier: expected one of {', '.join(TIER_VALUES)}")
    compensation = raw.get("compensation")
    parsed = None if compensation is None else _compensation(f"{where}.compensation", compensation)
    if tier == ToolTier.COMPENSABLE.value and parsed is None:
        raise ValueError(f"{where}: a compensable tool needs a compensation")
    return McpToolPolicy(tier=tier, compensation=parsed)


def _upstream(where: str, raw: Any) -> McpUpstream:
    if not isinstance(raw, dict):
        raise ValueError(f"{where}: expected a table")
    _unknown(where, raw, _UPSTREAM_KEYS)
    name = raw.get("name")
    if not isinstance(name, str) or not name or PREFIX_SEPARATOR in name:
        raise ValueError(f"{where}.name must be a non-empty string without '{PREFIX_SEPARATOR}'")
    transport = raw.get("transport", "http" if "url" in raw else "stdio")
    if transport not in TRANSPORTS:
        raise ValueError(f"{where}.transport: expected one of {', '.join(TRANSPORTS)}")
    command, url = raw.get("command"), raw.get("url")
    if transport == "stdio" and (not isinstance(command, str) or not command):
        raise ValueError(f"{where}: a stdio upstream needs a command")
    if transport == "http" and (not isinstance(url, str) or not url):
        raise ValueError(f"{where}: an http upstream needs a url")
    args = raw.get("args", [])
    if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
        raise ValueError(f"{where}.args: expected a list of strings")
    cwd = raw.get("cwd")
    if cwd is not None and not isinstance(cwd, str):
        raise ValueError(f"{where}.cwd: expected a string")
    tools_raw = raw.get("tools", {})
    if not isinstance(tools_raw, dict):
        raise ValueError(f"{where}.tools: expected a table of tables")
    tools = {t: _tool_policy(f"{where}.tools.{t}", p) for t, p in tools_raw.items()}
    return McpUpstream(
        name=name,
        transport=transport,
        command=command,
        args=tuple(args),
        env=_str_map(f"{where}.env", raw["env"]) if "env" in raw else None,
        cwd=cwd,
        url=url,
        headers=_str_map(f"{where}.headers", raw.get("headers", {})),
        tools=tools,
    )


def parse_mcp_settings(raw: Any) -> McpSettings:
    """Parse the `[mcp]` table (None: no gateway upstreams). Raises `ValueError`."""
    if raw is None:
        return McpSettings()
    if not isinstance(raw, dict):
        raise ValueError("[mcp] must be a table")
    _unknown("mcp", raw, _MCP_KEYS)
    items = raw.get("upstreams", [])
    if not isinstance(items, list):
        raise ValueError("'mcp.upstreams' must be an array of tables ([[mcp.upstreams]])")
    upstreams = tuple(_upstream(f"mcp.upstreams[{n}]", item) for n, item in enumerate(items))
    names = [u.name for u in upstreams]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise ValueError(f"mcp.upstreams: duplicate names {duplicates}")
    origins = raw.get("allowed_origins", [])
    if not isinstance(origins, list) or not all(isinstance(o, str) and o for o in origins):
        raise ValueError("mcp.allowed_origins: expected a list of non-empty strings")
    approval_url = raw.get("approval_url")
    if approval_url is not None and (not isinstance(approval_url, str) or not approval_url):
        raise ValueError("mcp.approval_url: expected a non-empty string")
    wait = raw.get("approval_wait_seconds", DEFAULT_APPROVAL_WAIT_SECONDS)
    if isinstance(wait, bool) or not isinstance(wait, int) or not 0 <= wait <= 55:
        raise ValueError("mcp.approval_wait_seconds: expected a whole number from 0 to 55")
    return McpSettings(
        upstreams=upstreams,
        allowed_origins=tuple(origins),
        approval_url=approval_url,
        approval_wait_seconds=wait,
    )
