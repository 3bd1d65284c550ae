"""Rollback over HTTP, and the undo-entry routes.

`POST /sessions/{id}/rollback` drives the rollback (`undolog.services.rollback.run_rollback`):
newest first, every entry whose compensation lives on the tool server, until the stack is
done, an entry gives up (`502 compensation_failed`), or the top entry belongs to the SDK
(`waiting_for_runner`: the SDK claims it with `POST /undo/{entry}/claim`, runs it, reports
with `/complete` or `/fail` carrying the claim's `claim_token`, and calls rollback again).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import orjson
from fastapi import APIRouter, Request
from starlette.responses import Response

from undolog.engine.saga import RollbackStatus
from undolog.engine.selective import Selection
from undolog.proxy.inputs import scrubbed, storable
from undolog.proxy.owners import Owned, hide_unowned
from undolog.proxy.wire import error_body, json_response, undo_entry_json
from undolog.services.rollback import run_rollback, run_selective_undo
from undolog.services.tracing import TRACEPARENT, traceparent_of
from undolog.store.records import EffectRecord, UndoEntryRecord
from undolog_sdk.errors import (
    CompensationFailed,
    EffectInDoubt,
    EmptyUndoStack,
    InProgress,
    InvalidRequest,
)
from undolog_sdk.wire import EffectState, ExecutionMode, UndoState

_MAX_ID = 200  # characters of an entry id in a selective undo's body
# Entries that no longer block the unwinding.
_SETTLED = frozenset({UndoState.COMPENSATED, UndoState.SKIPPED, UndoState.RESOLVED})

if TYPE_CHECKING:
    from undolog.runtime import Runtime

__all__ = ["router"]

router = APIRouter()


async def _rollback_body(
    runtime: Runtime, org_id: str, session_id: str, only: Selection | None = None
) -> dict[str, Any]:
    view = await runtime.engine.session_view(org_id, session_id)
    stack = [undo_entry_json(e) for e in view.undo_entries]
    chosen = [e for e in stack if only is None or e["entry_id"] in only.entry_ids]
    pending = next((e for e in chosen if e["state"] not in _SETTLED), None)
    # The calls that stop the unwinding: in doubt (or still running) under an open entry.
    open_effects = {e["effect_id"] for e in chosen if e["state"] not in _SETTLED}
    unsettled = [
        {"effect_id": e.effect_id, "tool_name": e.tool_name, "state": e.state}
        for e in view.effects
        if e.effect_id in open_effects and e.state in (EffectState.IN_DOUBT, EffectState.EXECUTING)
    ]
    body: dict[str, Any] = {
        "session_id": session_id,
        "state": view.session.state,
        "undo_stack": stack,
        "next_entry": pending,
        "in_doubt_effects": unsettled,
    }
    if only is not None:  # a selective undo: what it chose, and what it was warned about
        body["selected"] = [e["entry_id"] for e in chosen]
        body["dependents"] = [_effect_brief(e) for e in only.dependents]
    return body


def _effect_brief(effect: EffectRecord) -> dict[str, Any]:
    return {"effect_id": effect.effect_id, "step_index": effect.step_index,
            "tool_name": effect.tool_name, "state": effect.state}  # fmt: skip


_MAX_STEP = 2**32 - 1  # a step index is 32 bits, as a tool call's (docs/undo.md)


def _selection(data: dict[str, Any]) -> tuple[list[str] | None, int | None, bool]:
    """A selective undo's body: `entries` (undo entry ids) or `after_step`, and `force`."""
    unknown = set(data) - {"entries", "after_step", "force"}
    if unknown:
        raise InvalidRequest(f"unknown field '{sorted(unknown)[0]}'")
    if ("entries" in data) == ("after_step" in data):
        raise InvalidRequest("name either 'entries' or 'after_step'")
    entries, after_step, force = data.get("entries"), data.get("after_step"), data.get("force")
    if "entries" in data and not (
        isinstance(entries, list)
        and all(isinstance(e, str) and 0 < len(e) <= _MAX_ID for e in entries)
    ):
        raise InvalidRequest("'entries' must be a list of undo entry ids")
    if "after_step" in data and (
        isinstance(after_step, bool)
        or not isinstance(after_step, int)
        or not 0 <= after_step <= _MAX_STEP
    ):
        raise InvalidRequest("'after_step' must be a step index (an integer, 0 to 2**32 - 1)")
    if "force" in data and not isinstance(force, bool):
        raise InvalidRequest("'force' must be true or false")
    return entries, after_step, bool(force)


@router.post("/sessions/{id}/rollback")
async def rollback_session(id: str, request: Request) -> Response:
    """No body: roll the whole session back. `{"entries": [...]}` or `{"after_step": N}`
    (with `"force": true` past dependents): a selective undo that leaves the session open
    (docs/undo.md)."""
    runtime: Runtime = request.app.state.runtime
    org_id: str = request.state.org_id
    request_id: str = request.state.request_id
    await hide_unowned(request, Owned.SESSION, id)
    data = await _body(request, False)
    by = request.state.principal.decider  # recorded as who asked (docs/undo.md)
    selection: Selection | None = None
    if data:
        entries, after_step, force = _selection(data)
        status, error, selection = await run_selective_undo(
            runtime, org_id, id, request_id,
            entries=entries, after_step=after_step, force=force, by=by,
        )  # fmt: skip
    else:
        traceparent = traceparent_of(request.headers.get(TRACEPARENT))
        status, error = await run_rollback(runtime, org_id, id, request_id, traceparent, by)
    body = await _rollback_body(runtime, org_id, id, selection)
    body["outcome"] = status.value
    if status is RollbackStatus.EMPTY:
        info = EmptyUndoStack(id)
        body.update(code=info.code, message=info.message)
    if status is RollbackStatus.COMPENSATION_FAILED:
        failed = next((e for e in body["undo_stack"] if e["state"] == UndoState.FAILED), None)
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
        # `in_doubt_effects` names them: an operator resolves each (`/effects/{id}/resolve`)
        # and runs the rollback again.
        blocked = EffectInDoubt(body["next_entry"]["effect_id"])
        return json_response(
            error_body(request_id, blocked.code, blocked.message, **body), blocked.http_status
        )
    return json_response(body)


@router.post("/sessions/{id}/complete")
async def complete_session(id: str, request: Request) -> Response:
    runtime: Runtime = request.app.state.runtime
    await hide_unowned(request, Owned.SESSION, id)
    session = await runtime.saga.complete_session(request.state.org_id, id)
    return json_response({"session_id": session.session_id, "state": session.state})


async def _body(request: Request, required: bool) -> dict[str, Any]:
    """The JSON object body (empty when none was sent and none is required)."""
    body = await request.body()
    if not body.strip():
        if required:
            raise InvalidRequest("a JSON object body is required")
        return {}
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise InvalidRequest(f"invalid JSON body: {exc}") from None
    if not isinstance(data, dict):
        raise InvalidRequest("the body must be a JSON object")
    return data


def _text(data: dict[str, Any], field: str) -> str:
    value = data.get(field)
    if not isinstance(value, str):
        raise InvalidRequest(f"'{field}' must be a string")
    return value


async def _note(request: Request) -> str:
    """The operator's `{"note": "..."}`: refused if no store can hold it."""
    return storable(_text(await _body(request, True), "note"), "'note'")


async def _claim_token(request: Request) -> tuple[str, dict[str, Any]]:
    """The `claim_token` a report must carry (from `POST /undo/{entry}/claim`), and the body."""
    data = await _body(request, True)
    token = data.get("claim_token")
    if not isinstance(token, str) or not token:
        raise InvalidRequest(
            "'claim_token' is required: send the token that POST /undo/{entry}/claim returned"
        )
    return token, data


@router.post("/undo/{entry}/claim")
async def claim_entry(entry: str, request: Request) -> Response:
    """The SDK claims the entry it was handed; the answer carries what to call it with."""
    runtime: Runtime = request.app.state.runtime
    await hide_unowned(request, Owned.UNDO_ENTRY, entry)
    claim = await runtime.saga.claim_entry(request.state.org_id, entry, ExecutionMode.SDK)
    body = undo_entry_json(claim.entry)
    body["payload"] = claim.payload
    body["attempts_left"] = claim.attempts_left
    body["claim_token"] = claim.token
    return json_response(body, headers={"Cache-Control": "no-store"})


async def _entry_answer(
    request: Request, action: Callable[[Runtime, str], Awaitable[UndoEntryRecord]]
) -> Response:
    """Run one undo-entry operation for the caller's org; the entry, or the error body."""
    runtime: Runtime = request.app.state.runtime
    await hide_unowned(request, Owned.UNDO_ENTRY, request.path_params["entry"])
    entry = await action(runtime, request.state.org_id)
    return json_response(undo_entry_json(entry))


@router.post("/undo/{entry}/complete")
async def complete_entry(entry: str, request: Request) -> Response:
    """The claimed compensation succeeded: `{"claim_token": "..."}` (409 `claim_not_held`
    when the token is not the entry's current claim)."""

    async def complete(runtime: Runtime, org_id: str) -> UndoEntryRecord:
        token, _ = await _claim_token(request)
        return await runtime.saga.complete(org_id, entry, token)

    return await _entry_answer(request, complete)


@router.post("/undo/{entry}/fail")
async def fail_entry(entry: str, request: Request) -> Response:
    """One failed attempt (`{"claim_token": "...", "error": "..."}`); the last one
    escalates (502)."""

    async def fail(runtime: Runtime, org_id: str) -> UndoEntryRecord:
        token, data = await _claim_token(request)
        # Scrubbed, not refused: a failure report must not be lost over one character.
        error = scrubbed(_text(data, "error"))
        try:
            return await runtime.saga.fail_attempt(org_id, entry, error, token)
        except CompensationFailed:  # the last attempt: the entry needs a person
            runtime.metrics.health.compensations_failed.labels("exhausted").inc()
            raise

    return await _entry_answer(request, fail)


@router.post("/undo/{entry}/retry")
async def retry_entry(entry: str, request: Request) -> Response:
    return await _entry_answer(request, lambda rt, org: rt.saga.retry(org, entry))


@router.post("/undo/{entry}/resolve")
async def resolve_entry(entry: str, request: Request) -> Response:
    """An operator marks a failed entry handled by hand: `{"note": "..."}`; the entry keeps
    the note with the key that resolved it (`resolved by key:NAME: note`)."""

    async def resolve(runtime: Runtime, org_id: str) -> UndoEntryRecord:
        note = await _note(request)
        by = request.state.principal.decider
        return await runtime.saga.resolve(org_id, entry, f"resolved by {by}: {note}")

    return await _entry_answer(request, resolve)
