"""The saga: unwinding a session's undo stack, newest first, exactly once, with escalation.

`plan_next` is the pure rule that picks what to do with the stack; `Saga` carries it out in
short transactions. A runner (the proxy for entries of proxy-executed calls, the SDK for its
own) *claims* the top entry, runs its compensation, and reports each attempt; only then can
the next entry be claimed, so LIFO order holds whoever runs what. A claim holds a lease: a
runner that dies mid-compensation loses it, and the next claim retries the same entry with the
same idempotency key (the entry id).

Each claim carries a fresh, unguessable claim token that reporting on the entry requires (see
`undolog.engine.unwind`, where it is hashed).
"""

from __future__ import annotations

import hmac
import secrets
from collections.abc import Collection, Sequence
from typing import NoReturn

from undolog.engine.model import check_registered_before_executed, session_lock_key
from undolog.engine.model import event_json as _event
from undolog.engine.repairs import Repairs
from undolog.engine.states import (
    ApprovalStatus,
    EffectState,
    SessionState,
    UndoState,
    check_effect_transition,
    check_session_transition,
)
from undolog.engine.unwind import (
    LOST_RUN,
    Claim,
    NotHandedOver,
    StepKind,
    compensation_payload,
    handed,
    hash_claim_token,
    is_idempotent,
    plan_next,
)
from undolog.store.protocol import Queries
from undolog.store.records import EffectRecord, SessionRecord, UndoEntryRecord
from undolog_sdk.errors import (
    ClaimNotHeld,
    CompensationFailed,
    InvalidRequest,
    InvalidStateTransition,
    NotFound,
)
from undolog_sdk.wire import EventType, ExecutionMode
from undolog_sdk.wire import RollbackOutcome as RollbackStatus

# Entries a compensation (or an operator's hand) undid.
_UNDONE = frozenset({UndoState.COMPENSATED, UndoState.RESOLVED})

__all__ = [
    "LOST_RUN",
    "Claim",
    "RollbackStatus",
    "Saga",
    "StepKind",
    "hash_claim_token",
    "plan_next",
]


class Saga(Repairs):
    """Rollback of sessions over a store. See the module docstring (an operator's repairs:
    `Repairs`)."""

    async def begin(self, org_id: str, session_id: str, by: str | None = None) -> SessionRecord:
        """Move the session to `compensating` (idempotent while it is already there).

        `by`: who asked for the rollback (`key:<name>`), recorded in the event."""
        now = self._clock()
        async with self.store.transaction(lock_key=session_lock_key(org_id, session_id)) as q:
            session = await self._session(q, org_id, session_id)
            if session.state in (SessionState.COMPENSATING, SessionState.COMPENSATED):
                return session
            check_session_transition(session_id, session.state, SessionState.COMPENSATING)
            await q.update_session(org_id, session_id, now, state=SessionState.COMPENSATING)
            await self._withdraw_approvals(q, session, now, "the session was rolled back")
            await q.insert_event(
                org_id, EventType.SESSION_COMPENSATING, session_id, None,
                _event({"stage": SessionState.COMPENSATING, "from": session.state,
                        **({"by": by} if by else {})}), now,
            )  # fmt: skip
            return await self._session(q, org_id, session_id)

    async def _withdraw_approvals(
        self, q: Queries, session: SessionRecord, now: int, reason: str
    ) -> None:
        """A closed session's pending approvals can never run: reject them, so nobody is
        asked to decide on them."""
        for approval in await q.list_session_approvals(session.org_id, session.session_id):
            if approval.status != ApprovalStatus.PENDING:
                continue
            changed = await q.update_approval(
                session.org_id, approval.approval_id, expect_status=ApprovalStatus.PENDING.value,
                status=ApprovalStatus.REJECTED.value, decided_us=now, decided_by="undolog",
                reason=reason,
            )  # fmt: skip
            if not changed:
                continue
            await q.update_effect(
                session.org_id, approval.effect_id,
                expect_state=EffectState.AWAITING_APPROVAL.value,
                state=EffectState.REJECTED.value, finished_us=now, updated_us=now,
            )  # fmt: skip
            await q.insert_event(
                session.org_id, EventType.APPROVAL_REJECTED, session.session_id, approval.effect_id,
                _event({"approval_id": approval.approval_id, "tool_name": approval.tool_name,
                        "decided_by": "undolog", "reason": reason}),
                now,
            )  # fmt: skip

    async def _stack(
        self, q: Queries, org_id: str, session_id: str
    ) -> list[tuple[UndoEntryRecord, EffectRecord]]:
        pairs = []
        for entry in await q.list_undo_entries(org_id, session_id):
            effect = await q.get_effect(org_id, entry.effect_id)
            if effect is None:  # pragma: no cover - a foreign key guarantees it
                raise NotFound(f"effect '{entry.effect_id}' not found")
            pairs.append((entry, effect))
        return pairs

    async def claim(
        self,
        org_id: str,
        session_id: str,
        runner: str,
        only: Collection[str] | None = None,
        by: str | None = None,
    ) -> Claim | RollbackStatus:
        """Claim the top entry for `runner`, or say why there is nothing to claim.

        Entries whose forward call never committed are skipped on the way down. When the
        stack is done the session becomes `compensated` (`EMPTY` if nothing ever ran).

        With `only` (a selective undo, docs/undo.md), the stack is just those entries and
        the session keeps its state: an entry whose call did not commit is left alone (the
        call may still be retried), and the end of the entries closes nothing.

        `by`: who asked for the undo (`key:<name>`), recorded in `compensation_started`.
        """
        if runner not in list(ExecutionMode):
            raise InvalidRequest("runner must be 'proxy' or 'sdk'")
        # The session's lock: two runners (two proxy processes, or a proxy and an SDK) claiming
        # at once take turns, and the second sees the first's claim.
        async with self.store.transaction(lock_key=session_lock_key(org_id, session_id)) as q:
            session = await self._session(q, org_id, session_id)
            if only is None and session.state == SessionState.COMPENSATED:
                return RollbackStatus.COMPENSATED
            if only is None and session.state != SessionState.COMPENSATING:
                wanted = SessionState.COMPENSATING.value
                raise InvalidStateTransition(session_id, session.state, wanted)
            left_alone: set[str] = set()
            while True:
                now = self._clock()
                stack = await self._stack(q, org_id, session_id)
                if only is not None:
                    chosen = [(e, f) for e, f in stack if e.entry_id in only]
                    stack = [(e, f) for e, f in chosen if e.entry_id not in left_alone]
                idempotent = await self._idempotent_entries(q, stack)
                step = plan_next(stack, runner, now, idempotent)
                if step.kind is StepKind.LOST:
                    assert step.entry is not None
                    await self._needs_attention(q, step.entry, LOST_RUN, now)
                    return RollbackStatus.COMPENSATION_FAILED
                if only is not None and step.kind is StepKind.SKIP:
                    assert step.entry is not None
                    left_alone.add(step.entry.entry_id)
                    continue
                if step.kind in (StepKind.SKIP, StepKind.SETTLE):
                    assert step.entry is not None
                    target = (
                        UndoState.SKIPPED if step.kind is StepKind.SKIP else UndoState.COMPENSATED
                    )
                    await q.update_undo_entry(
                        org_id, step.entry.entry_id, state=target.value, updated_us=now,
                        lease_expires_us=None,
                    )  # fmt: skip
                    await q.insert_event(
                        org_id, EventType.compensation(target), session_id,
                        step.entry.effect_id,
                        _event({"entry_id": step.entry.entry_id, "fn_name": step.entry.fn_name}),
                        now,
                    )  # fmt: skip
                    continue
                if step.kind is StepKind.DONE and only is not None:
                    ran = any(e.state in _UNDONE for e, _ in chosen)
                    return RollbackStatus.COMPENSATED if ran else RollbackStatus.EMPTY
                if step.kind is StepKind.DONE:
                    return await self._finish(q, session, stack, now)
                if step.kind is StepKind.RUN:
                    assert step.entry is not None and step.effect is not None
                    return await self._claim_entry(q, step.entry, step.effect, now, by)
                if step.kind is StepKind.FAILED:
                    # A rerun before an operator acted: `begin` reopened the session, but the
                    # failed entry still stops the unwinding, so the session stays failed too.
                    await self._fail_session(q, org_id, session_id, now)
                    return RollbackStatus.COMPENSATION_FAILED
                if step.kind is StepKind.OTHER_RUNNER and runner == ExecutionMode.PROXY:
                    assert step.entry is not None  # the SDK's: only now may it claim it
                    await q.update_undo_entry(
                        org_id, step.entry.entry_id, handed_until_us=now + self.lease_us
                    )
                return {
                    StepKind.BUSY: RollbackStatus.BUSY,
                    StepKind.OTHER_RUNNER: RollbackStatus.WAITING_FOR_RUNNER,
                    StepKind.BLOCKED: RollbackStatus.BLOCKED,
                }[step.kind]

    @staticmethod
    async def _idempotent_entries(
        q: Queries, stack: Sequence[tuple[UndoEntryRecord, EffectRecord]]
    ) -> set[str]:
        """Which claimed entries' compensations are declared idempotent (by their tool's
        registration now). Only running entries are asked about: the rare case."""
        found: set[str] = set()
        for entry, effect in stack:
            if entry.state != UndoState.RUNNING:
                continue
            tool = await q.get_tool(entry.org_id, effect.tool_name)
            if tool is not None and is_idempotent(tool.compensation_json):
                found.add(entry.entry_id)
        return found

    async def _needs_attention(
        self, q: Queries, entry: UndoEntryRecord, error: str, now: int
    ) -> None:
        """A compensation whose outcome is unknown and that may not simply run again: the
        entry, its effect and the session become failed/`compensation_failed`, with `error`
        as the entry's `last_error`, until an operator retries or resolves the entry."""
        await q.update_undo_entry(
            entry.org_id, entry.entry_id, expect_state=UndoState.RUNNING.value,
            state=UndoState.FAILED.value, attempts=entry.attempts + 1, last_error=error,
            lease_expires_us=None, updated_us=now,
        )  # fmt: skip
        await q.insert_event(
            entry.org_id, EventType.COMPENSATION_FAILED, entry.session_id, entry.effect_id,
            _event({"entry_id": entry.entry_id, "fn_name": entry.fn_name,
                    "attempt": entry.attempts + 1, "error": error, "in_doubt": True}),
            now,
        )  # fmt: skip
        await q.update_effect(
            entry.org_id, entry.effect_id, expect_state=EffectState.COMPENSATING.value,
            state=EffectState.COMPENSATION_FAILED.value, updated_us=now,
        )  # fmt: skip
        await self._fail_session(q, entry.org_id, entry.session_id, now)

    async def _fail_session(self, q: Queries, org_id: str, session_id: str, now: int) -> None:
        """An entry gave up: a session being rolled back is `compensation_failed`; one whose
        entries are undone selectively (docs/undo.md) keeps its state and stays usable."""
        session = await self._session(q, org_id, session_id)
        if session.state == SessionState.COMPENSATING:
            await q.update_session(org_id, session_id, now, state=SessionState.COMPENSATION_FAILED)

    async def give_up(self, org_id: str, entry_id: str, error: str, claim_token: str) -> NoReturn:
        """The claimed compensation's outcome is unknown (a timeout, a lost connection) and
        it is not idempotent: it needs an operator. Raises `CompensationFailed`."""
        now = self._clock()
        async with self.store.transaction() as q:
            entry = await self._running_entry(q, org_id, entry_id, claim_token)
            await self._needs_attention(q, entry, error, now)
        raise CompensationFailed(entry.fn_name, entry.max_retries, error)

    async def renew_claim(self, org_id: str, entry_id: str, claim_token: str) -> bool:
        """Extend a running compensation's claim by a lease (its runner, holding the claim's
        token, is alive)."""
        async with self.store.autocommit() as q:
            return await q.update_undo_entry(
                org_id, entry_id, expect_state=UndoState.RUNNING.value,
                expect_claim=hash_claim_token(claim_token),
                lease_expires_us=self._clock() + self.lease_us,
            )  # fmt: skip

    async def start_attempt(self, org_id: str, entry_id: str, claim_token: str) -> bool:
        """A retry of the claimed compensation starts: renew the claim and clear `last_error`.

        A claim whose `last_error` is set stopped between attempts (the failure was reported,
        nothing is in flight): whoever takes it over may run it. A claim without one had an
        attempt under way, whose outcome is unknown: only an idempotent compensation runs
        again (`plan_next`). The claim itself starts the first attempt.
        """
        async with self.store.autocommit() as q:
            return await q.update_undo_entry(
                org_id, entry_id, expect_state=UndoState.RUNNING.value,
                expect_claim=hash_claim_token(claim_token), last_error=None,
                lease_expires_us=self._clock() + self.lease_us, updated_us=self._clock(),
            )  # fmt: skip

    async def _finish(
        self,
        q: Queries,
        session: SessionRecord,
        stack: Sequence[tuple[UndoEntryRecord, EffectRecord]],
        now: int,
    ) -> RollbackStatus:
        ran = any(e.state in (UndoState.COMPENSATED, UndoState.RESOLVED) for e, _ in stack)
        await q.update_session(
            session.org_id, session.session_id, now, state=SessionState.COMPENSATED
        )
        await q.insert_event(
            session.org_id, EventType.SESSION_COMPENSATED, session.session_id, None,
            _event({"stage": SessionState.COMPENSATED, "entries": len(stack)}), now,
        )  # fmt: skip
        return RollbackStatus.COMPENSATED if ran else RollbackStatus.EMPTY

    async def _claim_entry(
        self,
        q: Queries,
        entry: UndoEntryRecord,
        effect: EffectRecord,
        now: int,
        by: str | None = None,
    ) -> Claim:
        check_registered_before_executed(entry, effect)
        org_id = entry.org_id
        if effect.state == EffectState.COMMITTED:
            check_effect_transition(effect.effect_id, effect.state, EffectState.COMPENSATING)
            await q.update_effect(
                org_id, effect.effect_id, expect_state=effect.state,
                state=EffectState.COMPENSATING.value, updated_us=now,
            )  # fmt: skip
        # The first attempt starts with the claim: no `last_error` (see `start_attempt`).
        token = secrets.token_urlsafe(32)
        changed = await q.update_undo_entry(
            org_id, entry.entry_id, expect_state=entry.state, last_error=None,
            state=UndoState.RUNNING.value, lease_expires_us=now + self.lease_us, updated_us=now,
            claim_token_hash=hash_claim_token(token), handed_until_us=None,
        )  # fmt: skip
        if not changed:  # pragma: no cover - we hold the write transaction
            raise InvalidStateTransition(entry.entry_id, entry.state, UndoState.RUNNING.value)
        await q.insert_event(
            org_id, EventType.COMPENSATION_STARTED, entry.session_id, entry.effect_id,
            _event({"entry_id": entry.entry_id, "fn_name": entry.fn_name,
                    "attempt": entry.attempts + 1, **({"by": by} if by else {})}),
            now,
        )  # fmt: skip
        claimed = await q.get_undo_entry(org_id, entry.entry_id)
        assert claimed is not None
        tool = await q.get_tool(org_id, effect.tool_name)
        approval = await q.get_approval_for_effect(org_id, effect.effect_id)
        approved = approval.approved_args_json if approval else None  # an approver's edit
        return Claim(
            entry=claimed,
            effect=effect,
            payload=compensation_payload(entry, effect, approved),
            attempts_left=max(0, entry.max_retries + 1 - entry.attempts),
            idempotent=tool is not None and is_idempotent(tool.compensation_json),
            token=token,
        )

    async def claim_entry(self, org_id: str, entry_id: str, runner: str) -> Claim:
        """Claim a specific entry (the SDK names the one a rollback handed over).

        Raises:
            NotFound: no such entry in this org.
            NotHandedOver: no rollback handed it to a runner (within a lease), or its
                hand-off was claimed already.
            InvalidStateTransition: it is not the entry to run next for this runner.
        """
        async with self.store.reader() as q:
            entry = await q.get_undo_entry(org_id, entry_id)
            session = await q.get_session(org_id, entry.session_id) if entry else None
        if entry is None or session is None:
            raise NotFound(f"undo entry '{entry_id}' not found")
        if not handed(entry, self._clock()):  # no claim outside a rollback (docs/undo.md)
            raise NotHandedOver(entry_id, entry.state)
        # Outside a full rollback, the SDK runs an entry a selective undo handed it.
        rolling_back = session.state in (SessionState.COMPENSATING, SessionState.COMPENSATED)
        only = None if rolling_back else {entry_id}
        result = await self.claim(org_id, entry.session_id, runner, only)
        if isinstance(result, Claim) and result.entry.entry_id == entry_id:
            return result
        if isinstance(result, Claim):  # pragma: no cover - handed back below
            await self._release(org_id, result.entry)
        raise InvalidStateTransition(entry_id, entry.state, UndoState.RUNNING.value)

    async def _release(self, org_id: str, entry: UndoEntryRecord) -> None:
        now = self._clock()
        async with self.store.transaction() as q:
            await q.update_undo_entry(
                org_id, entry.entry_id, expect_state=UndoState.RUNNING.value,
                state=UndoState.PENDING.value, lease_expires_us=None, updated_us=now,
                claim_token_hash=None,
            )  # fmt: skip

    async def complete(self, org_id: str, entry_id: str, claim_token: str) -> UndoEntryRecord:
        """The claimed compensation succeeded: entry and effect are `compensated`.

        Raises:
            ClaimNotHeld: `claim_token` is not the entry's current claim.
        """
        now = self._clock()
        async with self.store.transaction() as q:
            entry = await self._running_entry(q, org_id, entry_id, claim_token)
            await q.update_undo_entry(
                org_id, entry_id, expect_state=UndoState.RUNNING.value,
                state=UndoState.COMPENSATED.value, attempts=entry.attempts + 1,
                lease_expires_us=None, last_error=None, updated_us=now, claim_token_hash=None,
            )  # fmt: skip
            await q.update_effect(
                org_id, entry.effect_id, expect_state=EffectState.COMPENSATING.value,
                state=EffectState.COMPENSATED.value, updated_us=now,
            )  # fmt: skip
            await q.insert_event(
                org_id, EventType.COMPENSATION_COMPLETED, entry.session_id, entry.effect_id,
                _event({"entry_id": entry_id, "fn_name": entry.fn_name,
                        "attempt": entry.attempts + 1}),
                now,
            )  # fmt: skip
            done = await q.get_undo_entry(org_id, entry_id)
        assert done is not None
        return done

    async def fail_attempt(
        self, org_id: str, entry_id: str, error: str, claim_token: str
    ) -> UndoEntryRecord:
        """One attempt of the claimed compensation failed.

        With retries left the entry stays claimed (the runner waits `retry_backoff_ms` and
        tries again, under the same token). Without, the entry, its effect and the session
        become `compensation_failed` and `CompensationFailed` is raised.

        Raises:
            ClaimNotHeld: `claim_token` is not the entry's current claim.
        """
        now = self._clock()
        async with self.store.transaction() as q:
            entry = await self._running_entry(q, org_id, entry_id, claim_token)
            attempts = entry.attempts + 1
            exhausted = attempts > entry.max_retries
            # The runner sleeps the backoff before its next attempt: the lease covers both,
            # or another runner would take the entry over from a live one mid-backoff.
            lease = now + entry.retry_backoff_ms * 1000 + self.lease_us
            await q.update_undo_entry(
                org_id, entry_id, expect_state=UndoState.RUNNING.value,
                state=(UndoState.FAILED if exhausted else UndoState.RUNNING).value,
                attempts=attempts, last_error=error, updated_us=now,
                lease_expires_us=None if exhausted else lease,
                claim_token_hash=None if exhausted else entry.claim_token_hash,
            )  # fmt: skip
            await q.insert_event(
                org_id,
                EventType.COMPENSATION_FAILED if exhausted else EventType.COMPENSATION_RETRYING,
                entry.session_id, entry.effect_id,
                _event({"entry_id": entry_id, "fn_name": entry.fn_name, "attempt": attempts,
                        "error": error}),
                now,
            )  # fmt: skip
            if exhausted:
                await q.update_effect(
                    org_id, entry.effect_id, expect_state=EffectState.COMPENSATING.value,
                    state=EffectState.COMPENSATION_FAILED.value, updated_us=now,
                )  # fmt: skip
                await self._fail_session(q, org_id, entry.session_id, now)
            failed = await q.get_undo_entry(org_id, entry_id)
        assert failed is not None
        if exhausted:
            raise CompensationFailed(entry.fn_name, entry.max_retries, error)
        return failed

    async def _running_entry(
        self, q: Queries, org_id: str, entry_id: str, claim_token: str
    ) -> UndoEntryRecord:
        """The entry, claimed, and claimed with this token."""
        entry = await q.get_undo_entry(org_id, entry_id)
        if entry is None:
            raise NotFound(f"undo entry '{entry_id}' not found")
        if entry.state != UndoState.RUNNING:
            raise InvalidStateTransition(entry_id, entry.state, "reported")
        held = entry.claim_token_hash
        if held is None or not hmac.compare_digest(held, hash_claim_token(claim_token)):
            raise ClaimNotHeld(entry_id)
        return entry

    async def complete_session(self, org_id: str, session_id: str) -> SessionRecord:
        """A session whose work ended normally is `completed` (idempotent)."""
        now = self._clock()
        async with self.store.transaction() as q:
            session = await self._session(q, org_id, session_id)
            if session.state == SessionState.COMPLETED:
                return session
            check_session_transition(session_id, session.state, SessionState.COMPLETED)
            await q.update_session(org_id, session_id, now, state=SessionState.COMPLETED)
            await self._withdraw_approvals(q, session, now, "the session was completed")
            await q.insert_event(
                org_id, EventType.SESSION_COMPLETED, session_id, None,
                _event({"stage": SessionState.COMPLETED}), now,
            )  # fmt: skip
            return await self._session(q, org_id, session_id)
