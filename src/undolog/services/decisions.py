"""Waiting for a person's decision on an approval, for REST's `?wait=N` and the MCP gateway
(docs/mcp.md, "Long waits"): the runtime's `Waits` woken by the event broker, with the
approval and its effect read back from the store. Apart from services/waits.py so that the
runtime, which builds `Waits`, is not imported back by it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from undolog_sdk.wire import ApprovalStatus, EffectState

if TYPE_CHECKING:
    from undolog.runtime import Runtime

__all__ = ["wait_for_decision"]

# An approved call whose run has not finished yet.
_STILL_RUNNING = frozenset({EffectState.AWAITING_APPROVAL.value, EffectState.EXECUTING.value})


async def wait_for_decision(
    runtime: Runtime,
    org_id: str,
    approval_id: str,
    effect_id: str,
    *,
    key_id: str,
    seconds: float,
    run_finished: bool = False,
) -> bool:
    """Wait until the approval is decided (with `run_finished`, also until an approved
    run has finished), or `seconds` pass; whether it was. Raises `TooManyWaits` over the
    caps."""
    waits = runtime.waits
    if waits is None or seconds <= 0:
        return False

    async def settled() -> bool:
        approval = await runtime.approvals.get(org_id, approval_id)
        if approval.status == ApprovalStatus.PENDING:
            return False
        if not run_finished:
            return True
        async with runtime.store.reader() as q:
            effect = await q.get_effect(org_id, effect_id)
        return effect is None or effect.state not in _STILL_RUNNING

    with waits.slot(key_id):
        return await waits.until(org_id, effect_id, settled, seconds)
