"""`GET /events`: the live event stream (SSE), resumable with `Last-Event-ID`.

The process's `EventBroker` (`undolog.services.events`) feeds each stream; a client that
resumes from an id the broker handed out misses nothing.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

import orjson
from fastapi import APIRouter, Request
from sse_starlette.event import ServerSentEvent
from sse_starlette.sse import EventSourceResponse
from starlette.responses import Response

from undolog.engine.keys import Role
from undolog.engine.pages import Pages
from undolog.proxy import pages
from undolog.proxy.inputs import event_id
from undolog.proxy.owners import EventFilter, Owned, actor, hide_unowned
from undolog.proxy.wire import error_body, iso, json_response
from undolog.services.events import REPLAY_PAGE
from undolog.services.quotas import STREAM_RETRY_AFTER_SECONDS
from undolog.store import EventRecord

if TYPE_CHECKING:
    from undolog.runtime import Runtime

__all__ = ["event_data", "event_fields", "router"]

PING_SECONDS = 25
RECENT_DEFAULT, RECENT_MAX = 50, 500


def event_fields(event: EventRecord) -> dict[str, Any]:
    """An event's fields as the REST reference shows them in `data:`."""
    return {
        "type": event.type,
        "timestamp": iso(event.created_us),
        "org_id": event.org_id,
        "session_id": event.session_id,
        "effect_id": event.effect_id,
        "payload": orjson.loads(event.payload_json),
    }


def event_data(event: EventRecord) -> str:
    """The `data:` line of an event, as the REST reference shows it."""
    return orjson.dumps(event_fields(event)).decode()


router = APIRouter()


def _sse(event: EventRecord) -> bytes:
    """An event laid out as the REST reference shows it: `event:`, `id:`, `data:`."""
    return f"event: {event.type}\nid: {event.event_id}\ndata: {event_data(event)}\n\n".encode()


def _resume_from(request: Request) -> int | None:
    """The id to resume after; raises `InvalidRequest` for anything that is no event id."""
    return event_id(
        request.headers.get("last-event-id") or request.query_params.get("last_event_id")
    )


@router.get("/events/recent")
async def recent_events(request: Request) -> Response:
    """The latest events from history, newest first (`limit`, 1 to 500, default 50;
    `session_id`: one session's), as the stream shows them plus their `id`: a page loads
    them, then follows `GET /events` from the newest id (docs/dashboard.md)."""
    runtime: Runtime = request.app.state.runtime
    params = request.query_params
    limit = pages.number(params, "limit", RECENT_DEFAULT, 1, RECENT_MAX)
    session_id = pages.text(params, "session_id")
    if session_id is not None:
        await hide_unowned(request, Owned.SESSION, session_id)
    found = await Pages(runtime.store).recent_events(
        request.state.org_id, limit, actor=actor(request), session_id=session_id
    )
    body = [{"id": str(e.event_id), **event_fields(e)} for e in found]
    return json_response(body)


@router.get("/events")
async def events(request: Request) -> Response:
    """Server-Sent Events for the caller's org: replay after `Last-Event-ID` (header, or the
    `last_event_id` query parameter for browsers), then live; `: ping` every 25 s."""
    runtime: Runtime = request.app.state.runtime
    org_id: str = request.state.org_id
    broker = runtime.broker
    after = _resume_from(request)
    await broker.catch_up()
    # Raises `QuotaExceeded` (429 rate_limited) past the key's streams (services/quotas.py).
    sub = broker.subscribe(
        org_id, request.state.key_id, agent=request.state.role == Role.AGENT.value
    )
    if sub is None:
        retry = STREAM_RETRY_AFTER_SECONDS
        return json_response(
            error_body(
                request.state.request_id,
                "too_many_subscribers",
                f"this organisation already has {broker.max_per_org} event streams open",
                retry_after=retry,
            ),
            429,
            {"Retry-After": str(retry)},
        )
    upto = broker.hwm  # the replay goes to here; the queue has everything after it
    seen_by = EventFilter(runtime.store, org_id, actor(request))  # an agent: its sessions'

    async def stream() -> AsyncIterator[bytes]:
        try:
            # A client may resume from an id this process has not reached yet (it saw it
            # through another process): what it saw must not come again from the queue.
            last = upto if after is None else max(upto, after)
            if after is not None:
                cursor = after
                while cursor < upto:
                    async with runtime.store.reader() as q:
                        page = await q.list_events(org_id, cursor, REPLAY_PAGE)
                    page = [e for e in page if e.event_id <= upto]
                    if not page:
                        break
                    for event in page:
                        if await seen_by.delivers(event):
                            yield _sse(event)
                    cursor = page[-1].event_id
            while True:
                event = await sub.queue.get()
                if event.event_id <= last:
                    continue
                last = event.event_id
                if await seen_by.delivers(event):
                    yield _sse(event)
        finally:
            broker.unsubscribe(sub)

    return EventSourceResponse(
        stream(),
        ping=PING_SECONDS,
        sep="\n",
        ping_message_factory=lambda: ServerSentEvent(comment="ping", sep="\n"),
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )
