"""The gateway's connections to its upstream MCP servers, and calls through them.

Upstreams belong to orgs (docs/mcp.md, "Orgs"): `UpstreamPool` keeps, per org, an `OrgUpstreams`
that sees only the upstreams open to that org (`McpUpstream.allows`), and opens one `mcp.Client`
per such upstream *for that org* (a child process of its own over stdio, or Streamable HTTP
with every request signed for the org; `undolog.mcp.link`). An org never lists, reads or calls
through another org's upstream, and a shared upstream always knows which org is asking. The
config's orgs are connected when the proxy starts, any other org on its first request; all are
closed when it stops. Each client lives in a task of its own, so an upstream that goes away
fails its calls (and is reconnected by the next one) without taking the proxy down. Tools are
published under the upstream's name as a prefix (`memory.create_entities`), schemas and
annotations unchanged.

An upstream that cannot be reached at start does not stop the proxy either: it is logged, its
tools are missing until it answers, and listing tries it again at most once every
`RETRY_SECONDS`, so a dead server is not respawned on every request.

The pool is also a tool router for `ToolExecutor`: a call the proxy runs itself (an approved
call, a compensation during a rollback) whose tool name has an upstream's prefix goes to that
upstream instead of the HTTP tool server.

Resources and prompts are read-only, so they go straight to the upstreams (nothing is recorded).
Prompts are published under the same prefixes as tools; resources keep their URIs, which are
the servers' own identifiers. Each listing asks every upstream again (all pages) and leaves out
an upstream that does not declare the capability, answers method-not-found, or does not answer
at all (its items are absent while it is down). The pool remembers what each upstream listed
last, also while it is down, and routes by it:

- `prompts/get` goes to the upstream named by the prefix, if it listed the prompt.
- `resources/read` goes to the upstream that listed the URI; if two listed it, the first in
  config order (the other is logged once). A URI nobody listed goes to the upstreams that
  listed a template matching it (RFC 6570), in config order, until one answers without error.
  A URI that matches nothing even after listing again goes to every upstream that may serve
  resources, in config order, the same way; if none can read it, it is an unknown resource.

A read or a get of an item whose upstream is down is a JSON-RPC error naming the upstream
(`-32603`, `data.upstream`); an upstream's own protocol error passes through as it is.
"""

from __future__ import annotations

import secrets
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any, TypeVar, cast

import structlog
from mcp import Client, MCPError
from mcp_types import (
    CONNECTION_CLOSED,
    INVALID_PARAMS,
    METHOD_NOT_FOUND,
    REQUEST_TIMEOUT,
    CallToolResult,
    GetPromptResult,
    Prompt,
    ReadResourceResult,
    RequestParamsMeta,
    Resource,
    ResourceTemplate,
    TextContent,
    Tool,
)

from undolog.mcp.config import PREFIX_SEPARATOR, McpToolPolicy, McpUpstream, tier_for
from undolog.mcp.link import (
    EFFECT_META_KEY,
    Capability,
    _Answer,
    _declares,
    _describe,
    _error_result,
    _Link,
    _list_prompts,
    _list_resources,
    _list_templates,
    _list_tools,
    _matches,
    _unavailable,
    _unstamped,
)
from undolog.mcp.mapping import MappingError, resolve_mapping
from undolog.services.executor import (
    ToolOutcomeUnknown,
    ToolResult,
    ToolTransportError,
    ToolUnreachable,
)

__all__ = [
    "COMPENSATION_ARGS_KEY",
    "RETRY_SECONDS",
    "GatewayTool",
    "OrgUpstreams",
    "UpstreamPool",
    "result_to_tool_result",
]

# The compensation descriptor's captured args carry the argument mapping under this key; the
# pool resolves it against the payload (`original_args`, `original_result`) when it runs.
COMPENSATION_ARGS_KEY = "undolog_mcp_args"

# After a failed connection, listing tools leaves the upstream alone for this long. A call of
# one of its tools still tries at once: the agent asked for it, and the attempt is recorded.
RETRY_SECONDS = 5.0

_log = structlog.get_logger("undolog.mcp")

_T = TypeVar("_T")


@dataclass(frozen=True)
class GatewayTool:
    """A tool as the gateway publishes it: the upstream's `Tool` under its prefixed name."""

    upstream: McpUpstream
    upstream_name: str
    tool: Tool  # already renamed to the prefixed name

    @property
    def name(self) -> str:
        return self.tool.name

    @property
    def policy(self) -> McpToolPolicy | None:
        return self.upstream.tools.get(self.upstream_name)

    @property
    def tier(self) -> str:
        read_only = self.tool.annotations.read_only_hint if self.tool.annotations else None
        return tier_for(self.policy, read_only)

    def compensation(self) -> dict[str, Any] | None:
        """The engine's compensation descriptor (JSON form) for a compensable tool."""
        policy = self.policy
        if policy is None or policy.compensation is None:
            return None
        comp = policy.compensation
        return {
            "fn_name": self.upstream.prefixed(comp.tool),
            "args": {COMPENSATION_ARGS_KEY: dict(comp.args)},
            "max_retries": comp.max_retries,
            "retry_backoff_ms": comp.retry_backoff_ms,
        }


def result_to_tool_result(result: CallToolResult) -> ToolResult:
    """An MCP result as the proxy's ToolResult; `isError` is a logical failure."""
    output = result.model_dump(mode="json", by_alias=True, exclude_none=True)
    error = None
    if result.is_error:
        texts = [c.text for c in result.content if isinstance(c, TextContent)]
        error = "\n".join(texts) or "the tool reported an error"
    return ToolResult(not result.is_error, output, error)


class UpstreamPool:
    """Every org's view of the configured upstreams; see the module docstring."""

    def __init__(
        self,
        upstreams: tuple[McpUpstream, ...],
        *,
        timeout_seconds: float,
        retry_seconds: float | None = None,
    ) -> None:
        """`retry_seconds` defaults to `RETRY_SECONDS` as it is when the pool is made."""
        self.upstreams = {u.name: u for u in upstreams}
        self.timeout_seconds = timeout_seconds
        self.retry_seconds = RETRY_SECONDS if retry_seconds is None else retry_seconds
        # An HTTP upstream without a configured secret is still signed, with a key of this
        # process's that no server holds (warned at start, as for HTTP tool servers).
        self._secrets = {u.name: u.secret or secrets.token_urlsafe(32) for u in upstreams}
        self._orgs: dict[str, OrgUpstreams] = {}

    def for_org(self, org_id: str) -> OrgUpstreams:
        """The upstreams `org_id` may use, connected on its behalf (made on first use)."""
        view = self._orgs.get(org_id)
        if view is None:
            links = {
                name: _Link(
                    u, org_id, self._secrets[name], self.timeout_seconds, self.retry_seconds
                )
                for name, u in self.upstreams.items()
                if u.allows(org_id)
            }
            view = self._orgs[org_id] = OrgUpstreams(org_id, links, self.timeout_seconds)
        return view

    async def start(self, org_ids: Iterable[str] = ()) -> None:
        """Connect the upstreams of each of `org_ids` (the config's orgs) and list their tools.

        One that cannot be reached is logged and tried again by a later `refresh_tools`.
        """
        for upstream in self.upstreams.values():
            if upstream.transport == "http" and upstream.secret is None:
                _log.warning(
                    "mcp_upstream_secret_generated",
                    upstream=upstream.name,
                    hint="set the upstream's secret or secret_env so the server can verify "
                    "X-UndoLog-Signature",
                )
        try:
            for org_id in org_ids:
                await self.for_org(org_id).ready()
        except BaseException:
            await self.close()
            raise

    async def close(self) -> None:
        views, self._orgs = self._orgs, {}
        for view in views.values():
            await view.close()

    def offered(self) -> set[Capability]:
        """What the upstreams declared when they last connected (for any org), besides tools."""
        offered: set[Capability] = set()
        for view in self._orgs.values():
            offered |= view.offered()
        return offered

    def connections(self) -> list[tuple[str, str]]:
        """`(upstream, org)` of every open connection."""
        return [(name, org_id) for org_id, view in self._orgs.items() for name in view.connected()]

    # -- ToolExecutor's router protocol ---------------------------------------------------

    def handles(self, tool_name: str) -> bool:
        prefix, sep, tool = tool_name.partition(PREFIX_SEPARATOR)
        return bool(sep and tool) and prefix in self.upstreams

    async def call(
        self, tool_name: str, args: Any, *, org_id: str, effect_id: str, idempotency_key: str
    ) -> ToolResult:
        """Run a proxy-executed call for `org_id`: a forward call (approved), or a compensation.

        Raises:
            ToolTransportError: the upstream is not open to the org (nothing is sent), or it
                could not be reached.
        """
        del idempotency_key  # MCP has no place for it; the effect id goes in `_meta`, signed
        upstream = self.upstreams.get(tool_name.partition(PREFIX_SEPARATOR)[0])
        if upstream is None or not upstream.allows(org_id):
            _log.warning("mcp_upstream_not_open", tool=tool_name, org_id=org_id)
            raise ToolUnreachable(f"the MCP upstream of '{tool_name}' is not open to this org")
        if isinstance(args, dict) and COMPENSATION_ARGS_KEY in args:
            try:
                args = resolve_mapping(args[COMPENSATION_ARGS_KEY], args)
            except MappingError as exc:
                return ToolResult(False, None, f"compensation arguments: {exc}")
        if not isinstance(args, dict):
            return ToolResult(False, None, "MCP tool arguments must be an object")
        view = self.for_org(org_id)
        return result_to_tool_result(await view.call_upstream(tool_name, args, effect_id=effect_id))


class OrgUpstreams:
    """One org's upstreams: its connections, its listings, its calls and reads."""

    def __init__(self, org_id: str, links: dict[str, _Link], timeout_seconds: float) -> None:
        self.org_id = org_id
        self.upstreams = {name: link.upstream for name, link in links.items()}
        self.timeout_seconds = timeout_seconds
        self._links = links
        self._listed = False  # tools listed once (at start, or on the org's first request)
        self._tools: dict[str, GatewayTool] = {}
        # What each upstream listed last, by upstream name: kept while it is down, for routing.
        self._resources: dict[str, list[Resource]] = {}
        self._templates: dict[str, list[ResourceTemplate]] = {}
        self._prompts: dict[str, list[Prompt]] = {}
        self._shadowed: set[tuple[str, str]] = set()  # (uri, upstream) already logged

    async def ready(self) -> None:
        """Connect and list the tools once, if that was never done."""
        if not self._listed:
            await self.refresh_tools()

    async def close(self) -> None:
        links, self._links = self._links, {}
        for link in links.values():
            await link.close()

    def connected(self) -> list[str]:
        """The upstreams this org is connected to now."""
        return [name for name, link in self._links.items() if link.connected]

    async def refresh_tools(self) -> list[GatewayTool]:
        """List every upstream's tools again (all pages), under their prefixed names.

        An upstream that cannot be reached keeps the tools it had (none, if it never answered);
        one whose last connection failed is tried again only after `retry_seconds`.
        """
        self._listed = True
        tools: dict[str, GatewayTool] = {}
        for name, link in self._links.items():
            upstream = self.upstreams[name]
            try:
                client = await link.connect(backoff=True)
                found: dict[str, GatewayTool] = {}
                for tool in await _list_tools(client):
                    renamed = tool.model_copy(update={"name": upstream.prefixed(tool.name)})
                    found[renamed.name] = GatewayTool(upstream, tool.name, renamed)
            except Exception as exc:
                if not isinstance(exc, ToolTransportError):  # connecting logs its own failure
                    _log.warning("mcp_upstream_unlisted", upstream=name, error=_describe(exc))
                found = {k: t for k, t in self._tools.items() if t.upstream.name == name}
            tools.update(found)
        self._tools = tools
        return list(tools.values())

    def tools(self) -> list[GatewayTool]:
        return list(self._tools.values())

    def get(self, name: str) -> GatewayTool | None:
        return self._tools.get(name)

    def unavailable(self, name: str) -> str | None:
        """Why a prefixed tool or prompt cannot be listed: its upstream is down. None if up."""
        split = self._split(name)
        link = self._links.get(split[0].name) if split is not None else None
        if link is None or link.connected or link.error is None:
            return None
        return link.unavailable()

    def _split(self, name: str) -> tuple[McpUpstream, str] | None:
        prefix, sep, tool = name.partition(PREFIX_SEPARATOR)
        upstream = self.upstreams.get(prefix)
        if not sep or upstream is None or not tool:
            return None
        return upstream, tool

    async def call_upstream(
        self, name: str, args: dict[str, Any], *, effect_id: str | None = None
    ) -> CallToolResult:
        """Call a prefixed tool on its upstream; a recorded call passes its `effect_id`
        (sent in `_meta["undolog/effect_id"]`, which an HTTP upstream's signature covers).

        A protocol error of the upstream (an unknown tool, arguments it refuses) comes back
        as an `isError` result: the call was made, and the upstream said no.

        Raises:
            ToolTransportError: no such upstream, or it could not be reached in time.
        """
        split = self._split(name)
        link = self._links.get(split[0].name) if split is not None else None
        if split is None or link is None:
            raise ToolUnreachable(f"no MCP upstream serves '{name}'")
        upstream, tool = split
        client = await link.connect()
        meta = cast(RequestParamsMeta, {EFFECT_META_KEY: effect_id}) if effect_id else None
        try:
            return await client.call_tool(tool, args, meta=meta)
        except MCPError as exc:
            if exc.error.code in (CONNECTION_CLOSED, REQUEST_TIMEOUT):
                raise ToolOutcomeUnknown(
                    f"upstream '{upstream.name}' failed on '{tool}': {exc}"
                ) from None
            return _error_result(f"upstream '{upstream.name}' refused '{tool}': {exc}")
        except TimeoutError:
            raise ToolOutcomeUnknown(
                f"upstream '{upstream.name}' timed out after {self.timeout_seconds}s on '{tool}'"
            ) from None
        except Exception as exc:  # a broken pipe, a closed stream: the call's outcome is unknown
            raise ToolOutcomeUnknown(
                f"upstream '{upstream.name}' failed on '{tool}': {exc!r}"
            ) from None

    # -- resources and prompts: read-only, straight to the upstreams ---------------------------

    def offered(self) -> set[Capability]:
        """What the org's upstreams declared when they last connected, besides tools."""
        caps = [link.capabilities for link in self._links.values()]
        both: tuple[Capability, ...] = ("resources", "prompts")
        return {capability for capability in both if any(_declares(c, capability) for c in caps)}

    async def list_resources(self) -> list[Resource]:
        """Every upstream's resources (all pages), URIs unchanged; the first lister of a URI wins.

        An upstream that does not serve resources, or does not answer, is left out.
        """
        answered = await self._collect("resources", _list_resources, self._resources)
        owners = self._owners(self._resources, lambda r: r.uri)
        listed: dict[str, Resource] = {}
        for name in answered:
            for resource in self._resources[name]:
                if owners[resource.uri] == name:
                    listed.setdefault(resource.uri, resource)
        return list(listed.values())

    async def list_resource_templates(self) -> list[ResourceTemplate]:
        """Every upstream's resource templates, as `list_resources` lists resources."""
        answered = await self._collect("resources", _list_templates, self._templates)
        owners = self._owners(self._templates, lambda t: t.uri_template)
        listed: dict[str, ResourceTemplate] = {}
        for name in answered:
            for template in self._templates[name]:
                if owners[template.uri_template] == name:
                    listed.setdefault(template.uri_template, template)
        return list(listed.values())

    async def read_resource(self, uri: str) -> ReadResourceResult:
        """Read `uri` from the upstream it belongs to (the rule is in the module docstring).

        Raises:
            MCPError: the upstream's own error; `-32603` naming an upstream that is down;
                `-32602` for a URI that no upstream could read.
        """
        readers, known = self._readers(uri)
        if not known:  # listed since the last listing, perhaps: list once more
            await self.list_resources()
            await self.list_resource_templates()
            readers, known = self._readers(uri)
        failures: list[tuple[str, MCPError]] = []
        for name in readers:
            try:
                return await self._ask(name, lambda c: c.read_resource(uri, cache_mode="bypass"))
            except MCPError as exc:
                failures.append((name, exc))
        if known and len(failures) == 1:
            raise failures[0][1]
        reasons = "; ".join(f"'{name}': {exc.message}" for name, exc in failures)
        detail = f" (no upstream could read it: {reasons})" if reasons else ""
        raise MCPError(INVALID_PARAMS, f"Unknown resource: {uri}{detail}", {"uri": uri})

    async def list_prompts(self) -> list[Prompt]:
        """Every upstream's prompts (all pages) under prefixed names, arguments unchanged."""
        answered = await self._collect("prompts", _list_prompts, self._prompts)
        return [
            prompt.model_copy(update={"name": self.upstreams[name].prefixed(prompt.name)})
            for name in answered
            for prompt in self._prompts[name]
        ]

    async def get_prompt(self, name: str, arguments: dict[str, str] | None) -> GetPromptResult:
        """Get a prefixed prompt from its upstream; its answer comes back unchanged.

        Raises:
            MCPError: the upstream's own error; `-32603` naming an upstream that is down;
                `-32602` for a prompt no upstream listed.
        """
        if not self._knows_prompt(name):
            await self.list_prompts()
        split = self._split(name)
        if split is None or not self._knows_prompt(name):
            down = self.unavailable(name)
            if split is not None and down is not None:
                raise _unavailable(split[0].name, down)
            raise MCPError(INVALID_PARAMS, f"Unknown prompt: {name}", {"name": name})
        upstream, prompt = split
        return await self._ask(upstream.name, lambda c: c.get_prompt(prompt, arguments))

    async def _collect(
        self,
        capability: Capability,
        fetch: Callable[[Client], Awaitable[list[_T]]],
        memory: dict[str, list[_T]],
    ) -> list[str]:
        """Ask every upstream for one listing and remember each answer in `memory`.

        Returns:
            The upstreams that answered, in config order. One that does not declare the
            capability, or answers method-not-found, answers with nothing.
        """
        answered: list[str] = []
        for name, link in self._links.items():
            try:
                client = await link.connect(backoff=True)
                items = await fetch(client) if _declares(link.capabilities, capability) else []
            except MCPError as exc:
                if exc.code != METHOD_NOT_FOUND:
                    _log.warning("mcp_upstream_unlisted", upstream=name, error=_describe(exc))
                    continue
                items = []
            except ToolTransportError:
                continue  # connecting logs its own failure
            except Exception as exc:
                _log.warning("mcp_upstream_unlisted", upstream=name, error=_describe(exc))
                continue
            memory[name] = items
            answered.append(name)
        return answered

    def _owners(self, memory: dict[str, list[_T]], key: Callable[[_T], str]) -> dict[str, str]:
        """Each remembered URI (or template), and the first upstream in config order to list it."""
        owners: dict[str, str] = {}
        for name in self._links:
            for item in memory.get(name, ()):
                uri = key(item)
                first = owners.setdefault(uri, name)
                if first != name and (uri, name) not in self._shadowed:
                    self._shadowed.add((uri, name))
                    _log.warning("mcp_resource_shadowed", uri=uri, upstream=name, served_by=first)
        return owners

    def _readers(self, uri: str) -> tuple[list[str], bool]:
        """The upstreams to ask for `uri` in order, and whether any of them listed it."""
        owner = self._owners(self._resources, lambda r: r.uri).get(uri)
        if owner is not None:
            return [owner], True
        matching = [
            name
            for name in self._links
            if any(_matches(t.uri_template, uri) for t in self._templates.get(name, ()))
        ]
        if matching:
            return matching, True
        maybe = [
            name
            for name, link in self._links.items()
            if link.capabilities is None or _declares(link.capabilities, "resources")
        ]
        return maybe, False

    def _knows_prompt(self, name: str) -> bool:
        split = self._split(name)
        if split is None:
            return False
        upstream, prompt = split
        return any(p.name == prompt for p in self._prompts.get(upstream.name, ()))

    async def _ask(self, name: str, ask: Callable[[Client], Awaitable[_Answer]]) -> _Answer:
        """One read-only request to an upstream.

        Raises:
            MCPError: the upstream's own error, as it was; `-32603` naming the upstream when it
                cannot be reached.
        """
        link = self._links[name]
        try:
            client = await link.connect(backoff=True)
        except ToolTransportError as exc:
            raise _unavailable(name, str(exc)) from None
        try:
            return _unstamped(await ask(client))
        except MCPError as exc:
            if exc.code not in (CONNECTION_CLOSED, REQUEST_TIMEOUT):
                raise MCPError.from_error_data(exc.error) from None
            reason = str(exc)
        except Exception as exc:  # a timeout, a broken pipe, a closed stream
            reason = _describe(exc)
        raise _unavailable(name, f"MCP upstream '{name}' is unavailable ({reason})")
