"""An operator's hand on a failed undo entry: retry it (pending again, fresh retries) or
resolve it (handled by hand). Either lets the unwinding go on; `Saga.retry` / `Saga.resolve`
call it.
"""

from __future__ import annotations

from undolog.engine.model import event_json as _event
from undolog.engine.states import EffectState, SessionState, UndoState
from undolog.store.protocol import Store
from undolog.store.records import UndoEntryRecord
from undolog_sdk.errors import InvalidStateTransition, NotFound
from undolog_sdk.wire import EventType

__all__ = ["reopen_entry"]


async def reopen_entry(
    store: Store, now: int, org_id: str, entry_id: str, note: str | None
) -> UndoEntryRecord:
    """A failed entry becomes `pending` (no `note`: a retry) or `resolved` (with the note).

    Raises:
        NotFound: no such entry in this org.
        InvalidStateTransition: the entry is not `failed`.
    """
    target = UndoState.PENDING if note is None else UndoState.RESOLVED
    async with store.transaction() as q:
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
        session = await q.get_session(org_id, entry.session_id)
        if session is not None and session.state == SessionState.COMPENSATION_FAILED:
            await q.update_session(org_id, entry.session_id, now, state=SessionState.COMPENSATING)
        await q.insert_event(
            org_id,
            EventType.COMPENSATION_RETRIED if note is None else EventType.COMPENSATION_RESOLVED,
            entry.session_id, entry.effect_id,
            _event({"entry_id": entry_id, "fn_name": entry.fn_name, "note": note}), now,
        )  # fmt: skip
        reopened = await q.get_undo_entry(org_id, entry_id)
    assert reopened is not None
    return reopened
