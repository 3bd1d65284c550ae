"""What an MCP request carries besides its method: the proxy edge's state of its HTTP request
(org, key), the UndoLog session it belongs to, the caller's trace context, whether the client
can open a URL for a person, and whether it asks for a task (docs/mcp.md).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from mcp.server.context import ServerRequestContext
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from undolog.engine.model import ORG_WIDE, Actor
from undolog.services.tracing import TRACEPARENT, traceparent_of

__all__ = [
    "ANSWERS_KEY",
    "SESSION_HEADER",
    "SESSION_META_KEY",
    "WATCH_KEY",
    "actor_of",
    "approval_url",
    "asks_for_task",
    "can_open_urls",
    "request_state",
    "session_id_of",
    "traceparent_from",
]

SESSION_HEADER = "x-undolog-session-id"
SESSION_META_KEY = "undolog/session_id"

ANSWERS_KEY = "undolog_answers"  # scope state: the answers this request carries (Delivery)
WATCH_KEY = "undolog_watch"  # scope state: the request's AnswerWatch (is the client there?)


def request_state(ctx: ServerRequestContext[Any]) -> dict[str, Any]:
    """The proxy edge's state of the HTTP request behind an MCP request (org, key, request
    id)."""
    request = ctx.request
    state = getattr(request, "scope", {}).get("state", {}) if request is not None else {}
    return state if isinstance(state, dict) else {}


def actor_of(state: dict[str, Any]) -> Actor:
    """The caller's key as the engine checks it: an agent key uses its own sessions only."""
    principal = state.get("principal")  # set by the proxy's edge from the key
    return principal.actor if principal is not None else ORG_WIDE


def asks_for_task(ctx: ServerRequestContext[Any]) -> bool:
    """A 2025-11-25-era `tools/call` augmented with `task` (the tasks utility): answered with
    a task. The 2026-07-28 era has no tasks in its core, and ignores the field."""
    if ctx.method != "tools/call" or ctx.protocol_version in MODERN_PROTOCOL_VERSIONS:
        return False
    params = ctx.params
    return isinstance(params, Mapping) and params.get("task") is not None


def approval_url(template: str | None, approval_id: str, request: Any) -> str:
    """Where a person decides the approval: the configured `approval_url`, else the
    dashboard's pending approvals on the proxy the request came to."""
    if template is None:
        base = str(request.base_url).rstrip("/") if request is not None else ""
        return f"{base}/ui/#/approvals/pending"
    return template.replace("{approval_id}", approval_id)


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
