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

from undolog.engine.approvals import DecisionResult, ResolvedByPolicy, Verdict
from undolog.proxy.owners import Owned, hide_unowned
from undolog.proxy.wire import approval_json, json_response, loads_exact
from undolog.services.calls import run_approved
from undolog_sdk.errors import EffectInDoubt, InvalidRequest, UndoLogError
from undolog_sdk.wire import ApprovalStatus, EffectState

if TYPE_CHECKING:
    from undolog.services.runtime import Runtime

__all__ = ["router"]

router = APIRouter()
DEFAULT_LIMIT = 100


def reference_approval(record: Any) -> dict[str, Any]:
    """An approval as the REST reference lists it (`args` as the raw JSON's bytes), plus
    readable extras (`arguments`, times, who decided and why)."""
    body = approval_json(record)
    body["arguments"] = body.pop("args")
    body["args"] = list(record.args_json.encode("utf-8"))
    return body


@router.get("/approvals")
async def list_approvals(request: Request) -> Response:
    runtime: Runtime = request.app.state.runtime
    state = request.query_params.get("state", ApprovalStatus.PENDING)
    try:
        limit = int(request.query_params.get("limit", DEFAULT_LIMIT))
    except ValueError:
        limit = DEFAULT_LIMIT
    if not 1 <= limit <= 500:
        limit = DEFAULT_LIMIT
    records = await runtime.approvals.list_approvals(request.state.org_id, state, limit)
    return json_response([reference_approval(r) for r in records])


@router.get("/approvals/{id}")
async def get_approval(id: str, request: Request) -> Response:
    runtime: Runtime = request.app.state.runtime
    await hide_unowned(request, Owned.APPROVAL, id)
    record = await runtime.approvals.get(request.state.org_id, id)
    return json_response(reference_approval(record))


async def _decision_body(request: Request) -> tuple[str | None, Any]:
    """The decision's optional `reason` and (approve only) `args`, the changed arguments. A
    `decided_by` is refused (400): who decided is the authenticated key's name, never what
    the caller writes."""
    raw = await request.body()
    if not raw.strip():
        return None, None
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
    unknown = set(data) - {"reason", "args"}
    if unknown:
        raise InvalidRequest(f"malformed decision body: unknown fields {sorted(unknown)}")
    if data.get("reason") is not None and not isinstance(data["reason"], str):
        raise InvalidRequest("malformed decision body: 'reason' must be a string")
    if data.get("args") is not None and not isinstance(data["args"], dict):
        raise InvalidRequest("malformed decision body: 'args' must be a JSON object")
    reason: str | None = data.get("reason")
    return reason, data.get("args")


async def _decide(request: Request, approval_id: str, verdict: Verdict) -> Response:
    runtime: Runtime = request.app.state.runtime
    org_id: str = request.state.org_id
    request_id: str = request.state.request_id
    action = verdict.value
    started = time.perf_counter()
    try:
        reason, args = await _decision_body(request)
        # Who decided: the authenticated key's name (`key:NAME`), never client text.
        principal = request.state.principal
        result = await runtime.approvals.decide(
            org_id, approval_id, verdict, reason=reason, decided_by=principal.decider,
            approver_key_id=principal.key_id, args=args,
        )  # fmt: skip
    except UndoLogError as exc:
        if isinstance(exc, ResolvedByPolicy) and exc.result.run is not None:
            # Too late: the org's timeout policy approved it first, so it runs now, once.
            await _run_approved(runtime, exc.result, request_id)
        if not isinstance(exc, InvalidRequest):
            runtime.metrics.approval_decisions.labels(action, exc.code).inc()
            runtime.metrics.approval_decision_duration.labels(action).observe(
                time.perf_counter() - started
            )
        raise  # answered by the app's one handler (`undolog.proxy.errors`)
    body: dict[str, Any] = {
        "status": result.approval.status,
        "approval_id": approval_id,
        "effect_id": result.effect.effect_id,
    }
    if verdict is Verdict.APPROVE and result.approval.status == ApprovalStatus.PENDING:
        # A rule asks for more approvers: nothing runs yet (docs/approvals.md).
        body["execution"] = "awaiting_approvers"
        body["approvals"] = len(orjson.loads(result.approval.approved_by_json))
        body["approvers_required"] = result.approval.approvers_required
    elif verdict is Verdict.APPROVE:
        body.update(await _run_approved(runtime, result, request_id))
    runtime.metrics.approval_decisions.labels(action, result.approval.status).inc()
    runtime.metrics.approval_decision_duration.labels(action).observe(time.perf_counter() - started)
    return json_response(body)


async def _run_approved(
    runtime: Runtime, result: DecisionResult, request_id: str
) -> dict[str, Any]:
    """Run the approved call (`undolog.services.calls.run_approved`); its `execution` part."""
    execution = await run_approved(runtime, result, request_id)
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
