"""Compensations the SDK runs, and the SDK's part in unwinding a session.

A COMPENSABLE tool executed by the SDK names its compensation by `fn_name`; register the
function with `@compensation("fn_name")`. When the session is rolled back, the proxy runs the
entries whose compensation lives on the tool server and hands the SDK the ones that live
here, always the top of the stack first: the SDK claims the entry (receiving a claim token),
calls the function with the captured args plus `original_args` and `original_result`, retries
it up to `max_retries` times `retry_backoff_ms` apart, and reports the outcome with the token;
the last failure escalates (`CompensationFailed`) and stops the unwinding.

    @compensation("undo_send_email")
    async def undo_send_email(*, original_result, **_):
        await mail.recall(original_result["message_id"])
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from undolog_sdk import errors as _errors
from undolog_sdk.wire import RollbackOutcome

if TYPE_CHECKING:
    from undolog_sdk.client import UndoLogClient

__all__ = ["compensation", "registered_compensation", "unwind"]

Compensation = Callable[..., Awaitable[Any]]

_REGISTRY: dict[str, Compensation] = {}
DONE_OUTCOMES = frozenset({RollbackOutcome.COMPENSATED, RollbackOutcome.EMPTY})
_LEGACY_BLOCKED = "blocked"  # what proxies before 0.x answered for `effect_in_doubt`
BUSY_DEADLINE_SECONDS = 120.0


def compensation(fn_name: str) -> Callable[[Compensation], Compensation]:
    """Register an async function as the compensation named `fn_name`.

    It is called with keyword arguments: the descriptor's captured `args`, plus
    `original_args` (the forward call's arguments) and `original_result` (what it returned).
    """
    if not fn_name:
        raise ValueError("a compensation needs a name")

    def register(fn: Compensation) -> Compensation:
        if not asyncio.iscoroutinefunction(fn):
            raise TypeError(f"@compensation needs an async function, got {fn!r}")
        _REGISTRY[fn_name] = fn
        return fn

    return register


def registered_compensation(fn_name: str) -> Compensation | None:
    """The function registered under `fn_name`, if any."""
    return _REGISTRY.get(fn_name)


async def _run_entry(client: UndoLogClient, org_id: str, entry_id: str) -> bool:
    """Claim, run and report one entry; False if another runner claimed it first, or took it
    over after our claim lapsed (its outcome is then that runner's to report)."""
    try:
        claim = await client.claim_undo(org_id, entry_id)
    except _errors.InvalidStateTransition:
        return False
    fn = _REGISTRY.get(claim["fn_name"])
    token = str(claim["claim_token"])
    backoff = claim["retry_backoff_ms"] / 1000
    try:
        for attempt in range(max(1, claim["attempts_left"])):
            if attempt:
                await asyncio.sleep(backoff)
            if fn is None:
                error = f"no compensation named '{claim['fn_name']}' is registered in this agent"
            else:
                try:
                    await fn(**claim["payload"])
                except Exception as exc:  # the compensation's own failure: report and retry
                    error = f"{type(exc).__name__}: {exc}"
                else:
                    await client.complete_undo(org_id, entry_id, token)
                    return True
            # Raises CompensationFailed after the last attempt.
            await client.fail_undo(org_id, entry_id, error, token)
    except _errors.ClaimNotHeld:
        return False
    return True


async def unwind(
    client: UndoLogClient, org_id: str, session_id: str, selection: dict[str, Any] | None = None
) -> str:
    """Roll the session back (or undo the `selection` of its entries: see
    `UndoLogClient.rollback_session`), running the SDK's entries here; returns the final
    outcome.

    Raises:
        CompensationFailed: an entry exhausted its retries (the unwinding stopped there).
        EffectInDoubt: an entry's forward call is in doubt; an operator must resolve it.
    """
    deadline = time.monotonic() + BUSY_DEADLINE_SECONDS
    while True:
        answer = await (
            client.rollback_session(org_id, session_id)
            if selection is None
            else client.rollback_session(org_id, session_id, selection)
        )
        outcome = str(answer["outcome"])
        if outcome in DONE_OUTCOMES:
            return outcome
        entry = answer.get("next_entry") or {}
        # A lost claim (another runner claimed the entry between the proxy's answer and ours)
        # falls through to the wait for `in_progress` below, then asks again.
        if outcome == RollbackOutcome.WAITING_FOR_RUNNER and await _run_entry(
            client, org_id, entry["entry_id"]
        ):
            continue
        if outcome == RollbackOutcome.COMPENSATION_FAILED:
            raise _errors.CompensationFailed(
                str(answer.get("fn_name") or entry.get("fn_name") or "?"),
                int(answer.get("retries") or entry.get("max_retries") or 0),
                str(answer.get("reason") or entry.get("last_error") or answer.get("message")),
            )
        if outcome in (RollbackOutcome.BLOCKED, _LEGACY_BLOCKED):
            raise _errors.EffectInDoubt(str(entry.get("effect_id")))
        # in_progress (or a lost claim): another runner holds the top entry; wait for it, within a
        # deadline.
        if time.monotonic() > deadline:
            raise _errors.InProgress(str(entry.get("effect_id")), int(answer.get("retry_after", 1)))
        await asyncio.sleep(min(1.0, float(answer.get("retry_after") or 1)))
