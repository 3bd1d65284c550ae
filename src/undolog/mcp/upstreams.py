"""The gateway's connections to its upstream MCP servers, and calls through them.

`UpstreamPool` opens one `mcp.Client` per configured upstream (a child process over stdio, or
Streamable HTTP) when the proxy starts and closes them when it stops. Each client lives in a
task of its own, so an upstream that goes away fails its calls (and is reconnected by the next
one) without taking the proxy down. Tools are published under the upstream's name as a prefix
(`memory.create_entities`), schemas and annotations unchanged.

An upstream that cannot be reached at start does not stop the proxy either: it is logged, its
tools are missing until it answers, and listing tries it again at most once every
`RETRY_SECONDS`, so a dead server is not respawned on every request.

The pool is also a tool router for `ToolExecutor`: a call the proxy runs itself (an approved
call, a compensation during a rollback) whose tool name has an upstream's prefix goes to that
upstream instead of the HTTP tool server.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass
from typing import Any

import httpx2
import structlog
from mcp import Client, MCPError, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from mcp_types import CONNECTION_CLOSED, REQUEST_TIMEOUT, CallToolResult, TextContent, Tool

from undolog.mcp.config import PREFIX_SEPARATOR, McpToolPolicy, McpUpstream, tier_for
from undolog.mcp.mapping import MappingError, resolve_mapping
from undolog.proxy.executor import ToolResult, ToolTransportError

__all__ = [
    "COMPENSATION_ARGS_KEY",
    "RETRY_SECONDS",
    "GatewayTool",
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


def _error_result(message: str) -> CallToolResult:
    return CallToolResult(content=[TextContent(type="text", text=message)], is_error=True)


def _describe(exc: BaseException) -> str:
    """An error without its task groups: `ConnectError: All connection attempts failed`."""
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    if isinstance(exc, BaseExceptionGroup):
        return "; ".join(_describe(e) for e in exc.exceptions)
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


async def _open_client(
    upstream: McpUpstream, stack: contextlib.AsyncExitStack, timeout_seconds: float
) -> Client:
    """Enter a client for the upstream on `stack`."""
    if upstream.transport == "stdio":
        assert upstream.command is not None
        params = StdioServerParameters(
            command=upstream.command,
            args=list(upstream.args),
            env=dict(upstream.env) if upstream.env is not None else None,
            cwd=upstream.cwd,
        )
        return await stack.enter_async_context(Client(params, read_timeout_seconds=timeout_seconds))
    assert upstream.url is not None
    # The client does not close an HTTP client it was given: the stack does.
    http = await stack.enter_async_context(
        httpx2.AsyncClient(headers=dict(upstream.headers), timeout=timeout_seconds)
    )
    transport = streamable_http_client(upstream.url, http_client=http)
    return await stack.enter_async_context(Client(transport, read_timeout_seconds=timeout_seconds))


class _Link:
    """One upstream's connection, held open by a task of its own.

    The client's transport runs background tasks; if the upstream goes away they fail, and
    that failure must end this task, not the proxy's lifespan. A lost link is opened again
    by the next call that needs it.
    """

    def __init__(self, upstream: McpUpstream, timeout_seconds: float, retry_seconds: float) -> None:
        self.upstream = upstream
        self.timeout_seconds = timeout_seconds
        self.retry_seconds = retry_seconds
        self.client: Client | None = None
        self.error: str | None = None  # why the last connection failed, until one succeeds
        self._retry_at = 0.0  # `time.monotonic()` before which `connect(backoff=True)` refuses
        self._task: asyncio.Task[None] | None = None
        self._stop = asyncio.Event()
        self._lock = asyncio.Lock()

    @property
    def connected(self) -> bool:
        return self.client is not None and self._task is not None and not self._task.done()

    async def connect(self, *, backoff: bool = False) -> Client:
        """The open client, connecting first if there is none.

        Args:
            backoff: refuse without trying if the last attempt failed under `retry_seconds` ago.

        Raises:
            ToolTransportError: the upstream cannot be reached.
        """
        async with self._lock:
            if self.connected:
                assert self.client is not None
                return self.client
            if backoff and self.error is not None and time.monotonic() < self._retry_at:
                raise ToolTransportError(self.unavailable())
            ready: asyncio.Future[Client] = asyncio.get_running_loop().create_future()
            self._stop = asyncio.Event()
            self._task = asyncio.create_task(self._hold(ready), name=f"mcp-{self.upstream.name}")
            try:
                client = await ready
            except Exception as exc:
                self.error = _describe(exc)
                self._retry_at = time.monotonic() + self.retry_seconds
                # Name and transport only: `headers` and `env` may hold secrets.
                _log.warning(
                    "mcp_upstream_unreachable",
                    upstream=self.upstream.name,
                    transport=self.upstream.transport,
                    error=self.error,
                    retry_seconds=self.retry_seconds,
                )
                raise ToolTransportError(self.unavailable()) from None
            if self.error is not None:
                _log.info("mcp_upstream_reconnected", upstream=self.upstream.name)
            self.error = None
            return client

    def unavailable(self) -> str:
        return (
            f"MCP upstream '{self.upstream.name}' is unavailable ({self.error}); UndoLog tries "
            f"it again at most every {self.retry_seconds:g}s"
        )

    async def _hold(self, ready: asyncio.Future[Client]) -> None:
        try:
            async with contextlib.AsyncExitStack() as stack:
                self.client = await _open_client(self.upstream, stack, self.timeout_seconds)
                ready.set_result(self.client)
                await self._stop.wait()
        except Exception as exc:
            if not ready.done():
                ready.set_exception(exc)
            else:
                _log.warning("mcp_upstream_lost", upstream=self.upstream.name, error=_describe(exc))
        finally:
            self.client = None
            if not ready.done():  # cancelled while connecting
                ready.set_exception(ToolTransportError("the upstream connection was closed"))

    async def close(self) -> None:
        self._stop.set()
        task, self._task = self._task, None
        if task is not None:
            with contextlib.suppress(Exception, asyncio.CancelledError):
                await task


class UpstreamPool:
    """Open clients to the configured upstreams; see the module docstring."""

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
        self._links: dict[str, _Link] = {}
        self._tools: dict[str, GatewayTool] = {}

    async def start(self) -> None:
        """Connect to every upstream and list its tools.

        One that cannot be reached is logged and tried again by a later `refresh_tools`.
        """
        self._links = {
            n: _Link(u, self.timeout_seconds, self.retry_seconds) for n, u in self.upstreams.items()
        }
        try:
            await self.refresh_tools()
        except BaseException:
            await self.close()
            raise

    async def close(self) -> None:
        links, self._links = self._links, {}
        for link in links.values():
            await link.close()

    async def refresh_tools(self) -> list[GatewayTool]:
        """List every upstream's tools again (all pages), under their prefixed names.

        An upstream that cannot be reached keeps the tools it had (none, if it never answered);
        one whose last connection failed is tried again only after `retry_seconds`.
        """
        tools: dict[str, GatewayTool] = {}
        for name, link in self._links.items():
            upstream = self.upstreams[name]
            try:
                client = await link.connect(backoff=True)
                cursor: str | None = None
                found: dict[str, GatewayTool] = {}
                while True:
                    page = await client.list_tools(cursor=cursor, cache_mode="bypass")
                    for tool in page.tools:
                        renamed = tool.model_copy(update={"name": upstream.prefixed(tool.name)})
                        found[renamed.name] = GatewayTool(upstream, tool.name, renamed)
                    cursor = page.next_cursor
                    if not cursor:
                        break
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
        """Why a prefixed tool cannot be listed: its upstream is down. None if it is up."""
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

    async def call_upstream(self, name: str, args: dict[str, Any]) -> CallToolResult:
        """Call a prefixed tool on its upstream.

        A protocol error of the upstream (an unknown tool, arguments it refuses) comes back
        as an `isError` result: the call was made, and the upstream said no.

        Raises:
            ToolTransportError: no such upstream, or it could not be reached in time.
        """
        split = self._split(name)
        link = self._links.get(split[0].name) if split is not None else None
        if split is None or link is None:
            raise ToolTransportError(f"no MCP upstream serves '{name}'")
        upstream, tool = split
        client = await link.connect()
        try:
            return await client.call_tool(tool, args)
        except MCPError as exc:
            if exc.error.code in (CONNECTION_CLOSED, REQUEST_TIMEOUT):
                raise ToolTransportError(
                    f"upstream '{upstream.name}' failed on '{tool}': {exc}"
                ) from None
            return _error_result(f"upstream '{upstream.name}' refused '{tool}': {exc}")
        except TimeoutError:
            raise ToolTransportError(
                f"upstream '{upstream.name}' timed out after {self.timeout_seconds}s on '{tool}'"
            ) from None
        except Exception as exc:  # a broken pipe, a closed stream: the call's outcome is unknown
            raise ToolTransportError(
                f"upstream '{upstream.name}' failed on '{tool}': {exc!r}"
            ) from None

    # -- ToolExecutor's router protocol ---------------------------------------------------

    def handles(self, tool_name: str) -> bool:
        return self._split(tool_name) is not None

    async def call(self, tool_name: str, args: Any, *, idempotency_key: str) -> ToolResult:
        """Run a proxy-executed call: a forward call (approved), or a compensation."""
        del idempotency_key  # MCP has no place for it; the engine's signature guards the call
        if isinstance(args, dict) and COMPENSATION_ARGS_KEY in args:
            try:
                args = resolve_mapping(args[COMPENSATION_ARGS_KEY], args)
            except MappingError as exc:
                return ToolResult(False, None, f"compensation arguments: {exc}")
        if not isinstance(args, dict):
            return ToolResult(False, None, "MCP tool arguments must be an object")
        return result_to_tool_result(await self.call_upstream(tool_name, args))
