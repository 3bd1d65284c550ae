"""Session owners: what an `agent` key may see and use (docs/architecture.md, "Security model").

A session is owned by the API key whose call created it (`sessions.owner_key_id`). An actor
held to its own sessions (`Actor.own_sessions_only`: an `agent` key) sees and acts on those
only: anything of another key's session — the session, its effects, approvals and undo
entries — answers exactly as if it did not exist, so it cannot be probed; a tool call naming
another key's session is refused (`Forbidden`) with nothing recorded. Sessions from before
owners were recorded (no owner) are for org-wide actors (approver and admin keys) only.

The engine's intercept enforces the tool-call rule itself (in the same transaction as the
call); reads go through `ensure_visible` once, before the operation they guard.
"""

from __future__ import annotations

import enum

from undolog.engine.model import Actor
from undolog.store.protocol import Store
from undolog_sdk.errors import Forbidden, NotFound

__all__ = ["Owned", "ensure_visible", "session_refused"]


class Owned(enum.Enum):
    """What an id names; the value is the store's kind, the label what a 404 calls it."""

    SESSION = ("session", "session")
    EFFECT = ("effect", "effect")
    APPROVAL = ("approval", "approval")
    UNDO_ENTRY = ("undo_entry", "undo entry")

    @property
    def kind(self) -> str:
        return self.value[0]

    def not_found(self, id_: str) -> NotFound:
        """The 404 of a missing one, word for word (the engine's own `NotFound`)."""
        return NotFound(f"{self.value[1]} '{id_}' not found")


async def ensure_visible(store: Store, org_id: str, what: Owned, id_: str, actor: Actor) -> None:
    """Raise `what`'s NotFound when `id_` exists but belongs to a session `actor` may not use.

    Nothing to check (no query) for an org-wide actor. A missing id passes: the operation
    itself answers its own 404, the same one.
    """
    if not actor.own_sessions_only:
        return
    async with store.reader() as q:
        found, owner = await q.session_owner(org_id, what.kind, id_)
    if found and not actor.may_use(owner):
        raise what.not_found(id_)


def session_refused(session_id: str) -> Forbidden:
    """A tool call naming a session of another key (403 `forbidden`, nothing recorded)."""
    return Forbidden(
        f"session '{session_id}' belongs to another key: an agent key calls tools only in "
        "sessions it created"
    )
