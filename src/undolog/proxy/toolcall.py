"""`POST /mcp/tool_call`: the REST adapter of the product's hot path.

Parsing is by hand with orjson (no model validation layer); the call runs through
`undolog.services.calls.run_call`, and its `CallOutcome` is rendered here. A replay splices the
stored result JSON into the response without decoding it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.responses import Response

from undolog.answer_watch import AnswerWatch, WatchedResponse
from undolog.engine import Decision
from undolog.proxy.inputs import storable
from undolog.proxy.owners import actor
from undolog.proxy.wire import (
    JSON_TYPE,
    JSONDecodeError,
    error_response,
    json_response,
    loads_exact,
)
from undolog.services.calls import Call, CallOutcome, CallStatus, run_call
from undolog.services.tracing import TRACEPARENT, traceparent_of
from undolog_sdk.errors import InvalidRequest
from undolog_sdk.tier import TIER_VALUES
from undolog_sdk.wire import ExecutionMode

MODES = frozenset(ExecutionMode)

if TYPE_CHECKING:
    from undolog.runtime import Runtime

__all__ = ["COMMIT_HEADER", "parse_tool_call", "render_outcome", "tool_call"]

_MODE_HEADER = "x-undolog-mode"
# On an answer whose result is held, not yet committed (`undolog.services.held`).
COMMIT_HEADER = "X-UndoLog-Commit"


def parse_tool_call(body: bytes) -> dict[str, Any]:
    """Validate a tool-call body. Raises `InvalidRequest` with what is wrong."""
    try:
        data = loads_exact(body)
    except JSONDecodeError as exc:
        raise InvalidRequest(f"invalid JSON body: {exc}") from None
    if not isinstance(data, dict):
        raise InvalidRequest("the body must be a JSON object")
    session_id = data.get("session_id")
    if not isinstance(session_id, str) or not session_id:
        raise InvalidRequest("missing session_id")
    storable(session_id, "session_id")
    tool_name = data.get("tool_name")
    if not isinstance(tool_name, str) or not tool_name:
        raise InvalidRequest("missing tool_name")
    storable(tool_name, "tool_name")
    if "args" not in data:
        raise InvalidRequest("missing args")
    if not isinstance(data["args"], dict):
        raise InvalidRequest("args must be a JSON object")
    step = data.get("step_index")
    if step is not None and (
        not isinstance(step, int) or isinstance(step, bool) or not 0 <= step <= 0xFFFFFFFF
    ):
        raise InvalidRequest("step_index must be an unsigned 32-bit integer")
    version = data.get("tool_version")
    if version is not None and not isinstance(version, str):
        raise InvalidRequest("tool_version must be a string")
    if version is not None:
        storable(version, "tool_version")
    mode = data.get("mode", ExecutionMode.PROXY)
    if not isinstance(mode, str) or mode not in MODES:  # a list or object: 400, not a 500
        raise InvalidRequest("mode must be 'proxy' or 'sdk'")
    tier = data.get("declared_tier")
    if tier is not None and tier not in TIER_VALUES:  # the engine checks the compensation
        raise InvalidRequest("declared_tier must be 'safe', 'compensable' or 'irreversible'")
    return data


def _tiers(decision: Decision) -> dict[str, str | None]:
    """The tier a call runs under (`tier`), the registry's, and the one its code declared
    (None: it declared none); the stricter of the two applies (docs/sdk.md)."""
    applied = decision.applied
    if applied is None:
        return {"tier": decision.tool.tier, "declared_tier": None,
                "registered_tier": decision.tool.tier}  # fmt: skip
    return {"tier": decision.tool.tier, "declared_tier": applied.declared_tier.value,
            "registered_tier": applied.registered_tier.value}  # fmt: skip


def _step_header(decision: Decision) -> dict[str, str] | None:
    if decision.step_index is None:
        return None
    return {"X-UndoLog-Step-Index": str(decision.step_index)}


async def tool_call(request: Request) -> Response:
    runtime: Runtime = request.app.state.runtime
    request_id: str = request.state.request_id
    org_id: str = request.state.org_id
    data = parse_tool_call(await request.body())
    header = request.headers.get(_MODE_HEADER)  # an empty header is a wrong mode, not none
    mode = header if header is not None else data.get("mode", ExecutionMode.PROXY)
    call = Call(
        org_id,
        data["session_id"],
        data["tool_name"],
        data["args"],
        step_index=data.get("step_index"),
        tool_version=data.get("tool_version"),
        mode=mode,
        actor=actor(request),
        traceparent=traceparent_of(request.headers.get(TRACEPARENT)),
        declared_tier=data.get("declared_tier"),
        declared_compensation=data.get("declared_compensation"),
    )
    if call.step_index is not None or mode != ExecutionMode.PROXY:
        outcome = await run_call(runtime, call, request_id)
        return render_outcome(runtime, request_id, outcome)
    # A step-less call the proxy runs: its answer is watched, so that the engine can tell a
    # retry (the answer was lost) from a repeat (see `undolog.services.delivery`).
    watch = AnswerWatch(request.receive)
    try:
        outcome = await run_call(runtime, call, request_id)
        response = render_outcome(runtime, request_id, outcome)
    except BaseException:
        await watch.close()
        raise
    answers = []
    answered = outcome.answered
    if answered is not None and answered.logged:
        answers.append(runtime.deliveries.begin(org_id, call.session_id, answered.effect_id))
    return WatchedResponse(response, watch, runtime.deliveries, answers)


def render_outcome(runtime: Runtime, request_id: str, outcome: CallOutcome) -> Response:
    """A call's outcome as the REST reference answers it."""
    if outcome.error is not None:  # refused, the engine failed, or the run gave no result
        return error_response(request_id, outcome.error)
    decision = outcome.decision
    assert decision is not None
    headers = _step_header(decision)
    if outcome.status is CallStatus.PENDING_APPROVAL:
        return json_response(
            {
                "status": CallStatus.PENDING_APPROVAL,
                "approval_id": decision.approval_id,
                "effect_id": decision.effect_id,
                "retry_after": runtime.retry_after_seconds,
                **_tiers(decision),
            },
            202,
            headers,
        )
    if outcome.status is CallStatus.EXECUTE:
        return json_response(
            {
                "status": CallStatus.EXECUTE,
                "effect_id": decision.effect_id,
                "step_index": decision.step_index,
                "attempt": decision.attempt,
                **_tiers(decision),
            },
            200,
            headers,
        )
    replayed = outcome.status is CallStatus.REPLAYED or outcome.replayed
    body = b'{"status":"%s","effect_id":"%s","result":%s}' % (
        b"replayed" if replayed else b"executed",
        decision.effect_id.encode(),
        (outcome.result_json or "null").encode(),
    )
    if outcome.commit_pending:
        headers = {**(headers or {}), COMMIT_HEADER: "pending"}
    return Response(body, media_type=JSON_TYPE, headers=headers)
