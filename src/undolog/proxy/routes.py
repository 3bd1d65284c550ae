"""The REST routes besides the tool call: tool registry, effects, sessions."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fastapi import APIRouter, Request
from starlette.responses import Response

from undolog.engine.pages import Pages
from undolog.proxy import pages
from undolog.proxy.inputs import scrubbed, storable
from undolog.proxy.owners import Owned, actor, hide_unowned
from undolog.proxy.wire import (
    JSONDecodeError,
    approval_json,
    effect_json,
    json_response,
    loads_exact,
    session_json,
    tool_json,
    undo_entry_json,
)
from undolog_sdk.errors import Forbidden, InvalidRequest
from undolog_sdk.signature import canonical_json
from undolog_sdk.tier import TIER_VALUES
from undolog_sdk.wire import EffectState

if TYPE_CHECKING:
    from undolog.runtime import Runtime

__all__ = ["router"]

router = APIRouter()


def _runtime(request: Request) -> Runtime:
    runtime: Runtime = request.app.state.runtime
    return runtime


async def _json_object(request: Request, *, optional: bool = False) -> dict[str, Any]:
    body = await request.body()
    if not body.strip():
        if optional:
            return {}
        raise InvalidRequest("a JSON object body is required")
    try:
        data = loads_exact(body)
    except JSONDecodeError as exc:
        raise InvalidRequest(f"invalid JSON body: {exc}") from None
    if not isinstance(data, dict):
        raise InvalidRequest("the body must be a JSON object")
    return data


def _result_json(value: Any) -> str:
    try:
        return canonical_json(value)
    except ValueError as exc:
        raise InvalidRequest(f"result cannot be stored as JSON: {exc}") from None


_TOOL_BODY = {
    "content": {
        "application/json": {
            "schema": {
                "type": "object",
                "required": ["tier"],
                "properties": {
                    "tier": {"enum": list(TIER_VALUES)},
                    "version": {"type": "string"},
                    "compensation": {"type": "object"},
                    "idempotent_upstream": {"type": "boolean"},
                    "upstream": {"type": "string", "description": "a configured upstream"},
                },
            }
        }
    }
}


def _usable_upstream(runtime: Runtime, org_id: str, name: Any) -> str | None:
    """`name` if it is a configured upstream open to `org_id` (None stays None: `default`)."""
    if name is None:
        return None
    if not isinstance(name, str):
        raise InvalidRequest("upstream must be the name of a configured upstream")
    upstreams = runtime.executor.upstreams
    if upstreams.for_org(name, org_id) is None:
        # The same answer for "unknown" and "not yours": other orgs' upstreams stay unnamed.
        usable = ", ".join(upstreams.usable_by(org_id)) or "none"
        raise InvalidRequest(f"upstream must name a configured upstream (yours: {usable})")
    return name


@router.put("/tools/{name}", openapi_extra={"requestBody": _TOOL_BODY})
async def put_tool(name: str, request: Request) -> Response:
    """Register or replace a tool of the caller's org (admin keys only).

    Never a tool whose tier the operator's config sets: the config always wins. `upstream`
    names a tool server from the operator's config (`[[upstreams]]`, or `default`) that the
    caller's org may use; a URL is never taken from a tenant.
    """
    runtime = _runtime(request)
    owner = runtime.config_owner(request.state.org_id, name)
    if owner is not None:
        where = "[[tools]]" if owner == "config" else "the [mcp] gateway config"
        raise Forbidden(f"tool '{name}' is set by the operator's config ({where}): change it there")
    data = await _json_object(request)
    if "upstream_url" in data:
        raise InvalidRequest(
            "upstream_url is no longer accepted: name a configured upstream with "
            '"upstream" (the operator declares tool servers in [[upstreams]])'
        )
    unknown = set(data) - {"tier", "version", "compensation", "idempotent_upstream",
                           "upstream"}  # fmt: skip
    if unknown:
        raise InvalidRequest(f"unknown fields: {sorted(unknown)}")
    compensation = data.get("compensation")
    if compensation is not None and not isinstance(compensation, dict):
        raise InvalidRequest("compensation must be an object")
    # Checked, not coerced: str(None) would be version "None", bool("false") True.
    tier, version = data.get("tier", ""), data.get("version", "1.0.0")
    if not isinstance(tier, str) or not isinstance(version, str):
        raise InvalidRequest("tier and version must be strings")
    storable(name, "tool name")
    storable(version, "version")
    idempotent = data.get("idempotent_upstream", False)
    if not isinstance(idempotent, bool):
        raise InvalidRequest("idempotent_upstream must be a boolean")
    upstream = _usable_upstream(runtime, request.state.org_id, data.get("upstream"))
    tool = await runtime.engine.register_tool(
        request.state.org_id,
        name,
        tier=tier,
        version=version,
        compensation=compensation,
        idempotent_upstream=idempotent,
        upstream=upstream,
    )
    return json_response(tool_json(tool))


@router.get("/tools")
async def list_tools(request: Request) -> Response:
    tools = await _runtime(request).engine.list_tools(request.state.org_id)
    return json_response([tool_json(t) for t in tools])


@router.post("/effects/{id}/commit")
async def commit_effect(id: str, request: Request) -> Response:
    """Record the result of an SDK-executed call: body `{"result": ...}`."""
    runtime = _runtime(request)
    data = await _json_object(request)
    if "result" not in data:
        raise InvalidRequest("missing result")
    await hide_unowned(request, Owned.EFFECT, id)
    effect = await runtime.engine.commit(request.state.org_id, id, _result_json(data["result"]))
    return json_response(effect_json(effect))


@router.post("/effects/{id}/fail")
async def fail_effect(id: str, request: Request) -> Response:
    """Record the failure of an SDK-executed call: body `{"error": "..."}`."""
    runtime = _runtime(request)
    data = await _json_object(request)
    error = data.get("error")
    if not isinstance(error, str):
        raise InvalidRequest("error must be a string")
    # Scrubbed, not refused: refusing would leave a failed run unrecorded.
    await hide_unowned(request, Owned.EFFECT, id)
    effect = await runtime.engine.fail(request.state.org_id, id, scrubbed(error))
    return json_response(effect_json(effect))


@router.post("/effects/{id}/resolve")
async def resolve_effect(id: str, request: Request) -> Response:
    """Settle an `in_doubt` effect: `{"outcome": "committed", "result": ...}` or
    `{"outcome": "failed", "error": "..."}`."""
    runtime = _runtime(request)
    data = await _json_object(request)
    outcome = data.get("outcome")
    if not isinstance(outcome, str):
        raise InvalidRequest("outcome must be 'committed' or 'failed'")
    result = _result_json(data["result"]) if "result" in data else None
    error = data.get("error")
    if error is not None and not isinstance(error, str):
        raise InvalidRequest("error must be a string")
    by = request.state.principal.decider  # who resolved it is on record, from the key
    if outcome == EffectState.FAILED:
        error = f"{error} (resolved by {by})" if error else f"resolved as failed by {by}"
    effect = await runtime.engine.resolve(
        request.state.org_id,
        id,
        outcome=outcome,
        result_json=result,
        error=None if error is None else storable(error, "error"),
        by=by,
    )
    return json_response(effect_json(effect))


@router.get("/effects/{id}")
async def get_effect(id: str, request: Request) -> Response:
    await hide_unowned(request, Owned.EFFECT, id)
    effect = await _runtime(request).engine.get_effect(request.state.org_id, id)
    return json_response(effect_json(effect))


@router.get("/sessions")
async def list_sessions(request: Request, limit: int = 100) -> Response:
    """Sessions, latest update first: `state`, `q` (in the session id, the creating key's
    name or a tool it called), `limit` (1 to 500, else 100), `cursor` (docs/dashboard.md)."""
    limit = limit if 1 <= limit <= 500 else 100
    params = request.query_params
    page = await Pages(_runtime(request).store).sessions(
        request.state.org_id,
        limit,
        actor=actor(request),
        after=pages.decode_cursor(pages.SESSIONS, params.get("cursor")),
        state=params.get("state"),
        text=pages.text(params, "q"),
    )
    body = []
    for item in page.items:
        listed = session_json(item.session)
        listed["created_by"] = None if item.created_by is None else f"key:{item.created_by}"
        body.append(listed)
    return json_response(body, headers=pages.next_headers(pages.SESSIONS, page.after))


@router.get("/sessions/{id}")
async def get_session(id: str, request: Request) -> Response:
    """A session with its effects in step order, its undo stack (top first), its approvals."""
    await hide_unowned(request, Owned.SESSION, id)
    view = await _runtime(request).engine.session_view(request.state.org_id, id)
    body = session_json(view.session)
    body["effects"] = [effect_json(e, view.replay_counts.get(e.effect_id, 0)) for e in view.effects]
    body["undo_stack"] = [undo_entry_json(u) for u in view.undo_entries]
    body["approvals"] = [approval_json(a) for a in view.approvals]
    return json_response(body)
