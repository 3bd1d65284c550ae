"""Runs a tool on the upstream tool server (DESIGN.md, "Upstream tool server protocol").

Uses aiohttp rather than httpx's pooled AsyncClient: on these machines httpx's pool collapses
under concurrency (DESIGN.md, measured facts), and this client is on the hot path.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import aiohttp
import orjson

from undolog.faults import crash_point

__all__ = ["ToolExecutor", "ToolResult", "ToolRouter", "ToolTransportError"]


class ToolTransportError(Exception):
    """The upstream could not be reached, timed out, or answered with no ToolResult."""


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

    async def call(self, tool_name: str, args: Any, *, idempotency_key: str) -> ToolResult: ...


class ToolExecutor:
    """A pooled client to upstream tool servers. Open it inside a running event loop.

    `routers` are asked first: a tool one of them handles is run by it (the MCP gateway's
    upstreams), everything else is POSTed to the tool server.
    """

    def __init__(self, default_upstream: str, *, timeout_seconds: float = 30.0) -> None:
        self.default_upstream = default_upstream.rstrip("/")
        self.timeout = aiohttp.ClientTimeout(total=timeout_seconds)
        self._session: aiohttp.ClientSession | None = None
        self.routers: list[ToolRouter] = []

    async def open(self) -> None:
        connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=30, ttl_dns_cache=300)
        self._session = aiohttp.ClientSession(
            connector=connector,
            timeout=self.timeout,
            json_serialize=lambda o: orjson.dumps(o).decode(),
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
        session_id: str | None,
        effect_id: str,
        request_id: str,
        upstream_url: str | None = None,
        idempotency_key: str | None = None,
    ) -> ToolResult:
        """POST the call upstream; the `Idempotency-Key` is the effect id unless given.

        Raises:
            ToolTransportError: refused connection, timeout, or a body that is no ToolResult.
        """
        for router in self.routers:
            if router.handles(tool_name):
                return await router.call(
                    tool_name, args, idempotency_key=idempotency_key or effect_id
                )
        if self._session is None:
            raise ToolTransportError("executor is not open")
        base = (upstream_url or self.default_upstream).rstrip("/")
        body = orjson.dumps({"args": args, "session_id": session_id, "effect_id": effect_id})
        headers = {
            "Content-Type": "application/json",
            "Idempotency-Key": idempotency_key or effect_id,
            "X-Request-Id": request_id,
        }
        try:
            async with self._session.post(
                f"{base}/tools/{tool_name}", data=body, headers=headers
            ) as response:
                crash_point("during_upstream")
                raw = await response.read()
                status = response.status
        except TimeoutError:
            raise ToolTransportError(
                f"upstream timed out after {self.timeout.total}s calling '{tool_name}'"
            ) from None
        except aiohttp.ClientError as exc:
            raise ToolTransportError(f"upstream unreachable calling '{tool_name}': {exc}") from None
        result = _parse_tool_result(raw)
        if result is None:
            snippet = raw[:200].decode("utf-8", "replace")
            raise ToolTransportError(
                f"upstream answered HTTP {status} without a ToolResult body: {snippet!r}"
            )
        return result
