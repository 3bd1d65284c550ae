"""`GET /webhooks/deliveries`: the webhook outbox of the key's org, for operators (admin
keys only: the route is not in the permission table). Dead deliveries are found here with
`?state=dead` (docs/notifications.md)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fastapi import APIRouter, Request
from starlette.responses import Response

from undolog.proxy.wire import json_response
from undolog.services.webhooks import DeliveryState
from undolog.store.records import WebhookDeliveryRecord
from undolog_sdk.errors import InvalidRequest

if TYPE_CHECKING:
    from undolog.runtime import Runtime

__all__ = ["router"]

router = APIRouter()
DEFAULT_LIMIT = 100
MAX_LIMIT = 500
_STATES = tuple(s.value for s in DeliveryState)


def delivery_json(record: WebhookDeliveryRecord) -> dict[str, Any]:
    return {
        "delivery_id": record.delivery_id,
        "webhook": record.webhook,
        "event_id": f"evt_{record.event_id}",
        "state": record.state,
        "attempts": record.attempts,
        "next_attempt_us": record.next_attempt_us,
        "last_error": record.last_error,
        "created_us": record.created_us,
        "updated_us": record.updated_us,
    }


@router.get("/webhooks/deliveries")
async def list_deliveries(request: Request) -> Response:
    """The org's deliveries, newest first; `state` (pending, delivered, dead), `limit`."""
    runtime: Runtime = request.app.state.runtime
    state = request.query_params.get("state")
    if state is not None and state not in _STATES:
        raise InvalidRequest(f"invalid state {state!r}: one of {', '.join(_STATES)}")
    raw_limit = request.query_params.get("limit", str(DEFAULT_LIMIT))
    if not raw_limit.isdigit() or not 1 <= int(raw_limit) <= MAX_LIMIT:
        raise InvalidRequest(f"'limit' must be a number from 1 to {MAX_LIMIT}")
    async with runtime.store.reader() as q:
        rows = await q.list_webhook_deliveries(request.state.org_id, state, int(raw_limit))
    return json_response([delivery_json(r) for r in rows])
