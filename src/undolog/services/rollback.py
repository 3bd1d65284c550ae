"""Driving a session's rollback: the proxy as a compensation runner.

`run_rollback` moves the session to `compensating` and runs, newest first, every entry whose
compensation lives on the tool server (entries of proxy-executed calls), each with up to
`max_retries` retries `retry_backoff_ms` apart. It stops when the stack is done, when an entry
gives up (`compensation_failed`), or when the top entry belongs to the SDK
(`waiting_for_runner`: the SDK claims it, runs it and reports, then calls rollback again).
Front ends render the `RollbackStatus` it returns (`undolog.proxy.undo` for REST).
`run_selective_undo` does the same for chosen entries only and leaves the session open
(docs/undo.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Sequence
from collections.abc import Set as AbstractSet
from typing import TYPE_CHECKING

from undolog.engine.saga import Claim, RollbackStatus
from undolog.engine.selective import Selection, load_selection
from undolog.faults import crash_point
from undolog.services import tracing
from undolog.services.executor import ToolResult, ToolTransportError, ToolUnreachable
from undolog_sdk.errors import (
    CompensationFailed,
    DependentEffects,
    ToolNotRegistered,
    UndoLogError,
)
from undolog_sdk.wire import ExecutionMode

if TYPE_CHECKING:
    from undolog.runtime import Runtime

__all__ = ["run_rollback", "run_selective_undo"]


async def _compensation_upstream(runtime: Runtime, claim: Claim) -> str | None:
    """The upstream of the forward call's tool: a compensation lives where its tool does.

    None (the `default` upstream) when the tool is no longer registered.
    """
    try:
        tool = await runtime.engine.get_tool(claim.entry.org_id, claim.effect.tool_name)
    except ToolNotRegistered:
        return None
    return tool.upstream


async def _renew_claim(runtime: Runtime, claim: Claim) -> None:
    """Keep a running compensation's claim alive (every third of a lease) until cancelled."""
    entry = claim.entry
    while True:
        await asyncio.sleep(runtime.leases.interval)
        with contextlib.suppress(UndoLogError):  # the store is down: the claim runs down
            await runtime.saga.renew_claim(entry.org_id, entry.entry_id, claim.token)


async def _call_compensation(
    runtime: Runtime, claim: Claim, request_id: str, upstream: str | None
) -> ToolResult:
    entry = claim.entry
    renewer = asyncio.create_task(_renew_claim(runtime, claim))
    try:
        with tracing.span("undolog.upstream", tool=entry.fn_name, entry_id=entry.entry_id):
            return await runtime.executor.call(
                entry.fn_name,
                claim.payload,
                session_id=entry.session_id,
                effect_id=entry.effect_id,
                request_id=request_id,
                org_id=entry.org_id,
                upstream=upstream,
                idempotency_key=entry.entry_id,
            )
    finally:
        renewer.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await renewer


async def _run_claim(runtime: Runtime, claim: Claim, request_id: str) -> str | None:
    """Run one claimed compensation with its retries; None on success, else the last error.

    Timed into `undolog_proxy_compensation_duration_seconds` and traced as
    `undolog.compensation` (docs/observability.md).
    """
    started = time.perf_counter()
    entry = claim.entry
    with tracing.span(
        "undolog.compensation",
        entry_id=entry.entry_id,
        effect_id=entry.effect_id,
        fn_name=entry.fn_name,
    ) as span:
        error = await _attempts(runtime, claim, request_id)
        result = "compensated" if error is None else "failed"
        tracing.annotate(span, result=result)
    runtime.metrics.health.compensation_duration.labels(result).observe(
        time.perf_counter() - started
    )
    return error


async def _attempts(runtime: Runtime, claim: Claim, request_id: str) -> str | None:
    """The attempts of `_run_claim`; None on success, else the last error.

    It goes through the same executor path as a forward call: same upstream, org header signed.
    A compensation whose outcome is unknown (a timeout, a connection lost after sending, an
    answer that is no ToolResult) is tried again only when it is declared idempotent;
    otherwise the entry needs an operator at once (`Saga.give_up`).
    """
    entry = claim.entry
    backoff = entry.retry_backoff_ms / 1000
    upstream = await _compensation_upstream(runtime, claim)
    for attempt in range(max(1, claim.attempts_left)):
        if attempt:
            await asyncio.sleep(backoff)
            if not await runtime.saga.start_attempt(entry.org_id, entry.entry_id, claim.token):
                return None  # taken over or settled meanwhile: not ours to run
        try:
            result = await _call_compensation(runtime, claim, request_id, upstream)
            error = None if result.success else (result.error or "compensation reported failure")
        except ToolTransportError as exc:
            error = str(exc)
            if not isinstance(exc, ToolUnreachable) and not claim.idempotent:
                runtime.metrics.effects_in_doubt.labels("compensation_unknown").inc()
                try:
                    await runtime.saga.give_up(
                        entry.org_id,
                        entry.entry_id,
                        f"compensation outcome unknown: {error}",
                        claim.token,
                    )
                except CompensationFailed:
                    runtime.metrics.health.compensations_failed.labels("unknown").inc()
                    return error
        crash_point("mid_rollback")
        if error is None:
            await runtime.saga.complete(entry.org_id, entry.entry_id, claim.token)
            return None
        try:
            await runtime.saga.fail_attempt(entry.org_id, entry.entry_id, error, claim.token)
        except CompensationFailed:
            runtime.metrics.health.compensations_failed.labels("exhausted").inc()
            return error
    return error  # pragma: no cover - fail_attempt raises on the last attempt


async def run_rollback(
    runtime: Runtime,
    org_id: str,
    session_id: str,
    request_id: str,
    traceparent: str | None = None,
    by: str | None = None,
) -> tuple[RollbackStatus, str | None]:
    """Unwind as far as this runner can; returns where the rollback stands.

    Traced as `undolog.rollback`, a child of the caller's `traceparent` if any. `by`: who
    asked (`key:<name>`), recorded in the rollback's events.
    """
    with (
        tracing.caller_context(traceparent),
        tracing.span(
            "undolog.rollback", org=org_id, session_id=session_id, request_id=request_id
        ) as span,
    ):
        status, error = await _unwind(runtime, org_id, session_id, request_id, by)
        tracing.annotate(span, outcome=status.value)
        return status, error


async def _unwind(
    runtime: Runtime, org_id: str, session_id: str, request_id: str, by: str | None
) -> tuple[RollbackStatus, str | None]:
    await runtime.saga.begin(org_id, session_id, by)
    return await _drive(runtime, org_id, session_id, request_id, None, by)


async def run_selective_undo(
    runtime: Runtime,
    org_id: str,
    session_id: str,
    request_id: str,
    *,
    entries: Sequence[str] | None = None,
    after_step: int | None = None,
    force: bool = False,
    by: str | None = None,
) -> tuple[RollbackStatus, str | None, Selection]:
    """Undo chosen entries (`entries`, or every entry after step `after_step`), newest first,
    as far as this runner can; the session keeps its state (docs/undo.md).

    Raises:
        DependentEffects: later calls that may depend on the chosen ones stay in place, and
            `force` is not set (nothing was run).
    """
    selection = await load_selection(
        runtime.store, org_id, session_id, entries=entries, after_step=after_step
    )
    if selection.dependents and not force:
        raise DependentEffects(session_id, [e.effect_id for e in selection.dependents])
    if not selection.entry_ids:
        return RollbackStatus.EMPTY, None, selection
    status, error = await _drive(runtime, org_id, session_id, request_id, selection.entry_ids, by)
    return status, error, selection


async def _drive(
    runtime: Runtime,
    org_id: str,
    session_id: str,
    request_id: str,
    only: AbstractSet[str] | None,
    by: str | None = None,
) -> tuple[RollbackStatus, str | None]:
    """Claim and run entries (all, or `only` these) until there is nothing this runner can do."""
    while True:
        claimed = await runtime.saga.claim(org_id, session_id, ExecutionMode.PROXY, only, by)
        if isinstance(claimed, RollbackStatus):
            return claimed, None
        error = await _run_claim(runtime, claimed, request_id)
        if error is not None:
            return RollbackStatus.COMPENSATION_FAILED, error
