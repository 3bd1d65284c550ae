"""Rollback over HTTP: the proxy as a compensation runner, and the undo-entry routes.

`POST /sessions/{id}/rollback` moves the session to `compensating` and runs, newest first,
every entry whose compensation lives on the tool server (entries of proxy-executed calls),
each with up to `max_retries` retries `retry_backoff_ms` apart. It stops when the stack is
done, when an entry gives up (`502 compensation_failed`), or when the top entry belongs to the
SDK (`waiting_for_runner`: the SDK claims it with `POST /undo/{entry}/claim`, runs it, reports
with `/complete` or `/fail`, and calls rollback again).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import orjson
from fastapi import APIRouter, Request
from starlette.responses import Response

from undolog.engine.saga import Claim, RollbackStatus
from undolog.faults import crash_point
from undolog.proxy.executor import ToolTransportError
from undolog.proxy.wire import error_body, error_response, json_response, undo_entry_json
from undolog.store.records import UndoEntryRecord
from undolog_sdk.errors import (
    CompensationFailed,
    EffectInDoubt,
    EmptyUndoStack,
    InProgress,
    InvalidRequest,
    UndoLogError,
)

if TYPE_CHECKING:
    from undolog.proxy.app import Runtime

__all__ = ["router", "run_rollback"]

router = APIRouter()


async def _run_claim(runtime: Runtime, claim: Claim, request_id: str) -> str | None:
    """Run one claimed compensation with its retries; None on success, else the last error."""
    entry = claim.entry
    backoff = entry.retry_backoff_ms / 1000
    for attempt in range(max(1, claim.attempts_left)):
        if attempt:
            await asyncio.sleep(backoff)
        try:
            result = await runtime.executor.call(
                entry.fn_name,
                claim.payload,
                session_id=entry.session_id,
                effect_id=entry.effect_id,
                request_id=request_id,
                idempotency_key=entry.entry_id,
            )
            error = None if result.success else (result.error or "compensation reported failure")
        except ToolTransportError as exc:
            error = str(exc)
        crash_point("mid_rollback")
        if error is None:
            await runtime.saga.complete(entry.org_id, entry.entry_id)
            return None
        try:
            await runtime.saga.fail_attempt(entry.org_id, entry.entry_id, error)
        except CompensationFailed:
            return error
    return error  # pragma: no cover - fail_attempt raises on the last attempt


async def run_rollback(
    runtime: Runtime, org_id: str, session_id: str, request_id: str
) -> tuple[RollbackStatus, str | None]:
    """Unwind as far as this runner can; returns where the rollback stands."""
    await runtime.saga.begin(org_id, session_id)
    while True:
        claimed = await runtime.saga.claim(org_id, session_id, "proxy")
        if isinstance(claimed, RollbackStatus):
            return claimed, None
        error = await _run_claim(runtime, claimed, request_id)
        if error is not None:
            return RollbackStatus.COMPENSATION_FAILED, error


async def _rollback_body(runtime: Runtime, org_id: str, session_id: str) -> dict[str, Any]:
    view = await runtime.engine.session_view(org_id, session_id)
    stack = [undo_entry_json(e) for e in view.undo_entries]
    pending = next(
        (e for e in stack if e["state"] not in ("compensated", "skipped", "resolved")), None
    )
    return {
        "session_id": session_id,
        "state": view.session.state,
        "undo_stack": stack,
        "next_entry": pending,
    }


@router.post("/sessions/{id}/rollback")
async def rollback_session(id: str, request: Request) -> Response:
    runtime: Runtime = request.app.state.runtime
    org_id: str = request.state.org_id
    request_id: str = request.state.request_id
    try:
        status, error = await run_rollback(runtime, org_id, id, request_id)
        body = await _rollback_body(runtime, org_id, id)
    except UndoLogError as exc:
        return error_response(request_id, exc)
    body["outcome"] = status.value
    if status is RollbackStatus.EMPTY:
        info = EmptyUndoStack(id)
        body.update(code=info.code, message=info.message)
    if status is RollbackStatus.COMPENSATION_FAILED:
        failed = next((e for e in body["undo_stack"] if e["state"] == "failed"), None)
        gave_up = CompensationFailed(
            failed["fn_name"] if failed else "?",
            failed["max_retries"] if failed else 0,
            error or (failed["last_error"] if failed else "unknown"),
        )
        body.update(gave_up.fields())
        return json_response(
            error_body(request_id, gave_up.code, gave_up.message, **body), gave_up.http_status
        )
    if status is RollbackStatus.BUSY:
        # No entry is named: the other runner may have finished it since we looked.
        return json_response(
            error_body(request_id, InProgress.code, "another runner is compensating this session",
                       retry_after=runtime.retry_after_seconds, **body),
            409, {"Retry-After": str(runtime.retry_after_seconds)},
        )  # fmt: skip
    if status is RollbackStatus.BLOCKED:
        blocked = EffectInDoubt(body["next_entry"]["effect_id"])
        return json_response(
            error_body(request_id, blocked.code, blocked.message, **body), blocked.http_status
        )
    return json_response(body)


@router.post("/sessions/{id}/complete")
async def complete_session(id: str, request: Request) -> Response:
    runtime: Runtime = request.app.state.runtime
    try:
        session = await runtime.saga.complete_session(request.state.org_id, id)
    except UndoLogError as exc:
        return error_response(request.state.request_id, exc)
    return json_response({"session_id": session.session_id, "state": session.state})


async def _note(request: Request, field: str, *, required: bool) -> str | None:
    body = await request.body()
    if not body.strip():
        if required:
            raise InvalidRequest(f"a JSON body with '{field}' is required")
        return None
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise InvalidRequest(f"invalid JSON body: {exc}") from None
    value = data.get(field) if isinstance(data, dict) else None
    if (value is None and required) or (value is not None and not isinstance(value, str)):
        raise InvalidRequest(f"'{field}' must be a string")
    return value


@router.post("/undo/{entry}/claim")
async def claim_entry(entry: str, request: Request) -> Response:
    """The SDK claims the entry it was handed; the answer carries what to call it with."""
    runtime: Runtime = request.app.state.runtime
    try:
        claim = await runtime.saga.claim_entry(request.state.org_id, entry, "sdk")
    except UndoLogError as exc:
        return error_response(request.state.request_id, exc)
    body = undo_entry_json(claim.entry)
    body["payload"] = claim.payload
    body["attempts_left"] = claim.attempts_left
    return json_response(body)


async def _entry_answer(
    request: Request, action: Callable[[Runtime, str], Awaitable[UndoEntryRecord]]
) -> Response:
    """Run one undo-entry operation for the caller's org; the entry, or the error body."""
    runtime: Runtime = request.app.state.runtime
    try:
        entry = await action(runtime, request.state.org_id)
    except UndoLogError as exc:
        return error_response(request.state.request_id, exc)
    return json_response(undo_entry_json(entry))


@router.post("/undo/{entry}/complete")
async def complete_entry(entry: str, request: Request) -> Response:
    return await _entry_answer(request, lambda rt, org: rt.saga.complete(org, entry))


@router.post("/undo/{entry}/fail")
async def fail_entry(entry: str, request: Request) -> Response:
    """One failed attempt (`{"error": "..."}`); the last one escalates (502)."""

    async def fail(runtime: Runtime, org_id: str) -> UndoEntryRecord:
        error = await _note(request, "error", required=True)
        return await runtime.saga.fail_attempt(org_id, entry, error or "")

    return await _entry_answer(request, fail)


@router.post("/undo/{entry}/retry")
async def retry_entry(entry: str, request: Request) -> Response:
    return await _entry_answer(request, lambda rt, org: rt.saga.retry(org, entry))


@router.post("/undo/{entry}/resolve")
async def resolve_entry(entry: str, request: Request) -> Response:
    """An operator marks a failed entry handled by hand: `{"note": "..."}`."""

    async def resolve(runtime: Runtime, org_id: str) -> UndoEntryRecord:
        note = await _note(request, "note", required=True)
        return await runtime.saga.resolve(org_id, entry, note or "")

    return await _entry_answer(request, resolve)
