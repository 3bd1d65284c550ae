"""An operator's repairs of a rollback that escalated: retry a failed undo entry, or mark it
handled by hand (`Repairs`, the base of `Saga` in saga.py, which unwinds the stacks).

Both reopen the unwinding: the entry leaves `failed`, its effect leaves
`compensation_failed`, and a session that stopped on it is `compensating` again.
"""

from __future__ import annotations

from collections.abc import Callable

from undolog.engine.model import event_json as _event
from undolog.engine.model import now_us as _now_us
from undolog.engine.states import EffectState, SessionState, UndoState
from undolog.store.protocol import Queries, Store
from undolog.store.records import SessionRecord, UndoEntryRecord
from undolog_sdk.errors import InvalidStateTransition, NotFound
from undolog_sdk.wire import EventType

__all__ = ["Repairs"]


class Repairs:
    """The store, the lease and the clock of a saga, and an operator's repairs."""

    def __init__(
        self,
        store: Store,
        *,
        lease_seconds: float = 60.0,
        clock_us: Callable[[], int] = _now_us,
    ) -> None:
        self.store = store
        self.lease_us = int(lease_seconds * 1_000_000)
        self._clock = clock_us

    async def _session(self, q: Queries, org_id: str, session_id: str) -> SessionRecord:
        session = await q.get_session(org_id, session_id)
        if session is None:
            raise NotFound(f"session '{session_id}' not found")
        return session

    async def retry(self, org_id: str, entry_id: str) -> UndoEntryRecord:
        """An operator retries a failed entry: it is pending again with fresh retries."""
        return await self._reopen(org_id, entry_id, UndoState.PENDING, None)

    async def resolve(self, org_id: str, entry_id: str, note: str) -> UndoEntryRecord:
        """An operator marks a failed entry handled by hand; the unwinding may go on."""
        return await self._reopen(org_id, entry_id, UndoState.RESOLVED, note)

    async def _reopen(
        self, org_id: str, entry_id: str, target: UndoState, note: str | None
    ) -> UndoEntryRecord:
        now = self._clock()
        async with self.store.transaction() as q:
            entry = await q.get_undo_entry(org_id, entry_id)
            if entry is None:
                raise NotFound(f"undo entry '{entry_id}' not found")
            if entry.state != UndoState.FAILED:
                raise InvalidStateTransition(entry_id, entry.state, target.value)
            await q.update_undo_entry(
                org_id, entry_id, expect_state=UndoState.FAILED.value, state=target.value,
                attempts=0 if target is UndoState.PENDING else entry.attempts,
                last_error=note if note is not None else entry.last_error, updated_us=now,
            )  # fmt: skip
            effect_target = (
                EffectState.COMPENSATING if target is UndoState.PENDING else EffectState.COMPENSATED
            )
            await q.update_effect(
                org_id, entry.effect_id, expect_state=EffectState.COMPENSATION_FAILED.value,
                state=effect_target.value, updated_us=now,
            )  # fmt: skip
            session = await self._session(q, org_id, entry.session_id)
            if session.state == SessionState.COMPENSATION_FAILED:
                await q.update_session(
                    org_id, entry.session_id, now, state=SessionState.COMPENSATING
                )
            await q.insert_event(
                org_id,
                EventType.COMPENSATION_RETRIED if note is None else EventType.COMPENSATION_RESOLVED,
                entry.session_id, entry.effect_id,
                _event({"entry_id": entry_id, "fn_name": entry.fn_name, "note": note}), now,
            )  # fmt: skip
            reopened = await q.get_undo_entry(org_id, entry_id)
        assert reopened is not None
        return reopened
