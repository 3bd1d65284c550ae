"""The engine: intercept, commit, fail and resolve over a store (orgs and tools: `registry`).

Each public method is one short transaction. Intercept reads first without a lock (a replay of
a committed call needs nothing more), then takes the signature's lock, decides with the pure
`decide` table and writes the intent durably before anything runs. The common new call is
the store's one operation (`Store.execute_new`: one round trip on PostgreSQL). What happens
to an existing effect (an action applied, in doubt, commit, fail, resolve) is in `effects`. The
engine knows nothing of HTTP: it raises the errors of `undolog_sdk.errors` and the proxy maps
them to the wire.
"""

from __future__ import annotations

import dataclasses
import functools
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

from undolog.engine.decide import Action, decide
from undolog.engine.effects import ANSWERED_STATES, Plan
from undolog.engine.intents import Intents, declared_tiers
from undolog.engine.model import (
    ORG_WIDE,
    Actor,
    Call,
    Decision,
    IntentLost,
    Outcome,
    event_json,
    new_id,
    now_us,
    session_lock_key,
)
from undolog.engine.owners import session_refused
from undolog.engine.registry import DEFAULT_APPROVAL_TIMEOUT_S
from undolog.engine.rules import RuleAction
from undolog.engine.states import (
    REPLAYABLE_STATES,
    ApprovalStatus,
    EffectState,
    SessionState,
)
from undolog.engine.tiers import applied, declared
from undolog.store.protocol import NewCall, NewRecords, Queries, Store
from undolog.store.records import (
    ApprovalRecord,
    EffectRecord,
    SessionRecord,
    ToolRecord,
)
from undolog_sdk.errors import (
    Database,
    DuplicateSignature,
    EffectInDoubt,
    InvalidRequest,
    PolicyDenied,
    SessionClosed,
    UndoLogError,
)
from undolog_sdk.signature import call_signature, canonical_json, signature_of_canonical
from undolog_sdk.tier import ToolTier
from undolog_sdk.wire import EventType, ExecutionMode

__all__ = ["Engine"]

MODES = tuple(ExecutionMode)
# A step-less call identical to an earlier one of the session is a retry of it while the client
# has not had that call's result: the call has not finished, it failed without a result (a
# retry runs it again on the same effect, with the same idempotency key), or it was refused
# for good (a rejected call stays rejected)...
_UNFINISHED_STATES = (
    EffectState.EXECUTING.value,
    EffectState.AWAITING_APPROVAL.value,
    EffectState.IN_DOUBT.value,
    EffectState.FAILED.value,
    EffectState.REJECTED.value,
    EffectState.TIMED_OUT.value,
)
# ...or it has a result that has not reached the client (`mark_delivered`): ANSWERED_STATES.

# The states a call replays from, as the store takes them (`Store.execute_new`).
_REPLAYABLE = tuple(sorted(state.value for state in REPLAYABLE_STATES))

# Effect states whose approval the decision needs: its id, status and reason, or (a run
# again) the args an approver changed the call to.
_APPROVAL_STATES = frozenset(
    {EffectState.AWAITING_APPROVAL, EffectState.REJECTED, EffectState.TIMED_OUT,
     EffectState.EXECUTING, EffectState.FAILED}
)  # fmt: skip


@functools.lru_cache(maxsize=4096)
def _session_uuid(session_id: str) -> str:
    """A session id as the store keeps it (`str(uuid.UUID(...))`), parsed once per session
    rather than on each of its calls. Raises what `uuid.UUID` raises (not cached)."""
    return str(uuid.UUID(session_id))


class Engine(Intents):
    """Exactly-once interception of tool calls over a `Store`.

    Args:
        store: where effects, undo entries, approvals and events live.
        lease_seconds: how long an Execute decision holds the call before a duplicate may
            treat the run as lost (`in_doubt`, or a re-run for an idempotent upstream).
        retry_after_seconds: upper bound of the `retry_after` hint of `in_progress`.
        tool_cache_seconds: how long a registered tool is cached in this process.
        clock_us: the clock, in microseconds since the epoch (injectable for tests).
    """

    def __init__(
        self,
        store: Store,
        *,
        lease_seconds: float = 60.0,
        retry_after_seconds: int = 5,
        tool_cache_seconds: float = 2.0,
        clock_us: Callable[[], int] = now_us,
    ) -> None:
        super().__init__(store, tool_cache_seconds=tool_cache_seconds, clock_us=clock_us)
        self.lease_us = int(lease_seconds * 1_000_000)
        self.retry_after_seconds = max(1, retry_after_seconds)
        # Replays whose event could not be written (the store refused the write): served anyway.
        self.replay_events_dropped = 0

    # -- intercept ---------------------------------------------------------------------------

    async def intercept(
        self,
        org_id: str,
        session_id: str,
        tool_name: str,
        args: Any,
        *,
        step_index: int | None = None,
        tool_version: str | None = None,
        mode: str = ExecutionMode.PROXY,
        actor: Actor = ORG_WIDE,
        declared_tier: str | None = None,
        declared_compensation: Any = None,
    ) -> Decision:
        """Decide what happens to one tool call, durably, before anything runs.

        `declared_tier` (and `declared_compensation`, SDK mode only: the SDK runs it) are what
        the caller's code declares: the call runs under the stricter of that tier and the
        registry's, with the declared compensation if given (`engine/tiers.py`); the
        decision's `applied` says both tiers.

        A session the call creates is recorded as `actor.key_id`'s. An actor held to its own
        sessions (an `agent` key) is refused a session another key owns, before anything is
        read or written.

        Raises:
            InvalidRequest: a session id that is not a UUID, a bad step, or args that cannot
                be canonicalised.
            Forbidden: the session is not the actor's (see `Actor.may_use`).
            ToolNotRegistered, InProgress, EffectInDoubt, SessionClosed, ApprovalRejected,
            ApprovalTimedOut, AdvisoryLockTimeout, Database.
        """
        if mode not in MODES:
            raise InvalidRequest(f"unknown execution mode {mode!r}: expected proxy or sdk")
        try:
            session_id = _session_uuid(session_id)
        except (ValueError, TypeError, AttributeError):
            raise InvalidRequest(f"session_id {session_id!r} is not a UUID") from None
        if step_index is not None and not 0 <= step_index <= 0xFFFFFFFF:
            raise InvalidRequest("step_index must be an unsigned 32-bit integer")
        try:
            args_json = canonical_json(args)
        except ValueError as exc:
            raise InvalidRequest(f"args cannot be canonicalised: {exc}") from None
        if declared_compensation is not None and mode != ExecutionMode.SDK:
            # The proxy runs a proxy-mode call's compensation on its upstream: only the
            # registry (an admin, the config) names that, never the caller.
            raise InvalidRequest("declared_compensation is taken in sdk mode only")
        declaration = declared(declared_tier, declared_compensation)
        tool = await self.get_tool(org_id, tool_name)
        applies = None
        if declaration is not None:
            applies = applied(tool, declaration)
            tool = applies.tool
        tier = ToolTier(tool.tier)
        # The org's policy rules, matched before anything is recorded; applied to a new call
        # only (a recorded call keeps its decision). SAFE calls are not recorded: no rules.
        rule = None if tier.is_safe else await self.match_rule(org_id, tool_name, args)
        call = Call(
            org_id, session_id, tool, tier, args, args_json, tool_version, mode, actor, rule,
            applies,
        )  # fmt: skip
        decision = await self._decide_call(call, step_index)
        return decision if applies is None else dataclasses.replace(decision, applied=applies)

    async def _decide_call(self, call: Call, step_index: int | None) -> Decision:
        """`intercept` once the call's inputs are checked and its tool and rule are known."""
        org_id, session_id, tool, tier, actor = (
            call.org_id, call.session_id, call.tool, call.tier, call.actor
        )  # fmt: skip
        one_call = step_index is not None and self._records_new(call)
        if actor.own_sessions_only and not one_call:
            # Checked before any read that could replay the session's calls; the store's
            # `execute_new` checks it itself, and the locked paths check it again.
            async with self.store.reader() as q:
                found, owner = await q.session_owner(org_id, "session", session_id)
            if found and not actor.may_use(owner):
                raise session_refused(session_id)
        if tier.is_safe:
            return Decision(Outcome.EXECUTE, new_id(), step_index, None, tool, logged=False)

        if step_index is not None:
            signature = signature_of_canonical(session_id, step_index, tool.name, call.args_json)
            fast = await self._execute_new(call, step_index, signature) if one_call else None
            if isinstance(fast, Decision):
                return fast
            seen = fast
            if seen is None:
                async with self.store.reader() as q:
                    seen = await q.get_effect_by_signature(org_id, signature)
            if seen is not None and seen.state in REPLAYABLE_STATES:
                return await self._replay(seen, tool)
            if seen is not None:
                # Answers that write nothing need no lock: a duplicate of a call that is
                # running under a live lease, or one already in doubt. This keeps a burst of
                # duplicates off the signature's lock.
                now = self._clock()
                lease = seen.lease_expires_us
                if seen.state == EffectState.EXECUTING and lease is not None and lease > now:
                    raise self._in_progress(seen, now)
                if seen.state == EffectState.IN_DOUBT:
                    raise EffectInDoubt(seen.effect_id)
            plan = await self._intercept_locked(
                call, step_index, signature, known_absent=seen is None
            )
        else:
            plan = await self._intercept_unnumbered(call)
        if plan.error is not None:
            raise plan.error
        assert plan.decision is not None
        return plan.decision

    def _records_new(self, call: Call) -> bool:
        """Whether a numbered call goes to the store's new-call operation (`_execute_new`):
        the decision table says a new call of an active session executes, and no policy rule
        matched (a rule's decision is recorded on the locked path)."""
        if call.tier.is_safe or call.rule is not None:
            return False
        action = decide(
            tier=call.tier,
            existing=None,
            session_state=SessionState.ACTIVE,
            approval_status=None,
            now_us=self._clock(),
            idempotent_upstream=call.tool.idempotent_upstream,
        )
        return action is Action.EXECUTE_NEW

    async def _execute_new(
        self, call: Call, step: int, signature: str
    ) -> Decision | EffectRecord | None:
        """A new call, or a replay, by the store's one operation (`execute_new`); only when
        `_records_new`, since the store inserts it only in exactly that situation.

        Returns the Execute or Replay decision, or the effect that has the signature (the
        caller replays it if it is replayable), or None (lock busy, session not active):
        the full path decides.
        Raises `Forbidden` when the session is another key's and the actor is held to its
        own (the store checks it before anything else).
        """
        built: list[EffectRecord] = []

        def records() -> NewRecords:
            # Called by the store only when it writes (or must send) the new call: a replay
            # does not pay for an effect, an undo entry and an event it never records.
            effect = self._new_effect(call, step, signature, self._clock(), executing=True)
            built.append(effect)
            event = (EventType.EFFECT_INTERCEPTED, self._intercepted_payload(effect, call))
            return effect, self._new_undo_entry(effect, call.tool), event

        try:
            outcome, existing = await self.store.execute_new(
                NewCall(call.org_id, call.session_id, signature, records),
                (
                    _REPLAYABLE,
                    EventType.EFFECT_REPLAYED,
                    self._replayed_payload(call.tool.name, step),
                ),
                owner=call.actor.key_id,
                owner_only=call.actor.own_sessions_only,
            )
        except Database as exc:
            if not built:  # nothing was sent to be written
                raise
            raise IntentLost(exc.detail, call.org_id, built[0].effect_id, 1) from exc
        if outcome == "forbidden":
            raise session_refused(call.session_id)
        if outcome == "inserted":
            return Decision(Outcome.EXECUTE, built[0].effect_id, step, signature, call.tool)
        if outcome == "replayed":
            assert existing is not None
            return self._replay_decision(existing, call.tool)
        return existing

    async def _replay(self, effect: EffectRecord, tool: ToolRecord) -> Decision:
        """A replay is a pure read: its `effect_replayed` event is written best-effort, on its
        own, so a store that cannot write (disk full, read-only) still serves replays."""
        try:
            async with self.store.autocommit() as q:
                await q.insert_event(
                    effect.org_id,
                    EventType.EFFECT_REPLAYED,
                    effect.session_id,
                    effect.effect_id,
                    self._replayed_payload(effect.tool_name, effect.step_index),
                    self._clock(),
                )
        except UndoLogError:
            self.replay_events_dropped += 1
        return self._replay_decision(effect, tool)

    @staticmethod
    async def _touch_session(q: Queries, call: Call, step: int, now: int) -> SessionRecord:
        """The call's session, created as the actor's if new; `Forbidden` (raised inside the
        transaction, so the touch is rolled back) when the actor may not use it."""
        session = await q.touch_session(call.org_id, call.session_id, step, now, call.actor.key_id)
        if not call.actor.may_use(session.owner_key_id):
            raise session_refused(call.session_id)
        return session

    async def _intercept_locked(
        self, call: Call, step: int, signature: str, *, known_absent: bool
    ) -> Plan:

        async def decide_in(q: Queries) -> Plan:
            now = self._clock()
            session = await self._touch_session(q, call, step, now)
            existing = (
                None if known_absent else await q.get_effect_by_signature(call.org_id, signature)
            )
            return await self._decide_and_apply(q, call, session, step, signature, existing)

        return await self._decided(call.org_id, signature, decide_in)

    async def _decided(
        self, org_id: str, lock_key: str, decide_in: Callable[[Queries], Awaitable[Plan]]
    ) -> Plan:
        """`decide_in` one transaction under `lock_key`. A connection lost at its commit may
        have recorded a run that the caller will never start: `IntentLost` names it."""
        plan: Plan | None = None
        try:
            async with self.store.transaction(lock_key=lock_key) as q:
                plan = await decide_in(q)
        except Database as exc:
            decision = plan.decision if plan is not None else None
            if decision is None or decision.outcome is not Outcome.EXECUTE or not decision.logged:
                raise
            raise IntentLost(exc.detail, org_id, decision.effect_id, decision.attempt) from exc
        assert plan is not None
        return plan

    async def _intercept_unnumbered(self, call: Call) -> Plan:
        """A call without a step: a retry of an identical call whose answer is owed, or the
        session's next step (see `_UNFINISHED_STATES` and `mark_delivered`)."""
        org_id, session_id, tool = call.org_id, call.session_id, call.tool
        # A retry of a committed call whose answer was lost replays without a write (and so
        # without the session's lock): a store that cannot write still serves it.
        async with self.store.reader() as q:
            seen = await q.find_unfinished_call(
                org_id, session_id, tool.name, call.args_json, _UNFINISHED_STATES, ANSWERED_STATES
            )
        if seen is not None and seen.state in REPLAYABLE_STATES:
            return Plan(decision=await self._replay(seen, tool))

        async def decide_in(q: Queries) -> Plan:
            now = self._clock()
            session = await self._touch_session(q, call, 0, now)
            match = await q.find_unfinished_call(
                org_id, session_id, tool.name, call.args_json, _UNFINISHED_STATES, ANSWERED_STATES
            )
            if match is not None:
                return await self._decide_and_apply(
                    q, call, session, match.step_index, match.call_signature, match
                )
            step = session.last_step + 1
            if step > 0xFFFFFFFF:
                raise InvalidRequest("session has no step indexes left")
            signature = call_signature(session_id, step, tool.name, call.args)
            existing = await q.get_effect_by_signature(org_id, signature)
            plan = await self._decide_and_apply(
                q, call, session, step, signature, existing, numbered=False
            )
            if plan.decision is not None or plan.error is None:
                await q.update_session(org_id, session_id, now, last_step=step)
            return plan

        return await self._decided(org_id, session_lock_key(org_id, session_id), decide_in)

    async def _decide_and_apply(
        self,
        q: Queries,
        call: Call,
        session: SessionRecord,
        step: int,
        signature: str,
        existing: EffectRecord | None,
        *,
        numbered: bool = True,
    ) -> Plan:
        """Decide and write; `numbered`: the caller named the step (a step-less call that a
        rule denies takes none)."""
        org_id, session_id, tool = session.org_id, session.session_id, call.tool
        for _ in range(2):  # a second round only after losing an insert race
            approval = None
            if existing is not None and existing.state in _APPROVAL_STATES:
                approval = await q.get_approval_for_effect(org_id, existing.effect_id)
            now = self._clock()
            action = decide(
                tier=call.tier,
                existing=existing,
                session_state=session.state,
                approval_status=approval.status if approval else None,
                now_us=now,
                idempotent_upstream=tool.idempotent_upstream,
                rule_action=call.rule.action.value if call.rule else None,
            )
            if action is Action.DENY_NEW:
                assert call.rule is not None
                await self._record_denial(q, call, call.rule, step if numbered else None, now)
                return Plan(error=PolicyDenied(call.rule.name, tool.name))
            if action in (Action.EXECUTE_NEW, Action.AWAIT_NEW):
                plan = await self._insert_new(q, action, call, step, signature, now)
                if plan is not None:
                    return plan
                existing = await q.get_effect_by_signature(org_id, signature)
                if existing is None:  # the UNIQUE constraint fired, yet no row: give up
                    raise DuplicateSignature(signature)
                continue
            if existing is None:  # only SESSION_CLOSED leaves decide() without a row
                return Plan(error=SessionClosed(session_id, session.state))
            return await self.apply_action(q, action, tool, existing, approval, now)
        raise DuplicateSignature(signature)

    async def _insert_new(
        self, q: Queries, action: Action, call: Call, step: int, signature: str, now: int
    ) -> Plan | None:
        """Write a new effect (and its undo entry or approval); None if the signature exists."""
        executing = action is Action.EXECUTE_NEW
        tool = call.tool
        effect = self._new_effect(call, step, signature, now, executing=executing)
        org_id, session_id, effect_id = effect.org_id, effect.session_id, effect.effect_id
        if executing:
            undo = self._new_undo_entry(effect, tool)
            payload = self._intercepted_payload(effect, call)
            # The intent, its undo entry and its event, together (one statement on PostgreSQL).
            event = EventType.EFFECT_INTERCEPTED
            if not await q.insert_executing_effect(effect, undo, event, payload):
                return None
            rule = call.rule
            approves = rule is not None and rule.action is RuleAction.APPROVE
            if rule is not None and approves and call.tier.requires_approval:
                await self._record_rule_approval(q, call, effect, rule, now)
            decision = Decision(Outcome.EXECUTE, effect_id, step, signature, tool)
            return Plan(decision=decision)
        if not await q.insert_effect(effect):
            return None
        if tool.compensation_json is not None:  # a `require` rule on a COMPENSABLE tool
            await q.insert_undo_entry(self._undo_entry(effect, tool.compensation_json, now))
        org = await self._org(q, org_id)
        timeout_s = org.approval_timeout_s if org else DEFAULT_APPROVAL_TIMEOUT_S
        approval = ApprovalRecord(
            approval_id=new_id(),
            org_id=org_id,
            effect_id=effect_id,
            session_id=session_id,
            tool_name=tool.name,
            args_json=call.args_json,
            status=ApprovalStatus.PENDING,
            created_us=now,
            timeout_us=now + timeout_s * 1_000_000,
            decided_us=None,
            decided_by=None,
            reason=None,
            rule=call.rule.name if call.rule else None,
            approvers_required=call.rule.approvers if call.rule else 1,
            requested_by_key_id=call.actor.key_id,
        )
        await q.insert_approval(approval)
        await q.insert_event(
            org_id,
            EventType.APPROVAL_REQUIRED,
            session_id,
            effect_id,
            event_json(
                declared_tiers(
                    {
                        "stage": "awaiting_approval",
                        "approval_id": approval.approval_id,
                        "tool_name": tool.name,
                        "tier": tool.tier,
                        "step_index": step,
                        "rule": approval.rule,
                    },
                    call,
                )
            ),
            now,
        )
        decision = Decision(
            Outcome.AWAITING_APPROVAL,
            effect_id,
            step,
            signature,
            tool,
            approval_id=approval.approval_id,
        )
        return Plan(decision=decision)
