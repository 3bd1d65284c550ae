"""`GET /ready`: readiness, as opposed to `/health`'s liveness.

`/health` answers as long as the process serves HTTP (the reference's liveness probe: restart
me if this fails). `/ready` also asks the store a trivial query (the schema version) within a
short timeout, and answers 503 `store_unavailable` when it does not answer: take this instance
out of the load balancer until the database is back. The database's own error text stays in
the log, never in the answer. Both are outside auth.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

import structlog
from fastapi import APIRouter, Request
from starlette.responses import Response

from undolog.proxy.wire import error_body, json_response

if TYPE_CHECKING:
    from undolog.services.runtime import Runtime

__all__ = ["STORE_UNAVAILABLE", "router"]

STORE_UNAVAILABLE = "store_unavailable"

router = APIRouter()


@router.get("/ready")
async def ready(request: Request) -> Response:
    """200 when the store answers within the ready timeout, else 503 `store_unavailable`."""
    runtime: Runtime = request.app.state.runtime
    timeout: float = request.app.state.ready_timeout_seconds
    try:
        await asyncio.wait_for(runtime.store.schema_version(), timeout)
    except Exception as exc:  # any failure means "not ready"; the reason goes to the log only
        structlog.get_logger("undolog.proxy").warning(
            "not_ready", reason=type(exc).__name__, detail=str(exc)[:200]
        )
        message = "the store does not answer; this instance is not ready"
        body = error_body(request.state.request_id, STORE_UNAVAILABLE, message)
        return json_response(body, 503)
    return json_response({"status": "ok", "service": "undolog-proxy", "store": "ok"})
