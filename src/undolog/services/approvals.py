"""Approve and run: a decision on an approval, and the approved call run once.

Every path that decides an approval goes through here — a person's approve or reject (the
REST route, the CLI and the dashboard through it), and the sweep that applies an org's timeout
policy — so that an approved proxy-executed call runs exactly when and once its approval is
decided, whoever decided it:

- `decide` records a person's verdict and, when it approves (and no other approver is still
  required), runs the call now (`calls.run_approved`). When the org's timeout policy approved
  the call first, the person is told so (`ResolvedByPolicy`, 409) and the policy's approved
  call runs all the same;
- `apply_policy` does the same for what the sweep decided.

An SDK-executed call is not run here: the agent's retry of the call runs it
(`Decided.execution` is None).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from undolog.engine.approvals import DecisionResult, ResolvedByPolicy, Verdict
from undolog.services.calls import Execution, run_approved
from undolog_sdk.wire import ApprovalStatus

if TYPE_CHECKING:
    from undolog.runtime import Runtime

__all__ = ["Decided", "apply_policy", "decide"]


@dataclass(frozen=True)
class Decided:
    """A decision and, if it ran the call, how that went."""

    result: DecisionResult
    execution: Execution | None  # None: nothing ran (rejected, more approvers, or SDK mode)

    @property
    def awaiting_approvers(self) -> bool:
        """Approved by this person, but a rule asks for more approvers: nothing runs yet."""
        return self.result.approval.status == ApprovalStatus.PENDING


async def decide(
    runtime: Runtime,
    org_id: str,
    approval_id: str,
    verdict: Verdict,
    *,
    decided_by: str,
    approver_key_id: str | None,
    request_id: str,
    reason: str | None = None,
    args: dict[str, Any] | None = None,
    seen_args_hash: str | None = None,
) -> Decided:
    """Record `verdict` on the approval (its decider from the caller's key), and run the call
    if that approved it.

    Raises:
        ResolvedByPolicy: the org's timeout policy approved it first (its call ran here).
        UndoLogError: whatever `Approvals.decide` refuses (not found, decided, forbidden,
            arguments changed, ...).
    """
    try:
        result = await runtime.approvals.decide(
            org_id, approval_id, verdict, reason=reason, decided_by=decided_by,
            approver_key_id=approver_key_id, args=args, seen_args_hash=seen_args_hash,
        )  # fmt: skip
    except ResolvedByPolicy as exc:
        if exc.result.run is not None:  # too late: the policy approved it, so it runs now, once
            await run_approved(runtime, exc.result, request_id)
        raise
    execution = None
    if verdict is Verdict.APPROVE and result.approval.status != ApprovalStatus.PENDING:
        execution = await run_approved(runtime, result, request_id)
    return Decided(result, execution)


async def apply_policy(runtime: Runtime, result: DecisionResult) -> Decided:
    """Run what the sweep decided under the org's timeout policy (an auto-approved call)."""
    request_id = f"sweep-{result.approval.approval_id}"
    return Decided(result, await run_approved(runtime, result, request_id))
