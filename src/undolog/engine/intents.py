"""What a new call writes: its effect, its undo entry, and the approval a policy rule decided.

The engine's intercept (`core.py`) decides; these build the rows it writes. A rule that
approves an IRREVERSIBLE call leaves an approval decided by the rule (`decided_by =
rule:NAME`), so the audit trail shows who let it through (docs/approvals.md).
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
from dataclasses import dataclass
from typing import Any

import orjson

from undolog.engine.decide import Action, decide
from undolog.engine.effects import Effects
from undolog.engine.expr_ops import INLINE_STEPS, Budget, Spill
from undolog.engine.model import Call, event_json, new_id
from undolog.engine.rules import Match, Rule, match
from undolog.engine.states import ApprovalStatus, EffectState, SessionState, UndoState
from undolog.store.protocol import Queries
from undolog.store.records import ApprovalRecord, EffectRecord, ToolRecord, UndoEntryRecord
from undolog_sdk.errors import InvalidRequest
from undolog_sdk.signature import canonical_json
from undolog_sdk.tier import CompensationDescriptor, ToolTier
from undolog_sdk.wire import EventType

__all__ = ["DryRun", "Intents"]


@dataclass(frozen=True, slots=True)
class DryRun:
    """What a new call would meet, recorded nowhere: the rule it hits (None: no rule) and
    the decision (`execute`, `approval` or `deny`) with the approvers an approval needs."""

    tool: ToolRecord
    rule: Rule | None
    decision: str
    approvers: int
    error: str | None = None  # a condition that could not be decided (its rule failed closed)


@functools.lru_cache(maxsize=1024)
def _compensation(compensation_json: str) -> tuple[str, str, str, int, int]:
    """A registered compensation as an undo entry spells it (name, version, canonical args,
    retries, backoff): parsed once per registration, not on every call that may push it."""
    descriptor = CompensationDescriptor.from_dict(orjson.loads(compensation_json))
    args_json = canonical_json(descriptor.args)
    return (descriptor.fn_name, descriptor.fn_version, args_json, descriptor.max_retries,
            descriptor.retry_backoff_ms)  # fmt: skip


def declared_tiers(payload: dict[str, Any], call: Call) -> dict[str, Any]:
    """An event's payload with the declared and registered tiers of a call that declared one
    (the payload's `tier` is the one it ran under: the stricter)."""
    if call.applied is not None:
        payload["declared_tier"] = call.applied.declared_tier.value
        payload["registered_tier"] = call.applied.registered_tier.value
    return payload


class Intents(Effects):
    """The rows of a new call, for the `Engine`."""

    lease_us: int

    async def dry_run(self, org_id: str, tool_name: str, args: Any) -> DryRun:
        """Which rule a new call of this tool with these args would hit, and the decision,
        by the very table intercept uses; nothing is read but the tool and the rules.

        Raises:
            ToolNotRegistered: no such tool in the org.
            InvalidRequest: args that are not a JSON object.
        """
        if not isinstance(args, dict):
            raise InvalidRequest("args must be a JSON object")
        try:  # the checks of a call's args, so the answer is the one a call would get
            canonical_json(args)
        except ValueError as exc:
            raise InvalidRequest(f"args cannot be canonicalised: {exc}") from None
        tool = await self.get_tool(org_id, tool_name)
        tier = ToolTier(tool.tier)
        if tier.is_safe:  # never recorded, so no rule applies
            return DryRun(tool, None, "execute", 0)
        found = await self.match_rules(org_id, tool_name, args)
        rule = found.rule
        action = decide(
            tier=tier, existing=None, session_state=SessionState.ACTIVE, approval_status=None,
            now_us=self._clock(), idempotent_upstream=tool.idempotent_upstream,
            rule_action=rule.action.value if rule else None,
        )  # fmt: skip
        if action is Action.DENY_NEW:
            return DryRun(tool, rule, "deny", 0, found.error)
        if action is Action.AWAIT_NEW:
            return DryRun(tool, rule, "approval", rule.approvers if rule else 1, found.error)
        return DryRun(tool, rule, "execute", 0, found.error)

    async def match_rule(self, org_id: str, tool_name: str, args: Any) -> Rule | None:
        """The org's first policy rule that a call of this tool with these args hits (a
        `deny` or `require` rule whose condition cannot be decided counts as hit)."""
        return (await self.match_rules(org_id, tool_name, args)).rule

    async def match_rules(self, org_id: str, tool_name: str, args: Any) -> Match:
        """`match_rule` with the reason a rule failed closed. A match that takes more than
        `INLINE_STEPS` runs again in a thread with the full budget, so no call's rules hold
        the event loop for more than a few milliseconds."""
        rules = await self.get_rules(org_id)
        if not rules:
            return Match(None)
        try:
            return match(rules, tool_name, args, Budget(INLINE_STEPS, spill=True))
        except Spill:
            return await asyncio.to_thread(match, rules, tool_name, args)

    async def _record_rule_approval(
        self, q: Queries, call: Call, effect: EffectRecord, rule: Rule, now: int
    ) -> None:
        """An IRREVERSIBLE call a rule approved: its approval, decided by the rule, so the
        decision and its maker are on record like a person's (`decided_by = rule:NAME`)."""
        approval = ApprovalRecord(
            approval_id=new_id(), org_id=call.org_id, effect_id=effect.effect_id,
            session_id=call.session_id, tool_name=call.tool.name, args_json=call.args_json,
            status=ApprovalStatus.AUTO_APPROVED, created_us=now, timeout_us=now,
            decided_us=now, decided_by=rule.decided_by, reason="approved by a policy rule",
            rule=rule.name, requested_by_key_id=call.actor.key_id,
        )  # fmt: skip
        await q.insert_approval(approval)
        await q.insert_event(
            call.org_id, EventType.APPROVAL_APPROVED, call.session_id, effect.effect_id,
            event_json({"approval_id": approval.approval_id, "status": approval.status,
                        "tool_name": call.tool.name, "decided_by": rule.decided_by,
                        "rule": rule.name, "reason": approval.reason}),
            now,
        )  # fmt: skip

    async def _record_denial(
        self, q: Queries, call: Call, rule: Rule, step: int | None, now: int
    ) -> None:
        """A new call a `deny` rule refused: only an event (`call_denied`), in the decision's
        transaction, so the audit shows who asked, for what, and which rule refused; no
        effect, undo entry or approval (nothing ran). The args are kept as their SHA-256,
        as the audit keeps a call's."""
        args_sha256 = hashlib.sha256(call.args_json.encode("utf-8")).hexdigest()
        by = f"key:{call.actor.key_name}" if call.actor.key_name else None
        await q.insert_event(
            call.org_id, EventType.CALL_DENIED, call.session_id, None,
            event_json({"decision": "denied", "decided_by": rule.decided_by, "rule": rule.name,
                        "requested_by": by, "tool_name": call.tool.name, "tier": call.tier.value,
                        "step_index": step, "args_sha256": args_sha256}),
            now,
        )  # fmt: skip

    def _new_effect(
        self, call: Call, step: int, signature: str, now: int, *, executing: bool
    ) -> EffectRecord:
        """A new effect: `executing` under a fresh lease, or awaiting approval."""
        executed = max(self._clock(), now + 1) if executing else None
        return EffectRecord(
            effect_id=new_id(),
            org_id=call.org_id,
            session_id=call.session_id,
            step_index=step,
            tool_name=call.tool.name,
            tool_version=call.tool_version or call.tool.version,
            tier=call.tool.tier,
            call_signature=signature,
            args_json=call.args_json,
            state=EffectState.EXECUTING if executing else EffectState.AWAITING_APPROVAL,
            mode=call.mode,
            attempts=1,
            result_json=None,
            error=None,
            lease_expires_us=(executed + self.lease_us) if executed else None,
            executed_us=executed,
            finished_us=None,
            created_us=now,
            updated_us=now,
        )

    def _new_undo_entry(self, effect: EffectRecord, tool: ToolRecord) -> UndoEntryRecord | None:
        """The undo entry a new executing effect pushes (registered when it was created)."""
        if tool.compensation_json is None:
            return None
        return self._undo_entry(effect, tool.compensation_json, effect.created_us)

    @staticmethod
    def _intercepted_payload(effect: EffectRecord, call: Call) -> str:
        payload = {"stage": EffectState.EXECUTING, "tool_name": effect.tool_name,
                   "tier": effect.tier, "step_index": effect.step_index, "attempt": 1,
                   "mode": effect.mode}  # fmt: skip
        return event_json(declared_tiers(payload, call))

    def _undo_entry(
        self, effect: EffectRecord, compensation_json: str, registered_us: int
    ) -> UndoEntryRecord:
        fn_name, fn_version, args_json, max_retries, backoff_ms = _compensation(compensation_json)
        return UndoEntryRecord(
            seq=0,
            entry_id=new_id(),
            org_id=effect.org_id,
            session_id=effect.session_id,
            effect_id=effect.effect_id,
            fn_name=fn_name,
            fn_version=fn_version,
            args_json=args_json,
            max_retries=max_retries,
            retry_backoff_ms=backoff_ms,
            registered_us=registered_us,
            state=UndoState.PENDING,
            attempts=0,
            last_error=None,
            updated_us=registered_us,
            runner=effect.mode,
        )
