"""Runs a tool on the upstream tool server (`POST {url}/tools/{name}`, answered with a
ToolResult `{"success", "output", "error"}`; docs/upstreams.md).

Uses aiohttp rather than httpx's pooled AsyncClient: on these machines httpx's pool collapses
under concurrency (measured when this was built), and this client is on the hot path.

Where a call goes is the operator's: a tool names a configured upstream (`undolog.upstreams`),
never a URL, and every call carries the org's signed header. What goes wrong on the way is
told to the caller in a fixed message per kind of failure — never the upstream's body nor the
transport's exception text, which would tell a tenant about hosts and ports it cannot see —
and logged in full for the operator.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import aiohttp
import orjson
import structlog
import yarl

from undolog.faults import crash_point
from undolog.logs import LazyLog
from undolog.services import tracing
from undolog.upstreams import UpstreamRegistry, signed_headers, tool_url

__all__ = [
    "ToolExecutor",
    "ToolOutcomeUnknown",
    "ToolResult",
    "ToolRouter",
    "ToolTransportError",
    "ToolUnreachable",
]

_log = structlog.get_logger("undolog.executor")
# Tool addresses kept built (`ToolExecutor._url`); past this many the cache starts over.
_MAX_URLS = 1024


class ToolTransportError(Exception):
    """The upstream could not be reached, timed out, or answered with no ToolResult."""


class ToolUnreachable(ToolTransportError):
    """The request provably never reached the tool (refused, name not resolved, nothing sent):
    the call did not run, so failing it and running it again on retry is safe."""


class ToolOutcomeUnknown(ToolTransportError):
    """The request may have reached the tool (a timeout, a connection lost after sending, an
    answer that is no ToolResult): it may have run. Only an idempotent tool may run again."""


@dataclass(frozen=True, slots=True)
class ToolResult:
    """The upstream's answer: `success` false with an HTTP error status is a logical failure."""

    success: bool
    output: Any
    error: str | None

    def to_json(self) -> str:
        return orjson.dumps(
            {"success": self.success, "output": self.output, "error": self.error}
        ).decode()


def _parse_tool_result(body: bytes) -> ToolResult | None:
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(data, dict) or not isinstance(data.get("success"), bool):
        return None
    error = data.get("error")
    if error is not None and not isinstance(error, str):
        error = str(error)
    return ToolResult(data["success"], data.get("output"), error)


class ToolRouter(Protocol):
    """Runs the tools it `handles` somewhere else than the HTTP tool server (MCP upstreams)."""

    def handles(self, tool_name: str) -> bool: ...

    async def call(
        self, tool_name: str, args: Any, *, org_id: str, effect_id: str, idempotency_key: str
    ) -> ToolResult: ...


class ToolExecutor:
    """A pooled client to upstream tool servers. Open it inside a running event loop.

    `routers` are asked first: a tool one of them handles is run by it (the MCP gateway's
    upstreams), everything else is POSTed to the tool server.
    """

    def __init__(self, upstreams: UpstreamRegistry, *, timeout_seconds: float = 30.0) -> None:
        self.upstreams = upstreams
        self.timeout = aiohttp.ClientTimeout(total=timeout_seconds)
        self._session: aiohttp.ClientSession | None = None
        self.routers: list[ToolRouter] = []
        self._urls: dict[tuple[str, str], yarl.URL] = {}

    def _url(self, base_url: str, tool_name: str) -> yarl.URL:
        """The tool's address on an upstream, built once per (upstream URL, tool)."""
        key = (base_url, tool_name)
        url = self._urls.get(key)
        if url is None:
            if len(self._urls) >= _MAX_URLS:  # bounded: tools come and go at runtime
                self._urls.clear()
            # encoded=True: sent as built, the name's percent-encoding kept as it is.
            url = self._urls[key] = yarl.URL(tool_url(base_url, tool_name), encoded=True)
        return url

    async def open(self) -> None:
        connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=30, ttl_dns_cache=300)
        self._session = aiohttp.ClientSession(
            connector=connector,
            timeout=self.timeout,
            json_serialize=lambda o: orjson.dumps(o).decode(),
            # One client serves every org: a cookie an upstream sets on one org's call must
            # never travel with the next call, whoever makes it. No jar, no cookies.
            cookie_jar=aiohttp.DummyCookieJar(),
        )

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def call(
        self,
        tool_name: str,
        args: Any,
        *,
        org_id: str,
        session_id: str | None,
        effect_id: str,
        request_id: str,
        upstream: str | None = None,
        idempotency_key: str | None = None,
    ) -> ToolResult:
        """POST the call to the upstream named `upstream` (None: `default`), signed for `org_id`.

        The `Idempotency-Key` is the effect id unless given.

        Raises:
            ToolTransportError: an upstream the org may not use (nothing is sent), refused
                connection, timeout, or a body that is no ToolResult.
        """
        for router in self.routers:
            if router.handles(tool_name):
                return await router.call(
                    tool_name,
                    args,
                    org_id=org_id,
                    effect_id=effect_id,
                    idempotency_key=idempotency_key or effect_id,
                )
        if self._session is None:
            raise ToolUnreachable("executor is not open")
        target = self.upstreams.for_org(upstream, org_id)
        if target is None:
            # Configuration changed since the tool was registered: refuse, send nothing.
            _log.warning("upstream_not_usable", upstream=upstream, org_id=org_id, tool=tool_name)
            raise ToolUnreachable(f"upstream for '{tool_name}' is not configured for this org")
        body = orjson.dumps({"args": args, "session_id": session_id, "effect_id": effect_id})
        url = self._url(target.url, tool_name)
        headers = {
            "Content-Type": "application/json",
            "Idempotency-Key": idempotency_key or effect_id,
            "X-Request-Id": request_id,
            # Bound to this method, path, tool, body, org and effect (undolog_sdk.upstream).
            **signed_headers(
                target.secret, org_id=org_id, method="POST", path=url.raw_path,
                tool=tool_name, body=body, effect_id=effect_id,
            ),
        }  # fmt: skip
        tracing.inject(headers)  # the current span's traceparent (services/tracing.py)
        log = LazyLog(_log, {"upstream": target.name, "tool": tool_name, "effect_id": effect_id})
        try:
            async with self._session.post(
                url,
                data=body,
                headers=headers,
                allow_redirects=False,
            ) as response:
                crash_point("during_upstream")
                raw = await response.read()
                status = response.status
        except (aiohttp.ClientConnectorError, aiohttp.ConnectionTimeoutError):
            # No connection was made: nothing was sent (refused, DNS, connect timeout).
            raise ToolUnreachable(f"upstream unreachable calling '{tool_name}'") from None
        except TimeoutError:
            log.warning("upstream_timeout", timeout_seconds=self.timeout.total)
            raise ToolOutcomeUnknown(
                f"upstream timed out after {self.timeout.total}s calling '{tool_name}'"
            ) from None
        except aiohttp.ClientError as exc:
            # Connected, and the request may have been sent: the tool may have run.
            log.warning("upstream_connection_lost", error=repr(exc))
            raise ToolOutcomeUnknown(f"upstream connection lost calling '{tool_name}'") from None
        result = _parse_tool_result(raw)
        if result is None:
            log.warning("upstream_bad_answer", status=status, bytes=len(raw))
            raise ToolOutcomeUnknown(f"upstream gave no valid ToolResult calling '{tool_name}'")
        return result
