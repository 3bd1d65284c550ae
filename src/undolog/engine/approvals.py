"""Human decisions on IRREVERSIBLE calls: approve, reject, and the timeout sweep.

A decision is one transaction that moves the approval out of `pending` only if it is still
there (`UPDATE ... WHERE status = 'pending'`), so of two people clicking at once on two proxy
processes exactly one wins and the other gets `ApprovalAlreadyResolved`. Approving a
proxy-executed call also moves its effect to `executing` in that transaction: the caller (the
proxy) then runs the tool once and commits it. An SDK-executed call stays `awaiting_approval`
with its approval approved; the agent's retry gets Execute. Rejecting halts the session.

An approval is for one exact argument set (`changes.py`): an approver's edit starts a new
round and passes the org's policy rules again (a `deny` refuses it, a `require` may raise the
number of approvers, never lower it), and the key that made a call never approves it unless
the operator allows it for a single-person setup (`allow_self_approval`).
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson

from undolog.engine.changes import (
    Approver,
    Edit,
    approvers_after,
    args_hash,
    check_edit,
)
from undolog.engine.core import Engine
from undolog.engine.decide import Action
from undolog.engine.model import Decision, lock_key
from undolog.engine.rules import Rule, RuleAction
from undolog.engine.states import ApprovalStatus, EffectState, SessionState
from undolog.store.protocol import Queries
from undolog.store.records import ApprovalRecord, EffectRecord
from undolog_sdk.errors import (
    ApprovalAlreadyResolved,
    ApprovalTimedOut,
    InvalidRequest,
    NotFound,
    PolicyDenied,
    SessionClosed,
)
from undolog_sdk.wire import EventType, ExecutionMode, scrub

__all__ = ["LISTABLE_STATUSES", "Approvals", "DecisionResult", "ResolvedByPolicy", "Verdict"]

LISTABLE_STATUSES = frozenset(s.value for s in ApprovalStatus)
MAX_TEXT = 2000


class Verdict(enum.Enum):
    APPROVE = "approve"
    REJECT = "reject"


@dataclass(frozen=True)
class DecisionResult:
    """What a decision did. `run` is set when the caller must now run the tool (proxy mode)."""

    approval: ApprovalRecord
    effect: EffectRecord
    run: Decision | None = None


class ResolvedByPolicy(ApprovalAlreadyResolved):
    """A decision that came after the deadline of an org that auto-approves: the policy
    approved the call first. On the wire it is `approval_already_resolved`; `result` is the
    policy's decision, whose `run` (proxy mode) the caller must still carry out."""

    def __init__(self, approval_id: str, result: DecisionResult) -> None:
        super().__init__(approval_id)
        self.result = result


def _now_us() -> int:
    return time.time_ns() // 1000


def _clean_text(value: str | None, name: str) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str):
        raise InvalidRequest(f"'{name}' must be a string")
    if len(value) > MAX_TEXT:
        raise InvalidRequest(f"'{name}' is longer than {MAX_TEXT} characters")
    return scrub(value)


@dataclass(frozen=True, slots=True)
class _Ask:
    """An approver's request: who, their edit, the hash of the arguments they saw, and the
    `require` rule their edit matched (None: none, or no edit)."""

    who: Approver
    edit: Edit | None
    seen_hash: str | None
    rule: Rule | None


def _is_hash(value: Any) -> bool:
    return (
        isinstance(value, str) and len(value) == 64 and all(c in "0123456789abcdef" for c in value)
    )


class Approvals:
    """Decisions and the sweep, on top of the engine (which starts approved executions)."""

    def __init__(
        self,
        engine: Engine,
        *,
        clock_us: Callable[[], int] = _now_us,
        allow_self_approval: bool = False,
    ) -> None:
        """`allow_self_approval`: the key that made a call may approve it, when it needs one
        approver (a single-person setup; the `allow_self_approval` setting, default off)."""
        self.engine = engine
        self.store = engine.store
        self._clock = clock_us
        self._allow_self_approval = allow_self_approval

    async def list_approvals(
        self, org_id: str, status: str | None = ApprovalStatus.PENDING, limit: int = 100
    ) -> list[ApprovalRecord]:
        if status is not None and status not in LISTABLE_STATUSES:
            raise InvalidRequest(
                f"invalid state {status!r}: one of {', '.join(sorted(LISTABLE_STATUSES))}"
            )
        async with self.store.reader() as q:
            return await q.list_approvals(org_id, status, limit)

    async def get(self, org_id: str, approval_id: str) -> ApprovalRecord:
        async with self.store.reader() as q:
            approval = await q.get_approval(org_id, approval_id)
        if approval is None:
            raise NotFound(f"approval '{approval_id}' not found")
        return approval

    async def decide(
        self,
        org_id: str,
        approval_id: str,
        verdict: Verdict,
        *,
        reason: str | None = None,
        decided_by: str | None = None,
        approver_key_id: str | None = None,
        args: Any = None,
        seen_args_hash: str | None = None,
    ) -> DecisionResult:
        """Approve or reject a pending approval.

        `args` (approve only, None: unchanged) are the arguments the call runs with instead of
        the requested ones (docs/approvals.md, "Approve with changes"); they pass the org's
        policy rules again. `seen_args_hash` (approve only) is the `args_hash` of the
        arguments the approver was shown. An approval that needs N approvers (a `require`
        rule) stays pending until N distinct keys approved the same arguments; the key that
        made the call cannot approve it (unless `allow_self_approval`, for one approver).

        Raises:
            NotFound: no such approval in this org.
            ApprovalAlreadyResolved: it was decided already (by a person or by the sweep).
            ResolvedByPolicy: its deadline passed and the org auto-approves: the policy
                approved it now, and the caller must run `error.result.run` if set.
            ApprovalTimedOut: its deadline passed before this decision.
            SessionClosed: approving a call whose session no longer runs.
            InvalidRequest: `args` or `seen_args_hash` with a rejection, `args` not a JSON
                object or over the bounds.
            Forbidden: the key that made the call approving it.
            PolicyDenied: `args` that a `deny` rule matches.
            ApprovalArgsChanged: the arguments the call would run with are not the ones the
                approver saw (another approver's edit).
        """
        reason = _clean_text(reason, "reason")
        decided_by = _clean_text(decided_by, "decided_by")
        edit = None
        if verdict is Verdict.REJECT and (args is not None or seen_args_hash is not None):
            raise InvalidRequest("'args' and 'args_hash' go with an approval, not a rejection")
        if args is not None:
            edit = check_edit(args)
        if seen_args_hash is not None and not _is_hash(seen_args_hash):
            raise InvalidRequest("'args_hash' must be 64 lowercase hex characters")
        stricter = None if edit is None else await self._edit_rule(org_id, approval_id, edit)
        who = Approver(approver_key_id, decided_by)
        ask = _Ask(who, edit, seen_args_hash, stricter)
        async with self.store.transaction(lock_key=lock_key("approval", org_id, approval_id)) as q:
            outcome = await self._decide(q, org_id, approval_id, verdict, reason, ask)
        if isinstance(outcome, Exception):  # raised only now, so the expiry it found is kept
            raise outcome
        return outcome

    async def _edit_rule(self, org_id: str, approval_id: str, edit: Edit) -> Rule | None:
        """An edit passes the org's policy rules as a new call with its arguments would:
        a `deny` refuses it (`PolicyDenied`); a `require` is returned (it may ask for more
        approvers). The tool and the requested arguments of an approval never change, so
        this is read before the decision's transaction."""
        approval = await self.get(org_id, approval_id)
        if edit.args_json == approval.args_json:  # the requested arguments: no edit
            return None
        rule = await self.engine.match_rule(
            org_id, approval.tool_name, orjson.loads(edit.args_json)
        )
        if rule is not None and rule.action is RuleAction.DENY:
            raise PolicyDenied(rule.name, approval.tool_name)
        return rule if rule is not None and rule.action is RuleAction.REQUIRE else None

    async def _decide(
        self,
        q: Queries,
        org_id: str,
        approval_id: str,
        verdict: Verdict,
        reason: str | None,
        ask: _Ask,
    ) -> DecisionResult | Exception:
        now = self._clock()
        who, edit = ask.who, ask.edit
        decided_by = who.by
        approval = await q.get_approval(org_id, approval_id)
        if approval is None:
            raise NotFound(f"approval '{approval_id}' not found")
        if approval.status != ApprovalStatus.PENDING:
            if approval.status == ApprovalStatus.TIMED_OUT:
                raise ApprovalTimedOut(approval_id)
            raise ApprovalAlreadyResolved(approval_id)
        effect = await q.get_effect(org_id, approval.effect_id)
        assert effect is not None
        if approval.timeout_us <= now:  # expired, not yet swept: the policy decides first
            expired = await self._expire(q, approval, effect, now)
            if expired.approval.status == ApprovalStatus.TIMED_OUT:
                return ApprovalTimedOut(approval_id)
            return ResolvedByPolicy(approval_id, expired)
        if verdict is Verdict.REJECT:
            return await self._reject(q, approval, effect, now, reason, decided_by)
        session = await q.get_session(org_id, approval.session_id)
        if session is None or session.state != SessionState.ACTIVE:
            raise SessionClosed(approval.session_id, session.state if session else "?")
        if edit is not None and effect.mode != ExecutionMode.PROXY:
            raise InvalidRequest(
                "'args' needs a proxy-executed call: an SDK-executed call runs the agent's own "
                "arguments"
            )
        stricter: dict[str, Any] = {}  # an edit a stricter `require` rule matches
        if ask.rule is not None and ask.rule.approvers > approval.approvers_required:
            stricter = {"rule": ask.rule.name, "approvers_required": ask.rule.approvers}
            approval = dataclasses.replace(approval, **stricter)
        approved_by, approved_args = approvers_after(
            approval, who, edit, ask.seen_hash, allow_self_approval=self._allow_self_approval
        )
        if len(approved_by) < approval.approvers_required:  # more approvers to come
            return await self._partly_approve(
                q, approval, effect, approved_by, approved_args, now, stricter
            )
        return await self._approve(
            q, approval, effect, ApprovalStatus.APPROVED, now, reason, decided_by,
            approved_by=orjson.dumps(approved_by).decode(), approved_args=approved_args,
            **stricter,
        )  # fmt: skip

    async def _partly_approve(
        self,
        q: Queries,
        approval: ApprovalRecord,
        effect: EffectRecord,
        approved_by: list[dict[str, Any]],
        approved_args: str | None,
        now: int,
        stricter: dict[str, Any],
    ) -> DecisionResult:
        """One of N approvers approved: record it, and announce it (`approval_partially_
        approved`: so far / needed, who, and the `args_hash` approved) unless nothing
        changed (the same key again). `stricter`: the rule and approvers an edit asked for."""
        by_json = orjson.dumps(approved_by).decode()
        org_id, approval_id = approval.org_id, approval.approval_id
        await q.update_approval(
            org_id, approval_id, expect_status=ApprovalStatus.PENDING.value,
            approved_by=by_json, approved_args=approved_args, **stricter,
        )  # fmt: skip
        if by_json != approval.approved_by_json or approved_args != approval.approved_args_json:
            payload: dict[str, Any] = {
                "approval_id": approval_id, "tool_name": approval.tool_name,
                "rule": approval.rule, "approvals": len(approved_by),
                "approvers_required": approval.approvers_required,
                "approver": approved_by[-1].get("by"),
                "args_hash": args_hash(approved_args or approval.args_json),
            }  # fmt: skip
            if approved_args is not None:  # an edit, as a digest (docs/audit.md)
                payload["approved_args_sha256"] = hashlib.sha256(approved_args.encode()).hexdigest()
            await q.insert_event(
                org_id, EventType.APPROVAL_PARTIALLY_APPROVED, approval.session_id,
                approval.effect_id, orjson.dumps(payload).decode(), now,
            )  # fmt: skip
        waiting = await q.get_approval(org_id, approval_id)
        assert waiting is not None
        return DecisionResult(waiting, effect)

    async def _approve(
        self,
        q: Queries,
        approval: ApprovalRecord,
        effect: EffectRecord,
        status: ApprovalStatus,
        now: int,
        reason: str | None,
        decided_by: str | None,
        **changes: Any,
    ) -> DecisionResult:
        """Approve (by a person or by the timeout policy); `changes`: the approvers and the
        changed arguments of a person's approval."""
        changed = await q.update_approval(
            approval.org_id, approval.approval_id, expect_status=ApprovalStatus.PENDING.value,
            status=status.value, decided_us=now, decided_by=decided_by, reason=reason, **changes,
        )  # fmt: skip
        if not changed:
            raise ApprovalAlreadyResolved(approval.approval_id)
        approved_args = changes.get("approved_args", approval.approved_args_json)
        payload = {
            "approval_id": approval.approval_id,
            "status": status.value,
            "tool_name": approval.tool_name,
            "decided_by": decided_by,
            "reason": reason,
            "args_hash": args_hash(approved_args or approval.args_json),  # what runs
        }
        if approved_args is not None:  # an edit is on record, as a digest (docs/audit.md)
            payload["approved_args_sha256"] = hashlib.sha256(approved_args.encode()).hexdigest()
        await q.insert_event(
            approval.org_id, EventType.APPROVAL_APPROVED, approval.session_id, approval.effect_id,
            orjson.dumps(payload).decode(), now,
        )  # fmt: skip
        decided = await q.get_approval(approval.org_id, approval.approval_id)
        assert decided is not None
        run = None
        if effect.mode == ExecutionMode.PROXY:
            tool = await q.get_tool(approval.org_id, effect.tool_name)
            if tool is None:  # unregistered since: nothing can run; the effect stays waiting
                return DecisionResult(decided, effect)
            plan = await self.engine.apply_action(
                q, Action.EXECUTE_APPROVED, tool, effect, decided, now
            )
            run = plan.decision
        moved = await q.get_effect(approval.org_id, approval.effect_id)
        assert moved is not None
        return DecisionResult(decided, moved, run)

    async def _reject(
        self,
        q: Queries,
        approval: ApprovalRecord,
        effect: EffectRecord,
        now: int,
        reason: str | None,
        decided_by: str | None,
    ) -> DecisionResult:
        changed = await q.update_approval(
            approval.org_id, approval.approval_id, expect_status=ApprovalStatus.PENDING.value,
            status=ApprovalStatus.REJECTED.value, decided_us=now, decided_by=decided_by,
            reason=reason,
        )  # fmt: skip
        if not changed:
            raise ApprovalAlreadyResolved(approval.approval_id)
        await self._close_effect(q, effect, EffectState.REJECTED, now)
        session = await q.get_session(approval.org_id, approval.session_id)
        if session is not None and session.state == SessionState.ACTIVE:
            await q.update_session(
                approval.org_id, approval.session_id, now, state=SessionState.HALTED
            )
        await q.insert_event(
            approval.org_id, EventType.APPROVAL_REJECTED, approval.session_id, approval.effect_id,
            orjson.dumps({"approval_id": approval.approval_id, "tool_name": approval.tool_name,
                          "decided_by": decided_by, "reason": reason}).decode(),
            now,
        )  # fmt: skip
        decided = await q.get_approval(approval.org_id, approval.approval_id)
        moved = await q.get_effect(approval.org_id, approval.effect_id)
        assert decided is not None and moved is not None
        return DecisionResult(decided, moved)

    async def _close_effect(
        self, q: Queries, effect: EffectRecord, target: EffectState, now: int
    ) -> None:
        await q.update_effect(
            effect.org_id, effect.effect_id, expect_state=EffectState.AWAITING_APPROVAL.value,
            state=target.value, finished_us=now, updated_us=now,
        )  # fmt: skip

    async def _expire(
        self, q: Queries, approval: ApprovalRecord, effect: EffectRecord, now: int
    ) -> DecisionResult:
        """Apply the org's timeout policy to one expired approval."""
        org = await q.get_org(approval.org_id)
        if org is not None and org.auto_approve_on_timeout:
            session = await q.get_session(approval.org_id, approval.session_id)
            if session is not None and session.state == SessionState.ACTIVE:
                return await self._approve(
                    q, approval, effect, ApprovalStatus.AUTO_APPROVED, now,
                    "approval timed out; the org auto-approves", "policy",
                )  # fmt: skip
        changed = await q.update_approval(
            approval.org_id, approval.approval_id, expect_status=ApprovalStatus.PENDING.value,
            status=ApprovalStatus.TIMED_OUT.value, decided_us=now, decided_by="policy",
            reason="approval timed out",
        )  # fmt: skip
        if changed:
            await self._close_effect(q, effect, EffectState.TIMED_OUT, now)
            await q.insert_event(
                approval.org_id, EventType.APPROVAL_TIMED_OUT, approval.session_id,
                approval.effect_id,
                orjson.dumps({"approval_id": approval.approval_id,
                              "tool_name": approval.tool_name}).decode(),
                now,
            )  # fmt: skip
        decided = await q.get_approval(approval.org_id, approval.approval_id)
        moved = await q.get_effect(approval.org_id, approval.effect_id)
        assert decided is not None and moved is not None
        return DecisionResult(decided, moved)

    async def sweep(self, limit: int = 100) -> list[DecisionResult]:
        """Time out (or auto-approve) every expired pending approval, once across instances."""
        async with self.store.transaction() as q:
            now = self._clock()
            results = []
            for approval in await q.claim_expired_approvals(now, limit):
                effect = await q.get_effect(approval.org_id, approval.effect_id)
                if effect is None:  # pragma: no cover - a foreign key guarantees it
                    continue
                results.append(await self._expire(q, approval, effect, now))
            return results
