"""The life of a call, for every front end: intercept, run upstream, commit or fail.

`run_call` takes one tool call through the engine and says how it ended as a `CallOutcome`,
which the REST proxy (`undolog.proxy.toolcall`) and the MCP gateway (`undolog.mcp.gateway`)
each render in their own protocol. `execute_decision` runs an Execute decision upstream and
commits it (with retries, holding the result if the store stays down); approvals use it through
`run_approved`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING, Any, TypeVar

import orjson

from undolog.engine import Decision, Outcome
from undolog.engine.approvals import DecisionResult
from undolog.engine.model import ORG_WIDE, Actor, IntentLost
from undolog.engine.states import REPLAYABLE_STATES
from undolog.engine.tiers import Applied
from undolog.faults import crash_point
from undolog.logs import LazyLog
from undolog.services import tracing
from undolog.services.executor import ToolTransportError, ToolUnreachable
from undolog.services.quotas import session_exists
from undolog_sdk.errors import (
    AdvisoryLockTimeout,
    CommitFailed,
    Database,
    DuplicateSignature,
    EffectInDoubt,
    InterceptFailed,
    Internal,
    Serialization,
    ToolError,
    UndoLogError,
)
from undolog_sdk.wire import CallStatus as WireStatus
from undolog_sdk.wire import ExecutionMode

if TYPE_CHECKING:
    from undolog.runtime import Runtime

__all__ = [
    "Call",
    "CallOutcome",
    "CallStatus",
    "Execution",
    "execute_decision",
    "refused",
    "run_approved",
    "run_call",
]

T = TypeVar("T")

# Failures of the engine itself (as opposed to answers about the call): `intercept_failed`.
_ENGINE_FAILURES = (Database, Internal, Serialization, AdvisoryLockTimeout, DuplicateSignature)


@dataclass(frozen=True, slots=True)
class Call:
    """One tool call as a front end received it (the org always from the API key)."""

    org_id: str
    session_id: str
    tool_name: str
    args: Any
    step_index: int | None = None
    tool_version: str | None = None
    mode: str = ExecutionMode.PROXY
    actor: Actor = ORG_WIDE  # whose key: an agent key uses its own sessions only
    traceparent: str | None = None  # the caller's W3C trace context (services/tracing.py)
    # What the caller's code declares (SDK mode): the stricter tier applies (engine/tiers.py).
    declared_tier: str | None = None
    declared_compensation: Any = None


class CallStatus(StrEnum):
    """How a call ended, whatever the front end (the first four are the wire's statuses)."""

    # Recorded before: `decision.result_json`; the tool did not run.
    REPLAYED = WireStatus.REPLAYED.value
    PENDING_APPROVAL = WireStatus.PENDING_APPROVAL.value  # waits for a person: `approval_id`
    EXECUTE = WireStatus.EXECUTE.value  # SDK mode: the agent runs it and commits
    # Ran now: `result_json` (maybe held, maybe another run's).
    EXECUTED = WireStatus.EXECUTED.value
    FAILED = "failed"  # ran (or tried to) and gave no result: `error`
    REFUSED = "refused"  # the engine refused the call: `error`
    INTERCEPT_FAILED = "intercept_failed"  # the engine itself failed: `error`


@dataclass(frozen=True, slots=True)
class CallOutcome:
    """The front-end-neutral result of `run_call`: the one place an engine answer becomes
    what a front end says. REST renders it as JSON (`undolog.proxy.toolcall`), MCP as a
    `CallToolResult` or a JSON-RPC error (`undolog.mcp.gateway`).

    `commit_pending`: answered although its commit failed (held: `undolog.services.held`).
    `replayed`: another run of the same effect committed first; `result_json` is its result.
    """

    status: CallStatus
    decision: Decision | None = None
    result_json: str | None = None
    error: UndoLogError | None = None
    commit_pending: bool = False
    replayed: bool = False

    @property
    def answered(self) -> Decision | None:
        """The decision when this answer ends the call (replayed, or run): the answer whose
        delivery the front end reports (`undolog.services.delivery`)."""
        if self.status in (CallStatus.REPLAYED, CallStatus.EXECUTED, CallStatus.FAILED):
            return self.decision
        return None


def refused(exc: UndoLogError, log: Any) -> CallOutcome:
    """A call the engine would not take: refused, or the engine's own failure (logged)."""
    if isinstance(exc, _ENGINE_FAILURES):
        log.warning("intercept_failed", error=exc.message)
        return CallOutcome(CallStatus.INTERCEPT_FAILED, error=InterceptFailed(told(exc)))
    return CallOutcome(CallStatus.REFUSED, error=exc)


def told(exc: UndoLogError) -> str:
    """What a client is told of the engine's own failure: UndoLog's words, never the text of
    a driver or a database (that goes to the log)."""
    if isinstance(exc, Database):
        return "The store could not take the call right now; retry shortly."
    if isinstance(exc, Internal):
        return "UndoLog failed on this call; retry shortly (the details are in its log)."
    return exc.message


async def run_call(runtime: Runtime, call: Call, request_id: str) -> CallOutcome:
    """Take one call through the engine and, in proxy mode, run it: the one path of a call
    for REST and MCP alike. Traced as `undolog.call` (docs/observability.md).

    A step-less call the proxy runs first waits for the delivery marks of its session's
    earlier answers (`undolog.services.delivery`), so that a repeat is not taken for a retry.
    """
    with (
        tracing.caller_context(call.traceparent),
        tracing.span(
            "undolog.call",
            org=call.org_id,
            session_id=call.session_id,
            tool=call.tool_name,
            step_index=call.step_index,
            mode=str(call.mode),
            request_id=request_id,
        ) as span,
    ):
        outcome = await _run_call(runtime, call, request_id)
        decision = outcome.decision
        tracing.annotate(
            span,
            status=outcome.status.value,
            effect_id=decision.effect_id if decision is not None else None,
            error=outcome.error.code if outcome.error is not None else None,
        )
        return outcome


async def _run_call(runtime: Runtime, call: Call, request_id: str) -> CallOutcome:
    context = {"request_id": request_id, "org_id": call.org_id, "session_id": call.session_id}
    log = LazyLog(runtime.log, context)
    key_id = call.actor.key_id
    if runtime.quotas is not None and key_id is not None:
        # The key's calls and new sessions (services/quotas.py): in memory, no store round
        # trip unless the key has no new-session tokens left.
        try:
            over = await runtime.quotas.admit(
                key_id,
                call.session_id,
                lambda: session_exists(runtime.store, call.org_id, call.session_id),
            )
        except UndoLogError as exc:
            return refused(exc, log)
        if over is not None:
            return CallOutcome(CallStatus.REFUSED, error=over)
    if call.step_index is None and call.mode == ExecutionMode.PROXY:
        await runtime.deliveries.settle(call.org_id, call.session_id)
    try:
        decision = await _timed(
            runtime,
            "intercept",
            lambda: runtime.engine.intercept(
                call.org_id,
                call.session_id,
                call.tool_name,
                call.args,
                step_index=call.step_index,
                tool_version=call.tool_version,
                mode=call.mode,
                actor=call.actor,
                declared_tier=call.declared_tier,
                declared_compensation=call.declared_compensation,
            ),
        )
    except IntentLost as exc:  # never sent: recorded as not run once the store is back
        await runtime.held.not_run(exc.org_id, exc.effect_id, exc.attempt, log)
        return refused(exc, log)
    except UndoLogError as exc:
        return refused(exc, log)
    if decision.applied is not None:
        _report_mismatch(runtime, decision.applied, log)
    if decision.outcome is Outcome.REPLAY:
        return CallOutcome(CallStatus.REPLAYED, decision, decision.result_json)
    if decision.outcome is Outcome.AWAITING_APPROVAL:
        return CallOutcome(CallStatus.PENDING_APPROVAL, decision)
    if call.mode == ExecutionMode.SDK:
        return CallOutcome(CallStatus.EXECUTE, decision)
    # A call an approver changed runs with the approved args, also when run again.
    args = orjson.loads(decision.args_json) if decision.args_json else call.args
    execution = await execute_decision(runtime, decision, args, call.session_id, request_id, log)
    if execution.error is not None:
        return CallOutcome(CallStatus.FAILED, decision, error=execution.error)
    return CallOutcome(
        CallStatus.EXECUTED,
        decision,
        execution.result_json,
        commit_pending=execution.commit_pending,
        replayed=execution.replayed,
    )


# (org, tool, declared tier, registered tier, compensation differs) already logged by this
# process: a mismatch is logged once, not on every call of the tool; the metric counts calls.
_MISMATCHES_LOGGED: set[tuple[str, str, str, str, bool]] = set()
_MISMATCHES_LOGGED_MAX = 10_000


def _report_mismatch(runtime: Runtime, applied: Applied, log: Any) -> None:
    """A call whose code declares another tier (or compensation) than the registry holds:
    counted, and logged once per process (`tier_mismatch`: docs/sdk.md)."""
    if not applied.tier_mismatch and not applied.compensation_mismatch:
        return
    declared, registered = applied.declared_tier.value, applied.registered_tier.value
    runtime.metrics.tier_mismatches.labels(declared, registered).inc()
    tool = applied.tool
    seen = (tool.org_id, tool.name, declared, registered, applied.compensation_mismatch)
    if seen in _MISMATCHES_LOGGED:
        return
    if len(_MISMATCHES_LOGGED) >= _MISMATCHES_LOGGED_MAX:
        _MISMATCHES_LOGGED.clear()
    _MISMATCHES_LOGGED.add(seen)
    log.warning(
        "tier_mismatch",
        tool_name=tool.name,
        declared_tier=declared,
        registered_tier=registered,
        tier=tool.tier,
        compensation="declared (differs from the registry's)"
        if applied.compensation_mismatch
        else "as registered",
    )


async def _timed(runtime: Runtime, method: str, call: Callable[[], Awaitable[T]]) -> T:
    """An engine call, timed (metrics) and traced (`undolog.<method>`)."""
    started = time.perf_counter()
    try:
        with tracing.span(f"undolog.{method}"):
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


@dataclass(frozen=True, slots=True)
class Execution:
    """How a run went: committed with `result_json`, or not, with the error to answer.

    `commit_pending`: the result is answered although its commit failed; it is spooled and
    committed in the background (`undolog.services.held`). `replayed`: another run of the same
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
        with tracing.span("undolog.upstream", tool=decision.tool.name, effect_id=effect_id):
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
            if await runtime.held.hold(decision, result_json, result.success, log):
                return Execution(result_json, None, commit_pending=True)
            # Neither committed nor written down: only this process's memory has it.
            return Execution(None, EffectInDoubt(effect_id, reason=_NOT_DURABLE))
        recorded = await _recorded_result(runtime, org_id, effect_id)
        if recorded is not None:  # another run of this effect committed first: its result
            return Execution(recorded, None, replayed=True)
        log.error("commit_failed", error=exc.message)
        return Execution(None, CommitFailed(told(exc)))
    crash_point("after_commit")
    return Execution(result_json, None)


_NOT_DURABLE = (
    "the tool ran, but its result could neither be committed (the store is unavailable) nor "
    "written to the spool; the proxy keeps committing it, and a retry replays it once it is"
)


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


async def run_approved(
    runtime: Runtime, result: DecisionResult, request_id: str
) -> Execution | None:
    """Carry out an approval's decision: run a proxy-executed call now, once. None when the
    agent runs it (SDK mode: its retry of the call runs it)."""
    if result.run is None:
        return None
    effect = result.effect
    log = runtime.log.bind(
        request_id=request_id, org_id=effect.org_id, session_id=effect.session_id
    )
    # An approver's changed arguments, if any, are what runs (docs/approvals.md).
    args_json = result.approval.approved_args_json or effect.args_json
    return await execute_decision(
        runtime, result.run, orjson.loads(args_json), effect.session_id, request_id, log
    )
