"""Whether the answer of a step-less call reached its client.

A call without a step (every MCP call, and a REST call that leaves out `step_index`) is a retry
of an identical earlier call of its session for as long as that call's result is owed to the
client: it is still running, waits for approval, failed without a result, or committed but its
answer was lost (the client had gone when it was sent). Once a result has gone out, an
identical call is a new one and takes the next step. The engine matches on the effect's
`delivered_us`; this module sets it:

- `undolog.answer_watch.AnswerWatch` (the HTTP side, above this layer) watches one request:
  it notices the client leaving (uvicorn reports it to `receive()`) and whether the final
  body was sent while the client was still there;
- `Deliveries` marks the effects of answers that went out, after they went out. Until the
  mark is written, a call of the same session waits for it (briefly, bounded), so that a
  client that repeats a call the moment it has the answer is not taken for a retry. That
  holds within one process; across processes the worst case is the safe one: a deliberate
  repeat answered with the recorded result.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from dataclasses import dataclass, field

import structlog

from undolog.engine import Engine
from undolog_sdk.errors import UndoLogError

__all__ = ["Deliveries", "Delivery"]

# How long a call waits for the delivery mark of an earlier answer of its session.
SETTLE_TIMEOUT_S = 5.0

_log = structlog.get_logger("undolog.proxy")


@dataclass
class _Pending:
    count: int = 0
    settled: asyncio.Event = field(default_factory=asyncio.Event)


@dataclass(frozen=True, slots=True)
class Delivery:
    """An answer being sent: the effect it carries, in its org and session."""

    org_id: str
    session_id: str
    effect_id: str


def _one_spelling(session_id: str) -> str:
    """A session id as the engine keeps it (a UUID's canonical form), whatever its case."""
    try:
        return str(uuid.UUID(session_id))
    except (ValueError, TypeError, AttributeError):
        return session_id  # the engine refuses it, with the reason


class Deliveries:
    """Marks delivered answers; holds back calls of a session while a mark is on its way."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._pending: dict[tuple[str, str], _Pending] = {}

    async def settle(self, org_id: str, session_id: str) -> None:
        """Wait until the answers this process is sending on the session are marked."""
        pending = self._pending.get((org_id, _one_spelling(session_id)))
        if pending is None:
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(pending.settled.wait(), SETTLE_TIMEOUT_S)

    def begin(self, org_id: str, session_id: str, effect_id: str) -> Delivery:
        """Called before the answer goes out; `finish` must follow."""
        session_id = _one_spelling(session_id)
        pending = self._pending.setdefault((org_id, session_id), _Pending())
        pending.count += 1
        return Delivery(org_id, session_id, effect_id)

    async def finish(self, deliveries: list[Delivery], *, sent: bool) -> None:
        """The answers went out (`sent`) or were lost: mark them, then let calls through."""
        try:
            if sent:
                by_org: dict[str, list[str]] = {}
                for d in deliveries:
                    by_org.setdefault(d.org_id, []).append(d.effect_id)
                for org_id, effect_ids in by_org.items():
                    try:
                        await self.engine.mark_delivered(org_id, effect_ids)
                    except UndoLogError as exc:
                        # Unmarked, an identical call replays this answer: the safe side.
                        _log.warning("delivery_not_recorded", org_id=org_id, error=exc.message)
        finally:
            for d in deliveries:
                key = (d.org_id, d.session_id)
                pending = self._pending.get(key)
                if pending is None:
                    continue
                pending.count -= 1
                if pending.count <= 0:
                    pending.settled.set()
                    del self._pending[key]
