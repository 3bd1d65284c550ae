"""`/approvals`: list, approve, reject (the sweep of expired approvals is
`undolog.services.calls.sweep_approvals_forever`).

Approving a proxy-executed call runs it upstream right away, once, and answers with
`execution: committed` and the result (or `failed` and the error). Approving an SDK-executed
call answers `execution: awaiting_agent`: the agent's retry of the call runs it.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import orjson
from fastapi import APIRouter, Request
from starlette.responses import Response

from undolog.engine.approvals import Verdict
from undolog.engine.pages import ApprovalListing, Pages
from undolog.proxy import pages
from undolog.proxy.owners import Owned, hide_unowned
from undolog.proxy.wire import approval_json, json_response, loads_exact, recent_call_json
from undolog.services import approvals
from undolog.services.calls import Execution
from undolog.services.decisions import wait_for_decision
from undolog.services.waits import MAX_WAIT_SECONDS
from undolog_sdk.errors import EffectInDoubt, InvalidRequest, UndoLogError
from undolog_sdk.wire import ApprovalStatus, EffectState

if TYPE_CHECKING:
    from undolog.runtime import Runtime

__all__ = ["router"]

router = APIRouter()
DEFAULT_LIMIT = 100


def reference_approval(record: Any) -> dict[str, Any]:
    """An approval: the reference's fields with `args` as the JSON object the call was made
    with (not the raw JSON's bytes), plus `arguments` (the same object, kept for clients of
    0.1.0), times, who decided and why."""
    body = approval_json(record)
    body["arguments"] = body["args"]
    return body


def listed_approval(item: ApprovalListing, *, recent: bool) -> dict[str, Any]:
    """`reference_approval` with who asked (`requested_by`, `key:NAME`: never the secret),
    who runs the call (`mode`) and, when asked for, the session's latest calls
    (`recent_calls`)."""
    body = reference_approval(item.approval)
    body["requested_by"] = None if item.requested_by is None else f"key:{item.requested_by}"
    body["mode"] = item.mode  # only a `proxy` call takes changed `args` (docs/approvals.md)
    if recent:
        body["recent_calls"] = [recent_call_json(e) for e in item.recent_calls]
    return body


@router.get("/approvals")
async def list_approvals(request: Request) -> Response:
    """Approvals newest first: `state` (default `pending`; `all`), `tool`, `limit` (1 to
    500, else 100, as the reference says), `cursor`, `recent_calls` (docs/dashboard.md)."""
    runtime: Runtime = request.app.state.runtime
    params = request.query_params
    try:
        limit = int(params.get("limit", DEFAULT_LIMIT))
    except ValueError:
        limit = DEFAULT_LIMIT
    if not 1 <= limit <= 500:
        limit = DEFAULT_LIMIT
    page = await Pages(runtime.store).approvals(
        request.state.org_id,
        limit,
        after=pages.decode_cursor(pages.APPROVALS, params.get("cursor")),
        status=params.get("state", ApprovalStatus.PENDING),
        tool=pages.text(params, "tool"),
        recent_calls=pages.recent_calls(params),
    )
    body = [listed_approval(item, recent="recent_calls" in params) for item in page.items]
    return json_response(body, headers=pages.next_headers(pages.APPROVALS, page.after))


def _wait_seconds(request: Request) -> int:
    """`?wait=N`: whole seconds from 0; more than `MAX_WAIT_SECONDS` (55) is taken as 55."""
    raw = request.query_params.get("wait")
    if raw is None or raw == "":
        return 0
    if not raw.isdigit() or len(raw) > 6:
        raise InvalidRequest("'wait' must be a whole number of seconds (0 to 55)")
    return min(int(raw), MAX_WAIT_SECONDS)


@router.get("/approvals/{id}")
async def get_approval(id: str, request: Request) -> Response:
    """An approval; with `?wait=N`, answered once it is decided or after N seconds (then
    still pending), whichever comes first (docs/mcp.md, "Long waits")."""
    runtime: Runtime = request.app.state.runtime
    seconds = _wait_seconds(request)
    await hide_unowned(request, Owned.APPROVAL, id)
    org_id: str = request.state.org_id
    if seconds:
        record = await runtime.approvals.get(org_id, id)
        if record.status == ApprovalStatus.PENDING:
            key_id = request.state.principal.key_id
            await wait_for_decision(
                runtime, org_id, id, record.effect_id, key_id=key_id, seconds=seconds
            )
    recent = pages.recent_calls(request.query_params)
    item = await Pages(runtime.store).approval(org_id, id, recent_calls=recent)
    return json_response(listed_approval(item, recent="recent_calls" in request.query_params))


async def _decision_body(request: Request) -> tuple[str | None, Any, str | None]:
    """The decision's optional `reason` and (approve only) `args`, the changed arguments,
    and `args_hash`, the hash of the arguments the approver saw (docs/approvals.md). A
    `decided_by` is refused (400): who decided is the authenticated key's name, never what
    the caller writes."""
    raw = await request.body()
    if not raw.strip():
        return None, None, None
    try:
        data = loads_exact(raw)
    except ValueError as exc:
        raise InvalidRequest(f"malformed decision body: {exc}") from None
    if not isinstance(data, dict):
        raise InvalidRequest("malformed decision body: expected a JSON object")
    if "decided_by" in data:
        raise InvalidRequest(
            "decided_by is not accepted: the decider is the API key's name; "
            "put any note in 'reason'"
        )
    unknown = set(data) - {"reason", "args", "args_hash"}
    if unknown:
        raise InvalidRequest(f"malformed decision body: unknown fields {sorted(unknown)}")
    if data.get("reason") is not None and not isinstance(data["reason"], str):
        raise InvalidRequest("malformed decision body: 'reason' must be a string")
    if data.get("args") is not None and not isinstance(data["args"], dict):
        raise InvalidRequest("malformed decision body: 'args' must be a JSON object")
    if data.get("args_hash") is not None and not isinstance(data["args_hash"], str):
        raise InvalidRequest("malformed decision body: 'args_hash' must be a string")
    reason: str | None = data.get("reason")
    return reason, data.get("args"), data.get("args_hash")


async def _decide(request: Request, approval_id: str, verdict: Verdict) -> Response:
    runtime: Runtime = request.app.state.runtime
    org_id: str = request.state.org_id
    request_id: str = request.state.request_id
    action = verdict.value
    started = time.perf_counter()
    try:
        reason, args, seen_hash = await _decision_body(request)
        # Who decided: the authenticated key's name (`key:NAME`), never client text.
        principal = request.state.principal
        decided = await approvals.decide(
            runtime, org_id, approval_id, verdict, decided_by=principal.decider,
            approver_key_id=principal.key_id, request_id=request_id, reason=reason, args=args,
            seen_args_hash=seen_hash,
        )  # fmt: skip
    except UndoLogError as exc:
        if not isinstance(exc, InvalidRequest):
            runtime.metrics.approval_decisions.labels(action, exc.code).inc()
            runtime.metrics.approval_decision_duration.labels(action).observe(
                time.perf_counter() - started
            )
        raise  # answered by the app's one handler (`undolog.proxy.errors`)
    result = decided.result
    body: dict[str, Any] = {
        "status": result.approval.status,
        "approval_id": approval_id,
        "effect_id": result.effect.effect_id,
    }
    if verdict is Verdict.APPROVE and decided.awaiting_approvers:
        # A rule asks for more approvers: nothing runs yet (docs/approvals.md).
        body["execution"] = "awaiting_approvers"
        body["approvals"] = len(orjson.loads(result.approval.approved_by_json))
        body["approvers_required"] = result.approval.approvers_required
    elif verdict is Verdict.APPROVE:
        body.update(_execution_json(decided.execution))
    runtime.metrics.approval_decisions.labels(action, result.approval.status).inc()
    runtime.metrics.health.observe_decision(result.approval)
    runtime.metrics.approval_decision_duration.labels(action).observe(time.perf_counter() - started)
    return json_response(body)


def _execution_json(execution: Execution | None) -> dict[str, Any]:
    """The `execution` part of an approval's answer: how the approved call's run went."""
    if execution is None:
        return {"execution": "awaiting_agent"}
    if isinstance(execution.error, EffectInDoubt):  # the tool may have run: an operator decides
        return {"execution": EffectState.IN_DOUBT, "error": execution.error.message}
    if execution.error is not None:
        return {"execution": EffectState.FAILED, "error": execution.error.message}
    output = orjson.loads(execution.result_json or "null")
    if execution.commit_pending:  # held: spooled and committed in the background
        return {"execution": "commit_pending", "result": output}
    return {"execution": EffectState.COMMITTED, "result": output}


@router.post("/approvals/{id}/approve")
async def approve(id: str, request: Request) -> Response:
    """Approve a pending request; a proxy-executed call runs now, once."""
    return await _decide(request, id, Verdict.APPROVE)


@router.post("/approvals/{id}/reject")
async def reject(id: str, request: Request) -> Response:
    """Reject a pending request and halt its session."""
    return await _decide(request, id, Verdict.REJECT)


@router.post("/approvals//approve", include_in_schema=False)
@router.post("/approvals//reject", include_in_schema=False)
async def missing_id(request: Request) -> Response:
    """An empty id segment: the reference answers 400, not 404."""
    raise InvalidRequest("missing approval ID in path")
