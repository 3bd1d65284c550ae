"""`GET /ready`: readiness, as opposed to `/health`'s liveness.

`/health` answers as long as the process serves HTTP (the reference's liveness probe: restart
me if this fails). `/ready` also asks the store whether it takes writes (`Store.writable`)
within a short timeout, and answers 503 `store_unavailable` when it does not answer, or answers
but takes no writes (a PostgreSQL standby while no primary is reachable, a read-only database):
take this instance out of the load balancer until a writable database is back. It also writes
and fsyncs a probe file in the spool's folder, and answers 503 `spool_unwritable` when it
cannot: a result held during a store outage would then not be durable
(`undolog.services.held`). The database's own error text stays in the log, never in the
answer. Both are outside auth.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

import structlog
from fastapi import APIRouter, Request
from starlette.responses import Response

from undolog.proxy.wire import error_body, json_response

if TYPE_CHECKING:
    from undolog.runtime import Runtime

__all__ = ["SPOOL_UNWRITABLE", "STORE_UNAVAILABLE", "router"]

STORE_UNAVAILABLE = "store_unavailable"
SPOOL_UNWRITABLE = "spool_unwritable"

router = APIRouter()


@router.get("/ready")
async def ready(request: Request) -> Response:
    """200 when the store takes writes within the ready timeout, else 503 `store_unavailable`."""
    runtime: Runtime = request.app.state.runtime
    timeout: float = request.app.state.ready_timeout_seconds
    try:
        writable = await asyncio.wait_for(runtime.store.writable(), timeout)
    except Exception as exc:  # any failure means "not ready"; the reason goes to the log only
        structlog.get_logger("undolog.proxy").warning(
            "not_ready", reason=type(exc).__name__, detail=str(exc)[:200]
        )
        message = "the store does not answer; this instance is not ready"
        body = error_body(request.state.request_id, STORE_UNAVAILABLE, message)
        return json_response(body, 503)
    if not await runtime.held.writable():
        structlog.get_logger("undolog.proxy").warning(
            "not_ready", reason=SPOOL_UNWRITABLE, spool=str(runtime.held.path.parent)
        )
        message = (
            "the spool cannot be written: a result held while the store is away would not be "
            "durable; this instance is not ready"
        )
        body = error_body(request.state.request_id, SPOOL_UNWRITABLE, message)
        return json_response(body, 503)
    if not writable:  # after the spool: this instance's own fault is the one to name
        structlog.get_logger("undolog.proxy").warning("not_ready", reason="store_read_only")
        message = "the store answers but takes no writes; this instance is not ready"
        body = error_body(request.state.request_id, STORE_UNAVAILABLE, message)
        return json_response(body, 503)
    return json_response({"status": "ok", "service": "undolog-proxy", "store": "ok"})
