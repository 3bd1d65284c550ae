"""What an MCP request carries besides its method: the UndoLog session it belongs to, the
caller's trace context, and whether the client can open a URL for a person (docs/mcp.md).
"""

from __future__ import annotations

from typing import Any

from mcp.server.context import ServerRequestContext
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from undolog.services.tracing import TRACEPARENT, traceparent_of

__all__ = [
    "SESSION_HEADER",
    "SESSION_META_KEY",
    "can_open_urls",
    "session_id_of",
    "traceparent_from",
]

SESSION_HEADER = "x-undolog-session-id"
SESSION_META_KEY = "undolog/session_id"


def can_open_urls(ctx: ServerRequestContext[Any]) -> bool:
    """A 2026-07-28 client that declared URL-mode elicitation (`input_required` can reach it)."""
    if ctx.protocol_version not in MODERN_PROTOCOL_VERSIONS:
        return False
    capabilities = ctx.session.client_capabilities
    elicitation = capabilities.elicitation if capabilities is not None else None
    return elicitation is not None and elicitation.url is not None


def traceparent_from(ctx: ServerRequestContext[Any], request: Any) -> str | None:
    """The caller's W3C trace context: the HTTP header, else `_meta["traceparent"]`."""
    value = request.headers.get(TRACEPARENT) if request is not None else None
    if not value:
        meta = ctx.meta or {}
        value = meta.get(TRACEPARENT) if isinstance(meta, dict) else None
    return traceparent_of(value)


def session_id_of(ctx: ServerRequestContext[Any], request: Any) -> str | None:
    """The UndoLog session: the HTTP header, else `_meta["undolog/session_id"]`."""
    value = request.headers.get(SESSION_HEADER) if request is not None else None
    if not value:
        meta = ctx.meta or {}
        value = meta.get(SESSION_META_KEY) if isinstance(meta, dict) else None
    return value if isinstance(value, str) and value else None
