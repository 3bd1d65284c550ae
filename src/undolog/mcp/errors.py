"""The MCP front end's one mapping of what a handler raises (`undolog.proxy.errors` is
REST's), and the Origin check of its transport.
"""

from __future__ import annotations

import functools
import uuid
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar, cast
from urllib.parse import urlsplit

import structlog
from mcp import MCPError
from mcp.server.context import ServerRequestContext
from mcp_types import INTERNAL_ERROR

from undolog.logs import internal_error_message
from undolog.mcp.requests import request_state

__all__ = ["mapped", "same_origin"]

Handler = TypeVar("Handler", bound=Callable[..., Awaitable[Any]])


def same_origin(origin: str, host: str | None) -> bool:
    try:
        return host is not None and urlsplit(origin).netloc.lower() == host.lower()
    except ValueError:
        return False


def mapped(handler: Handler) -> Handler:
    """A handler method whose errors reach the client as the gateway means them: an
    `MCPError` as it is, anything else — a bug — as `-32603` with a fixed message and the
    request id; the traceback goes to the log, never the exception's text to the client (the
    handshake era's server would send `str(exc)`)."""

    @functools.wraps(handler)
    async def wrapper(self: Any, ctx: ServerRequestContext[Any], params: Any) -> Any:
        try:
            return await handler(self, ctx, params)
        except MCPError:
            raise
        except Exception as exc:
            request_id = str(request_state(ctx).get("request_id") or uuid.uuid4())
            structlog.get_logger("undolog.proxy").error(
                "unhandled_error", request_id=request_id, path="/mcp", exc_info=exc
            )
            raise MCPError(INTERNAL_ERROR, internal_error_message(request_id)) from None

    return cast(Handler, wrapper)
