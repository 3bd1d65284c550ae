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
orgs = ["acme"]                  # the orgs that may see and call its tools

[mcp.upstreams.tools.create_entities]
tier = "compensable"
compensation.tool = "delete_entities"
compensation.args = { entityNames = "$.original_args.entities[*].name" }
```

A tool's tier is the config's when it names one. Otherwise it follows the tool's annotations
(`readOnlyHint` → safe, anything else → irreversible): annotations come from the upstream,
which may not be trusted, so they can only ever make a tool *stricter* than safe by default,
and the config always wins. Parsing is pure: it raises `ValueError` naming the bad key.

An upstream belongs to the orgs it lists (`orgs`). One that lists none is open to every org,
which `check_mcp_orgs` allows only where the config declares at most one org, unless the
upstream is marked `shared = true`: the operator's word that the server keeps orgs apart itself,
by the org UndoLog passes it (a signed `X-UndoLog-Org` over HTTP, with the upstream's `secret`;
`UNDOLOG_ORG` in the environment of a process of its own over stdio; docs/mcp.md, "Orgs").
Listing several orgs is sharing too, and needs `shared = true` as well.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

from undolog.webhook_config import read_secret
from undolog_sdk.tier import TIER_VALUES, ToolTier, check_compensation_integer

__all__ = [
    "McpCompensation",
    "McpSettings",
    "McpToolPolicy",
    "McpUpstream",
    "ToolServerTool",
    "check_mcp_orgs",
    "parse_mcp_settings",
    "tier_for",
]

TRANSPORTS = ("stdio", "http")
PREFIX_SEPARATOR = "."
ORG_PLACEHOLDER = "{org}"  # in a stdio upstream's args, env values and cwd: the calling org

DEFAULT_APPROVAL_WAIT_SECONDS = 50
_MCP_KEYS = frozenset({"allowed_origins", "approval_url", "approval_wait_seconds", "upstreams"})
_UPSTREAM_KEYS = frozenset(
    {"name", "transport", "command", "args", "env", "cwd", "url", "headers", "tools"}
    | {"orgs", "shared", "secret", "secret_env"}
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
    """One upstream MCP server, reached over stdio (a child process) or Streamable HTTP.

    `orgs` empty: open to every org; otherwise only to the listed ones. `shared`: serves
    several orgs and keeps them apart itself. `secret`: an HTTP upstream's key for
    `X-UndoLog-Signature` (None: one made up per process, which no server can verify).
    """

    name: str
    transport: str
    command: str | None = None
    args: tuple[str, ...] = ()
    env: Mapping[str, str] | None = None
    cwd: str | None = None
    url: str | None = None
    headers: Mapping[str, str] = field(default_factory=dict)
    tools: Mapping[str, McpToolPolicy] = field(default_factory=dict)
    orgs: tuple[str, ...] = ()
    shared: bool = False
    secret: str | None = field(default=None, repr=False)

    def prefixed(self, tool: str) -> str:
        return f"{self.name}{PREFIX_SEPARATOR}{tool}"

    def allows(self, org_id: str) -> bool:
        """Whether `org_id` may see and call this upstream's tools, prompts and resources."""
        return not self.orgs or org_id in self.orgs


@dataclass(frozen=True)
class ToolServerTool:
    """A tool of the HTTP tool server (the `default` upstream, `POST /tools/{name}`) that
    `/mcp` lists as it is, unprefixed, for `orgs`. Its tier is the org's registry's, as for
    `POST /mcp/tool_call`, and a call runs exactly as one through that route does. Set in code,
    not in the `[mcp]` table: `serve --demo` publishes the demo tools (docs/mcp.md)."""

    name: str
    description: str
    input_schema: Mapping[str, Any]
    orgs: tuple[str, ...]


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
    tool_server_tools: tuple[ToolServerTool, ...] = ()  # `serve --demo`'s (ToolServerTool)


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


def _orgs(where: str, raw: Mapping[str, Any]) -> tuple[tuple[str, ...], bool]:
    orgs = raw.get("orgs", None)
    if orgs is not None and (
        not isinstance(orgs, list) or not orgs or not all(isinstance(o, str) and o for o in orgs)
    ):
        raise ValueError(f"{where}.orgs: expected a list of org ids (leave it out: every org)")
    shared = raw.get("shared", False)
    if not isinstance(shared, bool):
        raise ValueError(f"{where}.shared: expected true or false")
    return tuple(dict.fromkeys(orgs or ())), shared


def _upstream(where: str, raw: Any, env: Mapping[str, str]) -> McpUpstream:
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
    orgs, shared = _orgs(where, raw)
    if transport == "stdio" and ("secret" in raw or "secret_env" in raw):
        raise ValueError(
            f"{where}: a stdio upstream has no secret: it is told its org in its environment "
            "(UNDOLOG_ORG), by a process of its own per org"
        )
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
        orgs=orgs,
        shared=shared,
        secret=read_secret(where, raw, env),
    )


def parse_mcp_settings(raw: Any, env: Mapping[str, str] | None = None) -> McpSettings:
    """Parse the `[mcp]` table (None: no gateway upstreams). Raises `ValueError`.

    `env` holds the variables `secret_env` names (default: none).
    """
    if raw is None:
        return McpSettings()
    if not isinstance(raw, dict):
        raise ValueError("[mcp] must be a table")
    _unknown("mcp", raw, _MCP_KEYS)
    items = raw.get("upstreams", [])
    if not isinstance(items, list):
        raise ValueError("'mcp.upstreams' must be an array of tables ([[mcp.upstreams]])")
    env = {} if env is None else env
    upstreams = tuple(_upstream(f"mcp.upstreams[{n}]", item, env) for n, item in enumerate(items))
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


def check_mcp_orgs(settings: McpSettings, org_ids: Collection[str]) -> None:
    """Refuse an upstream that several orgs would share without the operator saying so.

    Args:
        org_ids: the orgs the config declares.

    Raises:
        ValueError: an upstream with no `orgs` where the config declares several orgs, or one
            listing several orgs, and not marked `shared = true`.
    """
    declared = sorted(set(org_ids))
    for n, upstream in enumerate(settings.upstreams):
        if upstream.shared:
            continue
        where = f"mcp.upstreams[{n}] ({upstream.name!r})"
        remedy = (
            'list the org that may use it (orgs = ["..."]; one upstream per org), or mark it '
            "shared = true if the server keeps orgs apart itself by the org UndoLog passes it "
            '(docs/mcp.md, "Orgs")'
        )
        if not upstream.orgs and len(declared) > 1:
            raise ValueError(
                f"{where} names no orgs, and the config declares {len(declared)} orgs "
                f"({', '.join(declared)}): every org would see and call the same server; " + remedy
            )
        if len(upstream.orgs) > 1:
            raise ValueError(
                f"{where} is open to {len(upstream.orgs)} orgs ({', '.join(upstream.orgs)}), "
                "which would see and call the same server; " + remedy
            )
