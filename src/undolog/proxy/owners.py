"""The routes' one check of session ownership (the rule: `undolog.engine.owners`).

An `agent` key sees and acts on the sessions it created only. A route that takes the id of a
session, an effect, an approval or an undo entry calls `hide_unowned` first: for an agent
key, another key's thing answers the same 404 as a missing one. Approver and admin keys pass
without a query. `GET /sessions` and `GET /events` filter with `actor(request)` and
`EventFilter`; tool calls are checked by the engine's intercept.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from starlette.requests import Request

from undolog.engine.model import ORG_WIDE, Actor
from undolog.engine.owners import Owned, ensure_visible
from undolog.store import EventRecord, Store

if TYPE_CHECKING:
    from undolog.proxy.roles import Principal

__all__ = ["EventFilter", "Owned", "actor", "hide_unowned"]

# Sessions whose visibility a stream remembers (an owner never changes); cleared when full.
_CACHE_SIZE = 10_000


def actor(request: Request) -> Actor:
    """The caller as the engine checks it (org-wide when no key is behind the request)."""
    principal: Principal | None = getattr(request.state, "principal", None)
    return principal.actor if principal is not None else ORG_WIDE


async def hide_unowned(request: Request, what: Owned, id_: str) -> None:
    """Raise `what`'s 404 if `id_` belongs to a session the caller may not see."""
    await ensure_visible(
        request.app.state.runtime.store, request.state.org_id, what, id_, actor(request)
    )


class EventFilter:
    """Which events one SSE stream delivers: all of the org's for an org-wide key; for an
    agent key, those of its own sessions (none without a session). Per stream, so the live
    fan-out, the replay after `Last-Event-ID` and every process's broker share it."""

    def __init__(self, store: Store, org_id: str, who: Actor) -> None:
        self._store, self._org_id, self._actor = store, org_id, who
        self._visible: dict[str, bool] = {}

    async def delivers(self, event: EventRecord) -> bool:
        if not self._actor.own_sessions_only:
            return True
        session_id = event.session_id
        if session_id is None:
            return False
        seen = self._visible.get(session_id)
        if seen is None:
            # The session row is committed before (or with) its first event: it is there.
            async with self._store.reader() as q:
                found, owner = await q.session_owner(self._org_id, "session", session_id)
            seen = found and self._actor.may_use(owner)
            if not found:
                return False  # not remembered: a session of this id may yet be created
            if len(self._visible) >= _CACHE_SIZE:
                self._visible.clear()
            self._visible[session_id] = seen
        return seen
