"""`GET /overview`: the org's counts at a glance, for the dashboard's first page.

Calls are the effect-log rows; replays are `effect_replayed` events (a replay writes no
row of its own). A session *needs attention* when its rollback gave up
(`compensation_failed`) or when one of its calls is `in_doubt`: both wait for an operator.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from fastapi import APIRouter, Request
from starlette.responses import Response

from undolog.proxy.wire import json_response
from undolog_sdk.wire import ApprovalStatus, EffectState, EventType, SessionState

if TYPE_CHECKING:
    from undolog.runtime import Runtime

__all__ = ["router"]

router = APIRouter()


@router.get("/overview")
async def overview(request: Request) -> Response:
    """Counts of calls, replays, approvals and sessions of the caller's org."""
    runtime: Runtime = request.app.state.runtime
    org_id: str = request.state.org_id
    async with runtime.store.reader() as q:
        effects = await q.count_by_state(org_id, "effects")
        sessions = await q.count_by_state(org_id, "sessions")
        approvals = await q.count_by_state(org_id, "approvals")
        replays = await q.count_events(org_id, EventType.EFFECT_REPLAYED)
    in_doubt = effects.get(EffectState.IN_DOUBT, 0)
    return json_response(
        {
            "calls": sum(effects.values()),
            "replays": replays,
            "pending_approvals": approvals.get(ApprovalStatus.PENDING, 0),
            "sessions": sum(sessions.values()),
            "sessions_compensating": sessions.get(SessionState.COMPENSATING, 0),
            "sessions_needing_attention": sessions.get(SessionState.COMPENSATION_FAILED, 0),
            "effects_in_doubt": in_doubt,
            "effects_by_state": effects,
            "sessions_by_state": sessions,
            "approvals_by_status": approvals,
        }
    )
