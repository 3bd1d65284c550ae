"""Selective undo: which undo entries a request names, and which later calls may depend on them.

A full rollback unwinds the whole stack and closes the session. A selective undo runs the
compensations of chosen entries only — one entry, or every entry of a call after step N —
newest first, with the saga's claims, retries and escalation (`Saga.claim(..., only=...)`), and
leaves the session as it was: new calls keep working, and a later full rollback skips what was
already undone. See docs/undo.md.

`select_entries` is pure: it resolves a request against a session's stack and effects and
lists the *dependents*: calls after the earliest chosen one that took effect (or may have) and
are not being undone. They may have used what the undo takes away, so the API refuses to go on
until the caller says `force`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from undolog.engine.states import EffectState
from undolog.store.protocol import Store
from undolog.store.records import EffectRecord, UndoEntryRecord
from undolog_sdk.errors import InvalidRequest, NotFound
from undolog_sdk.tier import ToolTier

__all__ = ["MAX_SELECTED_ENTRIES", "Selection", "load_selection", "select_entries"]

MAX_SELECTED_ENTRIES = 100  # entry ids one request may name
# Calls whose effect is in place, or may be: a later one of these may rely on an undone call.
_IN_PLACE = frozenset(
    {
        EffectState.COMMITTED,
        EffectState.EXECUTING,
        EffectState.IN_DOUBT,
        EffectState.COMPENSATION_FAILED,
    }
)


@dataclass(frozen=True, slots=True)
class Selection:
    """The entries to undo (ids) and the later calls that may depend on them, in step order."""

    entry_ids: frozenset[str]
    dependents: tuple[EffectRecord, ...]


def select_entries(
    stack: Sequence[UndoEntryRecord],
    effects: Sequence[EffectRecord],
    *,
    entries: Sequence[str] | None = None,
    after_step: int | None = None,
) -> Selection:
    """Resolve a selective undo: `entries` (ids of this session's undo entries) or
    `after_step` (every entry of a call whose step is greater), exactly one of them.

    Raises:
        InvalidRequest: neither or both given, or too many entries.
        NotFound: an entry id that is not on this session's stack.
    """
    if (entries is None) == (after_step is None):
        raise InvalidRequest("name either 'entries' or 'after_step'")
    by_effect = {e.effect_id: e for e in effects}
    if entries is not None:
        if not entries or len(entries) > MAX_SELECTED_ENTRIES:
            raise InvalidRequest(f"'entries' must name 1 to {MAX_SELECTED_ENTRIES} undo entries")
        known = {u.entry_id for u in stack}
        for entry_id in entries:
            if entry_id not in known:
                raise NotFound(f"undo entry '{entry_id}' not found")
        chosen = [u for u in stack if u.entry_id in set(entries)]
    else:
        assert after_step is not None
        chosen = [
            u
            for u in stack
            if u.effect_id in by_effect and by_effect[u.effect_id].step_index > after_step
        ]
    undone = {u.effect_id for u in chosen}
    steps = [by_effect[u.effect_id].step_index for u in chosen if u.effect_id in by_effect]
    first = min(steps, default=None)
    dependents = tuple(
        sorted(
            (
                e
                for e in effects
                if first is not None
                and e.step_index > first
                and e.effect_id not in undone
                and e.tier != ToolTier.SAFE.value
                and e.state in _IN_PLACE
            ),
            key=lambda e: e.step_index,
        )
    )
    return Selection(frozenset(u.entry_id for u in chosen), dependents)


async def load_selection(
    store: Store,
    org_id: str,
    session_id: str,
    *,
    entries: Sequence[str] | None = None,
    after_step: int | None = None,
) -> Selection:
    """`select_entries` over the session as stored now.

    Raises:
        NotFound: no such session in this org (or an entry not on its stack).
        InvalidRequest: see `select_entries`.
    """
    async with store.reader() as q:
        if await q.get_session(org_id, session_id) is None:
            raise NotFound(f"session '{session_id}' not found")
        stack = await q.list_undo_entries(org_id, session_id)
        effects = await q.list_effects(org_id, session_id)
    return select_entries(stack, effects, entries=entries, after_step=after_step)
