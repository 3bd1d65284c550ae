"""`POST /mcp/tool_call`: intercept, run upstream, commit or fail — the product's hot path.

Parsing is by hand with orjson (no model validation layer), and a replay splices the stored
result JSON into the response without decoding it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from starlette.requests import Request
from starlette.responses import Response

from undolog.engine import Decision, Outcome
from undolog.engine.model import Actor
from undolog.engine.states import REPLAYABLE_STATES
from undolog.faults import crash_point
from undolog.proxy.delivery import AnswerWatch, WatchedResponse
from undolog.proxy.executor import ToolTransportError, ToolUnreachable
from undolog.proxy.inputs import storable
from undolog.proxy.owners import actor
from undolog.proxy.wire import (
    JSON_TYPE,
    JSONDecodeError,
    error_response,
    json_response,
    loads_exact,
)
from undolog_sdk.errors import (
    AdvisoryLockTimeout,
    CommitFailed,
    Database,
    DuplicateSignature,
    EffectInDoubt,
    InterceptFailed,
    Internal,
    InvalidRequest,
    Serialization,
    ToolError,
    UndoLogError,
)

if TYPE_CHECKING:
    from undolog.proxy.app import Runtime

__all__ = ["COMMIT_HEADER", "Execution", "execute_decision", "parse_tool_call", "tool_call"]

T = TypeVar("T")

# Failures of the engine itself (as opposed to answers about the call): 502 intercept_failed.
_ENGINE_FAILURES = (Database, Internal, Serialization, AdvisoryLockTimeout, DuplicateSignature)
_MODE_HEADER = "x-undolog-mode"
# On an answer whose result is held, not yet committed (`undolog.proxy.held`).
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
    mode = data.get("mode", "proxy")
    if mode not in ("proxy", "sdk"):
        raise InvalidRequest("mode must be 'proxy' or 'sdk'")
    return data


async def _timed(runtime: Runtime, method: str, call: Callable[[], Awaitable[T]]) -> T:
    started = time.perf_counter()
    try:
        return await call()
    except Exception:
        runtime.metrics.engine_rpc_errors.labels(method).inc()
        raise
    finally:
        runtime.metrics.engine_rpc_duration.labels(method).observe(time.perf_counter() - started)


async def _with_retries(runtime: Runtime, method: str, call: Callable[[], Awaitable[T]]) -> T:
    """Commit/Fail: retried with bounded exponential backoff on transient store errors."""
    delay = runtime.commit_retry_backoff_ms / 1000
    for attempt in range(1, runtime.commit_retry_attempts + 1):
        try:
            return await _timed(runtime, method, call)
        except UndoLogError as exc:
            if not exc.retryable or attempt == runtime.commit_retry_attempts:
                raise
        runtime.metrics.engine_rpc_retries.labels(method).inc()
        await asyncio.sleep(delay)
        delay = min(delay * 2, 2.0)
    raise AssertionError("unreachable")  # pragma: no cover


def _step_header(decision: Decision) -> dict[str, str] | None:
    if decision.step_index is None:
        return None
    return {"X-UndoLog-Step-Index": str(decision.step_index)}


async def tool_call(request: Request) -> Response:
    runtime: Runtime = request.app.state.runtime
    request_id: str = request.state.request_id
    org_id: str = request.state.org_id
    try:
        data = parse_tool_call(await request.body())
    except InvalidRequest as exc:
        return error_response(request_id, exc)
    mode = request.headers.get(_MODE_HEADER) or data.get("mode", "proxy")
    if data.get("step_index") is not None or mode != "proxy":
        response, _ = await _answer(runtime, request_id, org_id, data, mode, actor(request))
        return response
    # A step-less call the proxy runs: its answer is watched, so that the engine can tell a
    # retry (the answer was lost) from a repeat (see `undolog.proxy.delivery`).
    session_id: str = data["session_id"]
    watch = AnswerWatch(request.receive)
    try:
        await runtime.deliveries.settle(org_id, session_id)
        response, answered = await _answer(runtime, request_id, org_id, data, mode, actor(request))
    except BaseException:
        await watch.close()
        raise
    answers = []
    if answered is not None and answered.logged:
        answers.append(runtime.deliveries.begin(org_id, session_id, answered.effect_id))
    return WatchedResponse(response, watch, runtime.deliveries, answers)


async def _answer(
    runtime: Runtime, request_id: str, org_id: str, data: dict[str, Any], mode: str, who: Actor
) -> tuple[Response, Decision | None]:
    """The call's answer, and the decision when the answer ends the call (ran or replayed)."""
    session_id: str = data["session_id"]
    tool_name: str = data["tool_name"]
    args = data["args"]
    log = runtime.log.bind(request_id=request_id, org_id=org_id, session_id=session_id)

    try:
        decision = await _timed(
            runtime,
            "intercept",
            lambda: runtime.engine.intercept(
                org_id,
                session_id,
                tool_name,
                args,
                step_index=data.get("step_index"),
                tool_version=data.get("tool_version"),
                mode=mode,
                actor=who,
            ),
        )
    except _ENGINE_FAILURES as exc:
        log.warning("intercept_failed", error=exc.message)
        return error_response(request_id, InterceptFailed(exc.message)), None
    except UndoLogError as exc:
        return error_response(request_id, exc), None

    headers = _step_header(decision)
    if decision.outcome is Outcome.REPLAY:
        body = b'{"status":"replayed","effect_id":"%s","result":%s}' % (
            decision.effect_id.encode(),
            (decision.result_json or "null").encode(),
        )
        return Response(body, media_type=JSON_TYPE, headers=headers), decision
    if decision.outcome is Outcome.AWAITING_APPROVAL:
        return json_response(
            {
                "status": "pending_approval",
                "approval_id": decision.approval_id,
                "effect_id": decision.effect_id,
                "retry_after": runtime.retry_after_seconds,
            },
            202,
            headers,
        ), None
    if mode == "sdk":
        return json_response(
            {
                "status": "execute",
                "effect_id": decision.effect_id,
                "step_index": decision.step_index,
                "attempt": decision.attempt,
            },
            200,
            headers,
        ), None
    execution = await execute_decision(runtime, decision, args, session_id, request_id, log)
    if execution.error is not None:
        return error_response(request_id, execution.error), decision
    body = b'{"status":"%s","effect_id":"%s","result":%s}' % (
        b"replayed" if execution.replayed else b"executed",
        decision.effect_id.encode(),
        (execution.result_json or "null").encode(),
    )
    if execution.commit_pending:
        headers = {**(headers or {}), COMMIT_HEADER: "pending"}
    return Response(body, media_type=JSON_TYPE, headers=headers), decision


@dataclass(frozen=True, slots=True)
class Execution:
    """How a run went: committed with `result_json`, or not, with the error to answer.

    `commit_pending`: the result is answered although its commit failed; it is spooled and
    committed in the background (`undolog.proxy.held`). `replayed`: another run of the same
    effect committed first, and `result_json` is the recorded result.
    """

    result_json: str | None
    error: UndoLogError | None
    commit_pending: bool = False
    replayed: bool = False


async def execute_decision(
    runtime: Runtime, decision: Decision, args: Any, session_id: str, request_id: str, log: Any
) -> Execution:
    """Run an Execute decision on the upstream, then commit it (or fail it, or put it in doubt).

    While it runs, this process renews the effect's lease. A failure that proves the request
    never reached the tool fails the effect (`ToolError`; a retry runs it again). An ambiguous
    outcome (timeout, connection lost after sending, no ToolResult) puts it `in_doubt`
    (`EffectInDoubt`) — unless the tool is `idempotent_upstream`: then it is failed, and the
    retry runs it again with the same Idempotency-Key. A result whose commit keeps failing is
    held (spooled, answered, committed in the background), never dropped.
    """
    if not decision.logged:
        return await _run_and_settle(runtime, decision, args, session_id, request_id, log)
    with runtime.leases.hold(decision.tool.org_id, decision.effect_id, decision.attempt):
        return await _run_and_settle(runtime, decision, args, session_id, request_id, log)


async def _run_and_settle(
    runtime: Runtime, decision: Decision, args: Any, session_id: str, request_id: str, log: Any
) -> Execution:
    org_id = decision.tool.org_id
    effect_id = decision.effect_id
    log = log.bind(effect_id=effect_id, tool_name=decision.tool.name)
    started = time.perf_counter()
    crash_point("after_intent")
    try:
        result = await runtime.executor.call(
            decision.tool.name,
            args,
            session_id=session_id,
            effect_id=effect_id,
            request_id=request_id,
            org_id=org_id,
            upstream=decision.tool.upstream,
        )
    except ToolTransportError as exc:
        runtime.metrics.executor_duration.labels("error").observe(time.perf_counter() - started)
        message = str(exc)
        log.warning("tool_error", error=message)
        if not decision.logged:
            return Execution(None, ToolError(message))
        unreachable = isinstance(exc, ToolUnreachable)
        if unreachable or decision.tool.idempotent_upstream:
            # Never ran, or safe to run again under the same key: failed, and a retry reruns it.
            try:
                await _with_retries(
                    runtime, "fail", lambda: runtime.engine.fail(org_id, effect_id, message)
                )
            except UndoLogError as fail_exc:
                log.error("fail_not_recorded", error=fail_exc.message)
            return Execution(None, ToolError(message))
        return await _in_doubt(runtime, decision, message, log)
    runtime.metrics.executor_duration.labels("success" if result.success else "failure").observe(
        time.perf_counter() - started
    )
    result_json = result.to_json()
    crash_point("after_answer")
    if not decision.logged:
        return Execution(result_json, None)
    try:
        await _with_retries(
            runtime,
            "commit",
            lambda: runtime.engine.commit(org_id, effect_id, result_json, undoable=result.success),
        )
    except UndoLogError as exc:
        if exc.retryable:  # the store is unavailable: hold the result, never drop it
            await runtime.held.hold(runtime, decision, result_json, result.success, log)
            return Execution(result_json, None, commit_pending=True)
        recorded = await _recorded_result(runtime, org_id, effect_id)
        if recorded is not None:  # another run of this effect committed first: its result
            return Execution(recorded, None, replayed=True)
        log.error("commit_failed", error=exc.message)
        return Execution(None, CommitFailed(exc.message))
    crash_point("after_commit")
    return Execution(result_json, None)


async def _in_doubt(runtime: Runtime, decision: Decision, message: str, log: Any) -> Execution:
    """The tool may have run: the effect is `in_doubt` until an operator resolves it."""
    org_id, effect_id = decision.tool.org_id, decision.effect_id
    runtime.metrics.effects_in_doubt.labels("outcome_unknown").inc()
    log.warning("effect_in_doubt", reason="outcome_unknown", error=message)
    try:
        await _with_retries(
            runtime,
            "mark_in_doubt",
            lambda: runtime.engine.mark_in_doubt(
                org_id, effect_id, message, attempt=decision.attempt
            ),
        )
    except UndoLogError as exc:  # the lease runs down and the sweeper marks it instead
        log.error("in_doubt_not_recorded", error=exc.message)
    return Execution(None, EffectInDoubt(effect_id))


async def _recorded_result(runtime: Runtime, org_id: str, effect_id: str) -> str | None:
    """The effect's recorded result if it has committed (a replayable state), else None."""
    try:
        effect = await runtime.engine.get_effect(org_id, effect_id)
    except UndoLogError:
        return None
    if effect.state not in REPLAYABLE_STATES:
        return None
    return effect.result_json or "null"
