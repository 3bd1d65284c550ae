"""The engine's side that works on an existing effect: applying a decided action to it,
in doubt and expired leases, delivery, commit, fail and resolve, and the reads.

`Engine` (engine/core.py) adds interception on top; see docs/architecture.md.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from undolog.engine.decide import Action
from undolog.engine.model import (
    ORG_WIDE,
    Actor,
    Decision,
    Outcome,
    SessionView,
    event_json,
)
from undolog.engine.registry import Registry
from undolog.engine.states import (
    REPLAYABLE_STATES,
    EffectState,
    check_effect_transition,
)
from undolog.store.protocol import Queries
from undolog.store.records import (
    ApprovalRecord,
    EffectRecord,
    Finish,
    SessionRecord,
    ToolRecord,
)
from undolog_sdk.errors import (
    ApprovalRejected,
    ApprovalTimedOut,
    EffectInDoubt,
    InProgress,
    InvalidRequest,
    InvalidStateTransition,
    NotExecuting,
    NotFound,
    SessionClosed,
)
from undolog_sdk.wire import EventType

__all__ = ["ANSWERED_STATES", "LEASE_EXPIRED", "Effects", "Plan"]

# The states whose effect has a result that may not have reached its client yet
# (`mark_delivered`).
ANSWERED_STATES = (EffectState.COMMITTED.value,)

# Why an effect is in doubt: its process stopped renewing the lease (it died).
LEASE_EXPIRED = "execution lease expired before commit or fail"


@dataclass
class Plan:
    """What a transaction decided, carried out of it (errors are raised after commit)."""

    decision: Decision | None = None
    error: Exception | None = None


class Effects(Registry):
    """Operations on existing effects; the `Engine` is one (it sets the lease and hint)."""

    lease_us: int
    retry_after_seconds: int

    def _in_progress(self, effect: EffectRecord, now: int) -> InProgress:
        remaining_s = math.ceil(((effect.lease_expires_us or now) - now) / 1_000_000)
        return InProgress(effect.effect_id, max(1, min(self.retry_after_seconds, remaining_s)))

    @staticmethod
    def _replayed_payload(tool_name: str, step: int) -> str:
        return event_json({"stage": "replayed", "tool_name": tool_name, "step_index": step})

    @staticmethod
    def _replay_decision(effect: EffectRecord, tool: ToolRecord) -> Decision:
        return Decision(
            Outcome.REPLAY,
            effect.effect_id,
            effect.step_index,
            effect.call_signature,
            tool,
            attempt=effect.attempts,
            result_json=effect.result_json,
        )

    async def apply_action(
        self,
        q: Queries,
        action: Action,
        tool: ToolRecord,
        effect: EffectRecord,
        approval: ApprovalRecord | None,
        now: int,
    ) -> Plan:
        org_id, effect_id = effect.org_id, effect.effect_id
        if action is Action.REPLAY:
            payload = self._replayed_payload(effect.tool_name, effect.step_index)
            await q.insert_event(
                org_id, EventType.EFFECT_REPLAYED, effect.session_id, effect_id, payload, now
            )
            return Plan(decision=self._replay_decision(effect, tool))
        if action is Action.AWAITING:
            assert approval is not None
            return Plan(
                decision=Decision(
                    Outcome.AWAITING_APPROVAL,
                    effect_id,
                    effect.step_index,
                    effect.call_signature,
                    tool,
                    approval_id=approval.approval_id,
                )
            )
        if action is Action.IN_PROGRESS:
            return Plan(error=self._in_progress(effect, now))
        if action is Action.MARK_IN_DOUBT:
            await self._move_in_doubt(q, effect, LEASE_EXPIRED, now)
            return Plan(error=EffectInDoubt(effect_id))
        if action is Action.IN_DOUBT:
            return Plan(error=EffectInDoubt(effect_id))
        if action is Action.REJECTED:
            approval_id = approval.approval_id if approval else effect_id
            return Plan(error=ApprovalRejected(approval_id, approval.reason if approval else None))
        if action is Action.TIMED_OUT:
            return Plan(error=ApprovalTimedOut(approval.approval_id if approval else effect_id))
        if action is Action.SESSION_CLOSED:
            session = await q.get_session(org_id, effect.session_id)
            return Plan(error=SessionClosed(effect.session_id, session.state if session else "?"))
        # A (new) run of an existing effect: failed before, lease lost, or just approved.
        attempt = effect.attempts + (0 if action is Action.EXECUTE_APPROVED else 1)
        check_effect_transition(effect_id, effect.state, EffectState.EXECUTING)
        executed = max(now, (effect.executed_us or 0) + 1)
        changed = await q.update_effect(
            org_id,
            effect_id,
            expect_state=effect.state,
            state=EffectState.EXECUTING.value,
            attempts=attempt,
            error=None,
            lease_expires_us=executed + self.lease_us,
            executed_us=executed,
            updated_us=now,
        )
        if not changed:
            # Another writer moved it first (an approval running it, a concurrent retry):
            # answer what it is now, as a duplicate arriving a moment later would get.
            current = await q.get_effect(org_id, effect_id)
            if current is not None and current.state == EffectState.EXECUTING:
                return Plan(error=self._in_progress(current, now))
            if current is not None and current.state in REPLAYABLE_STATES:
                return Plan(decision=self._replay_decision(current, tool))
            if current is not None and current.state == EffectState.IN_DOUBT:
                return Plan(error=EffectInDoubt(effect_id))
            raise InvalidStateTransition(effect_id, effect.state, EffectState.EXECUTING.value)
        await q.insert_event(
            org_id,
            EventType.EFFECT_INTERCEPTED,
            effect.session_id,
            effect_id,
            event_json(
                {
                    "stage": EffectState.EXECUTING,
                    "tool_name": effect.tool_name,
                    "tier": effect.tier,
                    "step_index": effect.step_index,
                    "attempt": attempt,
                    "reason": action.value,
                }
            ),
            now,
        )
        return Plan(
            decision=Decision(
                Outcome.EXECUTE,
                effect_id,
                effect.step_index,
                effect.call_signature,
                tool,
                attempt=attempt,
                args_json=approval.approved_args_json if approval else None,
            )
        )

    @staticmethod
    async def _move_in_doubt(q: Queries, effect: EffectRecord, reason: str, now: int) -> bool:
        """executing → in_doubt with its `effect_failed` event (stage `in_doubt`); False when
        the effect had moved on meanwhile (nothing written)."""
        check_effect_transition(effect.effect_id, effect.state, EffectState.IN_DOUBT)
        changed = await q.update_effect(
            effect.org_id,
            effect.effect_id,
            expect_state=effect.state,
            state=EffectState.IN_DOUBT.value,
            lease_expires_us=None,
            error=reason,
            updated_us=now,
        )
        if not changed:
            return False
        payload = {"stage": EffectState.IN_DOUBT, "tool_name": effect.tool_name, "error": reason}
        await q.insert_event(
            effect.org_id, EventType.EFFECT_FAILED, effect.session_id, effect.effect_id,
            event_json(payload), now,
        )  # fmt: skip
        return True

    async def mark_in_doubt(
        self, org_id: str, effect_id: str, reason: str, *, attempt: int
    ) -> EffectRecord | None:
        """The run of `attempt` ended with an ambiguous outcome (a timeout, a connection lost
        after sending, an answer that is no ToolResult): the tool may have run, so the effect
        is `in_doubt` until an operator resolves it. None when that run was no longer the
        effect's (another attempt took over, or it was settled meanwhile)."""
        async with self.store.transaction() as q:
            effect = await q.get_effect(org_id, effect_id)
            if (
                effect is None
                or effect.state != EffectState.EXECUTING
                or effect.attempts != attempt
            ):
                return None
            now = self._clock()
            if not await self._move_in_doubt(q, effect, reason, now):
                return None
            return await q.get_effect(org_id, effect_id)

    async def renew_lease(self, org_id: str, effect_id: str, attempt: int) -> bool:
        """Extend a running call's lease by a full lease from now (see `Queries.renew_lease`)."""
        async with self.store.autocommit() as q:
            return await q.renew_lease(org_id, effect_id, attempt, self._clock() + self.lease_us)

    async def sweep_expired(self, limit: int = 100) -> list[EffectRecord]:
        """Move `executing` effects whose lease expired (their process died, since a live one
        renews it) to `in_doubt` — or to `failed` for an `idempotent_upstream` tool, whose
        retry may run it again under the same key — without waiting for a retry; the effects
        moved, in their new state.

        Safe with several proxies on one PostgreSQL: the rows are claimed `FOR UPDATE SKIP
        LOCKED`, and each move is conditional on the state.
        """
        moved = []
        async with self.store.transaction() as q:
            now = self._clock()
            for effect in await q.claim_expired_effects(now, limit):
                tool = await q.get_tool(effect.org_id, effect.tool_name)
                if tool is not None and tool.idempotent_upstream:
                    # Safe to run again under the same key: failed, and a retry reruns it.
                    if await self._fail_expired(q, effect, now):
                        moved.append(replace(effect, state=EffectState.FAILED.value))
                elif await self._move_in_doubt(q, effect, LEASE_EXPIRED, now):
                    moved.append(replace(effect, state=EffectState.IN_DOUBT.value))
        return moved

    @staticmethod
    async def _fail_expired(q: Queries, effect: EffectRecord, now: int) -> bool:
        changed = await q.update_effect(
            effect.org_id, effect.effect_id, expect_state=EffectState.EXECUTING.value,
            state=EffectState.FAILED.value, lease_expires_us=None, error=LEASE_EXPIRED,
            updated_us=now,
        )  # fmt: skip
        if changed:
            payload = {
                "stage": EffectState.FAILED,
                "tool_name": effect.tool_name,
                "error": LEASE_EXPIRED,
            }
            await q.insert_event(
                effect.org_id, EventType.EFFECT_FAILED, effect.session_id, effect.effect_id,
                event_json(payload), now,
            )  # fmt: skip
        return changed

    async def mark_delivered(self, org_id: str, effect_ids: Sequence[str]) -> None:
        """Note that these step-less calls' answers reached their client.

        From then on an identical call of the session is a new call (the next step), not a
        retry. Only a result counts (a committed effect); an effect that has not committed
        (failed, or run again by a retry) is left alone.
        """
        if not effect_ids:
            return
        async with self.store.autocommit() as q:
            await q.mark_delivered(org_id, effect_ids, ANSWERED_STATES, self._clock())

    async def commit(
        self, org_id: str, effect_id: str, result_json: str, *, undoable: bool = True
    ) -> EffectRecord:
        """Record a run's result. Raises `NotFound`, or `NotExecuting` if it is not running.

        `undoable=False` records a logical failure (the tool ran and said no): it is replayed
        like any result, but a rollback has nothing to undo, so its undo entry is skipped.
        """
        return await self._finish(
            org_id, effect_id, EffectState.COMMITTED, result_json, None, undoable=undoable
        )

    async def fail(self, org_id: str, effect_id: str, error: str) -> EffectRecord:
        """Record a run's failure; a retry of the call becomes a new attempt."""
        return await self._finish(org_id, effect_id, EffectState.FAILED, None, error)

    async def resolve(
        self,
        org_id: str,
        effect_id: str,
        *,
        outcome: str,
        result_json: str | None = None,
        error: str | None = None,
        by: str = "operator",
        undoable: bool = True,
    ) -> EffectRecord:
        """An operator (`by`, recorded in the event: the key's name) settles an `in_doubt`
        effect as committed (with a result) or failed. `undoable=False`: the result records
        a logical failure (see `commit`)."""
        if outcome not in (EffectState.COMMITTED, EffectState.FAILED):
            raise InvalidRequest("outcome must be 'committed' or 'failed'")
        target = EffectState(outcome)
        async with self.store.reader() as q:
            effect = await q.get_effect(org_id, effect_id)
        if effect is None:
            raise NotFound(f"effect '{effect_id}' not found")
        lease = effect.lease_expires_us
        orphan = effect.state == EffectState.EXECUTING and (lease is None or lease <= self._clock())
        if effect.state != EffectState.IN_DOUBT and not orphan:
            raise InvalidStateTransition(effect_id, effect.state, target.value)
        if target is EffectState.COMMITTED and result_json is None:
            raise InvalidRequest("resolving as committed needs a result")
        return await self._finish(
            org_id,
            effect_id,
            target,
            result_json,
            None
            if target is EffectState.COMMITTED
            else error or "resolved as failed by an operator",
            resolved_by=by,
            undoable=undoable,
        )

    async def _finish(
        self,
        org_id: str,
        effect_id: str,
        target: EffectState,
        result_json: str | None,
        error: str | None,
        *,
        resolved_by: str | None = None,
        undoable: bool = True,
    ) -> EffectRecord:
        now = self._clock()
        extra: dict[str, Any] = {}
        if error is not None:
            extra["error"] = error
        if resolved_by is not None:
            extra["resolved_by"] = resolved_by
        if not undoable:
            extra["undo"] = "skipped: the tool reported a logical failure"
        committed = target is EffectState.COMMITTED
        event = EventType.EFFECT_COMMITTED if committed else EventType.EFFECT_FAILED
        finish = Finish(org_id, effect_id, target.value, result_json, error, now, event, extra)
        if undoable:  # one statement, which the store may send with others (group commit)
            effect = await self.store.finish_effect(finish)
        else:
            async with self.store.transaction() as q:
                effect = await q.finish_effect(finish)
                if effect is not None:
                    await q.skip_pending_undo_entries(org_id, effect_id, now)
        if effect is None:
            current = await self.get_effect(org_id, effect_id)  # NotFound if there is none
            check_effect_transition(effect_id, current.state, target.value)
            raise NotExecuting(effect_id)  # pragma: no cover - the check above raises
        return effect

    async def get_effect(self, org_id: str, effect_id: str) -> EffectRecord:
        async with self.store.reader() as q:
            effect = await q.get_effect(org_id, effect_id)
        if effect is None:
            raise NotFound(f"effect '{effect_id}' not found")
        return effect

    async def session_view(self, org_id: str, session_id: str) -> SessionView:
        """A session with its effects (step order), undo stack (top first) and approvals."""
        async with self.store.reader() as q:
            session = await q.get_session(org_id, session_id)
            if session is None:
                raise NotFound(f"session '{session_id}' not found")
            effects = await q.list_effects(org_id, session_id)
            undo = await q.list_undo_entries(org_id, session_id)
            approvals = await q.list_session_approvals(org_id, session_id)
            events = await q.list_events(org_id, 0, 100_000, session_id=session_id)
        replays: dict[str, int] = {}
        for event in events:
            if event.type == EventType.EFFECT_REPLAYED and event.effect_id:
                replays[event.effect_id] = replays.get(event.effect_id, 0) + 1
        return SessionView(session, effects, undo, approvals, replays)

    async def list_sessions(
        self, org_id: str, limit: int = 100, actor: Actor = ORG_WIDE
    ) -> list[SessionRecord]:
        """The org's sessions, latest first: only its own for an actor held to them."""
        owner = actor.key_id if actor.own_sessions_only else None
        if actor.own_sessions_only and owner is None:
            return []
        async with self.store.reader() as q:
            return await q.list_sessions(org_id, limit, owner)
