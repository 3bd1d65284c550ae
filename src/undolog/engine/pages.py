"""Searched, filtered and paged lists: sessions, approvals (with who asked and the session's
recent calls) and the latest events (docs/dashboard.md).

A page is read after a keyset, `(sort value, id)` of the last row of the page before; the
caller turns it into an opaque cursor. Every list is scoped by the org, and for an actor held
to its own sessions (an `agent` key) by its key id, in the SQL itself: a filter or a cursor
only ever narrows what the caller may see.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from undolog.engine.approvals import LISTABLE_STATUSES
from undolog.engine.model import ORG_WIDE, Actor
from undolog.engine.states import SessionState
from undolog.store.protocol import Store
from undolog.store.records import ApprovalRecord, EffectRecord, EventRecord, SessionRecord
from undolog_sdk.errors import InvalidRequest, NotFound

__all__ = [
    "ANY_STATUS",
    "MAX_RECENT_CALLS",
    "SESSION_STATES",
    "ApprovalListing",
    "Keyset",
    "Page",
    "Pages",
    "SessionListing",
]

T = TypeVar("T")
Keyset = tuple[int, str]  # (sort value, id) of the last row of a page

SESSION_STATES = frozenset(s.value for s in SessionState)
ANY_STATUS = "all"  # the approvals' `state` that lists every status
MAX_RECENT_CALLS = 20


@dataclass(frozen=True)
class Page(Generic[T]):
    """One page of a list; `after` positions the next one (None: this is the last)."""

    items: list[T]
    after: Keyset | None


@dataclass(frozen=True)
class SessionListing:
    session: SessionRecord
    created_by: str | None  # the name of the key whose call created it


@dataclass(frozen=True)
class ApprovalListing:
    approval: ApprovalRecord
    requested_by: str | None  # the name of the key whose call asked for it
    recent_calls: list[EffectRecord] = field(default_factory=list)
    mode: str | None = None  # who runs the call: `proxy` or `sdk` (docs/approvals.md)


def _owner(actor: Actor) -> tuple[bool, str | None]:
    """(whether the actor sees nothing at all, the owner key id to narrow to)."""
    if not actor.own_sessions_only:
        return False, None
    return actor.key_id is None, actor.key_id


class Pages:
    """The lists, read from the store (no writes)."""

    def __init__(self, store: Store) -> None:
        self.store = store

    async def sessions(
        self,
        org_id: str,
        limit: int,
        *,
        actor: Actor = ORG_WIDE,
        after: Keyset | None = None,
        state: str | None = None,
        text: str | None = None,
    ) -> Page[SessionListing]:
        """Sessions, latest update first.

        Raises:
            InvalidRequest: `state` is no session state.
        """
        if state is not None and state not in SESSION_STATES:
            raise InvalidRequest(
                f"invalid state {state!r}: one of {', '.join(sorted(SESSION_STATES))}"
            )
        nothing, owner = _owner(actor)
        if nothing:
            return Page([], None)
        async with self.store.reader() as q:
            rows = await q.page_sessions(
                org_id, limit + 1, after=after, owner=owner, state=state, text=text
            )
        items = [SessionListing(s, name) for s, name in rows[:limit]]
        last = items[-1].session if len(rows) > limit else None
        return Page(items, None if last is None else (last.updated_us, last.session_id))

    async def approvals(
        self,
        org_id: str,
        limit: int,
        *,
        after: Keyset | None = None,
        status: str | None = None,
        tool: str | None = None,
        recent_calls: int = 0,
    ) -> Page[ApprovalListing]:
        """Approvals newest first (`status` None or `all`: every status), each with who asked
        and, if `recent_calls`, that many of its session's latest calls.

        Raises:
            InvalidRequest: `status` is no approval status.
        """
        if status == ANY_STATUS:
            status = None
        if status is not None and status not in LISTABLE_STATUSES:
            choices = ", ".join(sorted(LISTABLE_STATUSES | {ANY_STATUS}))
            raise InvalidRequest(f"invalid state {status!r}: one of {choices}")
        async with self.store.reader() as q:
            rows = await q.page_approvals(org_id, limit + 1, after=after, status=status, tool=tool)
            shown = rows[:limit]
            recent = await q.recent_effects(
                org_id, sorted({a.session_id for a, _ in shown}), recent_calls
            )
            modes = await q.effect_modes(org_id, [a.effect_id for a, _ in shown])
        items = [
            ApprovalListing(a, name, recent.get(a.session_id, []), modes.get(a.effect_id))
            for a, name in shown
        ]
        last = items[-1].approval if len(rows) > limit else None
        return Page(items, None if last is None else (last.created_us, last.approval_id))

    async def approval(
        self, org_id: str, approval_id: str, *, recent_calls: int = 0
    ) -> ApprovalListing:
        """One approval with who asked (and its session's latest calls).

        Raises:
            NotFound: no such approval in this org.
        """
        async with self.store.reader() as q:
            rows = await q.page_approvals(org_id, 1, approval_id=approval_id)
            if not rows:
                raise NotFound(f"approval '{approval_id}' not found")
            approval, name = rows[0]
            recent = await q.recent_effects(org_id, [approval.session_id], recent_calls)
            modes = await q.effect_modes(org_id, [approval.effect_id])
        return ApprovalListing(
            approval, name, recent.get(approval.session_id, []), modes.get(approval.effect_id)
        )

    async def recent_events(
        self,
        org_id: str,
        limit: int,
        *,
        actor: Actor = ORG_WIDE,
        session_id: str | None = None,
    ) -> Sequence[EventRecord]:
        """The latest `limit` events the actor may see (an `agent` key: its sessions' only),
        newest first."""
        nothing, owner = _owner(actor)
        if nothing:
            return []
        async with self.store.reader() as q:
            return await q.recent_events(org_id, limit, owner=owner, session_id=session_id)
