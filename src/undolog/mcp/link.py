"""One upstream MCP server's connection for one org (`_Link`), and the helpers the pool lists
and routes with: paging, capability checks, URI-template matching, and the errors it answers.

A link carries its org (docs/mcp.md, "Orgs"). Over Streamable HTTP, every request is signed as
the HTTP tool servers' calls are (`undolog.upstreams.signed_headers`, docs/upstreams.md), over
the method, the path, the body, the tool (a `tools/call`'s tool name, else the JSON-RPC method)
and the effect id a recorded `tools/call` carries in `_meta["undolog/effect_id"]` (`-` for
any other request). Over stdio,
each org has a process of its own, started with `UNDOLOG_ORG` in its environment and `{org}`
replaced by the org id in its args, env values and cwd.

Private to `undolog.mcp` (see `upstreams.py` for the pool that uses them).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import re
import time
from collections.abc import Awaitable, Callable
from typing import Literal, TypeVar

import httpx2
import orjson
import structlog
from mcp import Client, InvalidUriTemplate, MCPError, StdioServerParameters, UriTemplate
from mcp.client.streamable_http import streamable_http_client
from mcp_types import (
    INTERNAL_ERROR,
    SERVER_INFO_META_KEY,
    CallToolResult,
    GetPromptResult,
    ListPromptsResult,
    ListResourcesResult,
    ListResourceTemplatesResult,
    ListToolsResult,
    Prompt,
    ReadResourceResult,
    Resource,
    ResourceTemplate,
    ServerCapabilities,
    TextContent,
    Tool,
)

from undolog.mcp.config import ORG_PLACEHOLDER, McpUpstream
from undolog.services.executor import ToolUnreachable
from undolog.upstreams import signed_headers

_log = structlog.get_logger("undolog.mcp")

Capability = Literal["resources", "prompts"]  # what an upstream may serve besides tools
_Page = TypeVar(
    "_Page", ListToolsResult, ListResourcesResult, ListResourceTemplatesResult, ListPromptsResult
)
_Answer = TypeVar("_Answer", ReadResourceResult, GetPromptResult)

EFFECT_META_KEY = "undolog/effect_id"  # a recorded call's effect id, in the request's `_meta`
ORG_ENV = "UNDOLOG_ORG"  # a stdio upstream's org, in its process's environment
# An org id put into a command line or a path (`{org}`): no separators, no `..`.
_PLAIN_ORG = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}")


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


async def _all_pages(fetch: Callable[[str | None], Awaitable[_Page]]) -> list[_Page]:
    """Every page of a listing, following `nextCursor`."""
    pages: list[_Page] = []
    cursor: str | None = None
    while True:
        page = await fetch(cursor)
        pages.append(page)
        cursor = page.next_cursor
        if not cursor:
            return pages


# One listing of one upstream, all pages. The client's response cache is bypassed: the
# gateway's own clients decide what they cache.


async def _list_tools(client: Client) -> list[Tool]:
    pages = await _all_pages(lambda c: client.list_tools(cursor=c, cache_mode="bypass"))
    return [tool for page in pages for tool in page.tools]


async def _list_resources(client: Client) -> list[Resource]:
    pages = await _all_pages(lambda c: client.list_resources(cursor=c, cache_mode="bypass"))
    return [resource for page in pages for resource in page.resources]


async def _list_templates(client: Client) -> list[ResourceTemplate]:
    pages = await _all_pages(
        lambda c: client.list_resource_templates(cursor=c, cache_mode="bypass")
    )
    return [template for page in pages for template in page.resource_templates]


async def _list_prompts(client: Client) -> list[Prompt]:
    pages = await _all_pages(lambda c: client.list_prompts(cursor=c, cache_mode="bypass"))
    return [prompt for page in pages for prompt in page.prompts]


def _declares(capabilities: ServerCapabilities | None, capability: Capability) -> bool:
    if capabilities is None:
        return False
    declared = capabilities.resources if capability == "resources" else capabilities.prompts
    return declared is not None


@functools.lru_cache(maxsize=256)
def _template(uri_template: str) -> UriTemplate | None:
    try:
        return UriTemplate.parse(uri_template)
    except InvalidUriTemplate:
        return None  # it cannot route anything; the upstream still lists it


def _matches(uri_template: str, uri: str) -> bool:
    template = _template(uri_template)
    return template is not None and template.match(uri) is not None


def _unavailable(upstream: str, reason: str) -> MCPError:
    """A read or a prompt whose upstream cannot be reached: a JSON-RPC error that names it."""
    return MCPError(INTERNAL_ERROR, reason, {"upstream": upstream})


def _unstamped(result: _Answer) -> _Answer:
    """The upstream's answer without its `serverInfo` stamp: past the gateway, UndoLog answers."""
    meta = result.meta
    if not meta or SERVER_INFO_META_KEY not in meta:
        return result
    rest = {k: v for k, v in meta.items() if k != SERVER_INFO_META_KEY}
    return result.model_copy(update={"meta": rest or None})


def _signed_fields(request: httpx2.Request) -> tuple[str, str, bytes]:
    """What a request to an HTTP upstream is signed over besides the org, method and path:
    the tool (a `tools/call`'s tool name, else the JSON-RPC method, else `-`), the effect id a
    recorded call carries in `params._meta` (else `-`), and the body sent."""
    try:
        body = request.content
        message = orjson.loads(body) if body else None
    except (httpx2.RequestNotRead, orjson.JSONDecodeError):
        return "-", "-", b""
    if not isinstance(message, dict):
        return "-", "-", body
    params = message.get("params")
    params = params if isinstance(params, dict) else {}
    meta = params.get("_meta")
    effect = meta.get(EFFECT_META_KEY) if isinstance(meta, dict) else None
    method, name = message.get("method"), params.get("name")
    tool = name if method == "tools/call" and isinstance(name, str) else method
    tool = tool if isinstance(tool, str) and tool and "\n" not in tool else "-"
    return tool, effect if isinstance(effect, str) and effect else "-", body


def _signer(secret: str, org_id: str) -> Callable[[httpx2.Request], Awaitable[None]]:
    """A request hook signing every request to an HTTP upstream for `org_id`: after the
    configured `headers`, so a configured header cannot stand in for the org."""

    async def sign(request: httpx2.Request) -> None:
        tool, effect_id, body = _signed_fields(request)
        request.headers.update(
            signed_headers(
                secret,
                org_id=org_id,
                method=request.method,
                path=request.url.path,
                tool=tool,
                body=body,
                effect_id=effect_id,
            )
        )

    return sign


def _for_org(value: str, org_id: str) -> str:
    return value.replace(ORG_PLACEHOLDER, org_id)


def _stdio_params(upstream: McpUpstream, org_id: str) -> StdioServerParameters:
    """The org's process: `{org}` filled in, `UNDOLOG_ORG` set.

    Raises:
        ToolUnreachable: `{org}` is used and the org id is not plain enough for a command
            line or a path.
    """
    assert upstream.command is not None
    values = [*upstream.args, *(upstream.env or {}).values(), upstream.cwd or ""]
    if any(ORG_PLACEHOLDER in v for v in values) and not _PLAIN_ORG.fullmatch(org_id):
        raise ToolUnreachable(
            f"MCP upstream '{upstream.name}' puts the org in its command line or paths, and "
            "this org's id is not only letters, digits and _ . -"
        )
    env = {k: _for_org(v, org_id) for k, v in (upstream.env or {}).items()}
    return StdioServerParameters(
        command=upstream.command,
        args=[_for_org(a, org_id) for a in upstream.args],
        env={**env, ORG_ENV: org_id},
        cwd=_for_org(upstream.cwd, org_id) if upstream.cwd is not None else None,
    )


async def _open_client(
    upstream: McpUpstream,
    org_id: str,
    secret: str,
    stack: contextlib.AsyncExitStack,
    timeout_seconds: float,
) -> Client:
    """Enter a client for the upstream, on behalf of `org_id`, on `stack`."""
    if upstream.transport == "stdio":
        params = _stdio_params(upstream, org_id)
        return await stack.enter_async_context(Client(params, read_timeout_seconds=timeout_seconds))
    assert upstream.url is not None
    # The client does not close an HTTP client it was given: the stack does.
    http = await stack.enter_async_context(
        httpx2.AsyncClient(
            headers=dict(upstream.headers),
            timeout=timeout_seconds,
            event_hooks={"request": [_signer(secret, org_id)]},
        )
    )
    transport = streamable_http_client(upstream.url, http_client=http)
    return await stack.enter_async_context(Client(transport, read_timeout_seconds=timeout_seconds))


class _Link:
    """One upstream's connection for one org, held open by a task of its own.

    The client's transport runs background tasks; if the upstream goes away they fail, and
    that failure must end this task, not the proxy's lifespan. A lost link is opened again
    by the next call that needs it.
    """

    def __init__(
        self,
        upstream: McpUpstream,
        org_id: str,
        secret: str,
        timeout_seconds: float,
        retry_seconds: float,
    ) -> None:
        self.upstream = upstream
        self.org_id = org_id
        self._secret = secret
        self.timeout_seconds = timeout_seconds
        self.retry_seconds = retry_seconds
        self.client: Client | None = None
        self.error: str | None = None  # why the last connection failed, until one succeeds
        self.capabilities: ServerCapabilities | None = None  # as of the last connection
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
                raise ToolUnreachable(self.unavailable())
            ready: asyncio.Future[Client] = asyncio.get_running_loop().create_future()
            self._stop = asyncio.Event()
            name = f"mcp-{self.upstream.name}-{self.org_id}"
            self._task = asyncio.create_task(self._hold(ready), name=name)
            try:
                client = await ready
            except Exception as exc:
                self.error = _describe(exc)
                self._retry_at = time.monotonic() + self.retry_seconds
                # Name and transport only: `headers` and `env` may hold secrets.
                _log.warning(
                    "mcp_upstream_unreachable",
                    upstream=self.upstream.name,
                    org_id=self.org_id,
                    transport=self.upstream.transport,
                    error=self.error,
                    retry_seconds=self.retry_seconds,
                )
                raise ToolUnreachable(self.unavailable()) from None
            if self.error is not None:
                _log.info(
                    "mcp_upstream_reconnected", upstream=self.upstream.name, org_id=self.org_id
                )
            self.error = None
            self.capabilities = client.server_capabilities
            return client

    def unavailable(self) -> str:
        return (
            f"MCP upstream '{self.upstream.name}' is unavailable ({self.error}); UndoLog tries "
            f"it again at most every {self.retry_seconds:g}s"
        )

    async def _hold(self, ready: asyncio.Future[Client]) -> None:
        try:
            async with contextlib.AsyncExitStack() as stack:
                self.client = await _open_client(
                    self.upstream, self.org_id, self._secret, stack, self.timeout_seconds
                )
                ready.set_result(self.client)
                await self._stop.wait()
        except Exception as exc:
            if not ready.done():
                ready.set_exception(exc)
            else:
                _log.warning(
                    "mcp_upstream_lost",
                    upstream=self.upstream.name,
                    org_id=self.org_id,
                    error=_describe(exc),
                )
        finally:
            self.client = None
            if not ready.done():  # cancelled while connecting
                ready.set_exception(ToolUnreachable("the upstream connection was closed"))

    async def close(self) -> None:
        self._stop.set()
        task, self._task = self._task, None
        if task is not None:
            with contextlib.suppress(Exception, asyncio.CancelledError):
                await task
