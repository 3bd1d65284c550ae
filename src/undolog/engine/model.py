"""What the engine hands out: decisions, session views, lock keys, and the saga invariant.

Plain values and pure helpers, shared by the engine, the saga and the approvals.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import Any

import blake3
import orjson

from undolog.engine.rules import Rule
from undolog.engine.tiers import Applied
from undolog.store.records import (
    ApprovalRecord,
    EffectRecord,
    SessionRecord,
    ToolRecord,
    UndoEntryRecord,
)
from undolog_sdk.errors import CompensationRegisteredTooLate, Database
from undolog_sdk.tier import ToolTier
from undolog_sdk.wire import Outcome  # the three answers of intercept, shared with the SDK

__all__ = [
    "ORG_WIDE",
    "Actor",
    "Call",
    "Decision",
    "IntentLost",
    "Outcome",
    "SessionView",
    "check_registered_before_executed",
    "event_json",
    "lock_key",
    "new_id",
    "now_us",
    "session_lock_key",
    "uuid4_text",
]


@dataclass(frozen=True, slots=True)
class Actor:
    """Who calls or reads: the API key id a session it creates is recorded under, and whether
    it is held to the sessions that key owns (an `agent` key) or sees the whole org."""

    key_id: str | None = None
    own_sessions_only: bool = False
    key_name: str | None = None  # recorded with what the key asked for (a denied call)

    def may_use(self, owner_key_id: str | None) -> bool:
        """Whether this actor may see and use a session owned by `owner_key_id` (None: a
        session from before owners were recorded, for org-wide actors only)."""
        if not self.own_sessions_only:
            return True
        return owner_key_id is not None and owner_key_id == self.key_id


# The engine's own callers (sweepers, approvals, the CLI): the whole org, no owner recorded.
ORG_WIDE = Actor()


@dataclass(frozen=True, slots=True)
class Call:
    """One tool call's inputs, checked, as intercept's steps hand them on."""

    org_id: str
    session_id: str
    tool: ToolRecord
    tier: ToolTier
    args: Any
    args_json: str
    tool_version: str | None
    mode: str
    actor: Actor
    rule: Rule | None = None  # the org's policy rule this call matched (applied if it is new)
    # The call declared a tier (SDK mode): what it ran under and why (`engine/tiers.py`).
    applied: Applied | None = None


@dataclass(frozen=True, slots=True)
class Decision:
    """What the caller of intercept must do next.

    `logged` is False for a SAFE call: nothing was written, and there is nothing to commit.
    The effect id doubles as the idempotency key the tool receives.
    """

    outcome: Outcome
    effect_id: str
    step_index: int | None
    signature: str | None
    tool: ToolRecord
    attempt: int = 1
    approval_id: str | None = None
    result_json: str | None = None
    logged: bool = True
    # An Execute of a call an approver changed: the args it runs with (docs/approvals.md).
    args_json: str | None = None
    # The call declared a tier (SDK mode): declared and registered tiers (`engine/tiers.py`).
    applied: Applied | None = None


@dataclass(frozen=True)
class SessionView:
    session: SessionRecord
    effects: list[EffectRecord]
    undo_entries: list[UndoEntryRecord]
    approvals: list[ApprovalRecord]
    replay_counts: dict[str, int] = field(default_factory=dict)


def check_registered_before_executed(entry: UndoEntryRecord, effect: EffectRecord) -> None:
    """The saga's core invariant: a compensation is on the stack before its call runs."""
    if effect.executed_us is None or not entry.registered_us < effect.executed_us:
        raise CompensationRegisteredTooLate(effect.effect_id)


def now_us() -> int:
    return time.time_ns() // 1000


def uuid4_text(random16: bytes) -> str:
    """The text of the version-4 UUID that `uuid.UUID(bytes=random16, version=4)` makes
    (lowercase, hyphenated), without building the UUID object."""
    h = random16.hex()
    variant = "89ab"[(random16[8] >> 4) & 3]  # the RFC 4122 variant bits over the byte's own
    return f"{h[:8]}-{h[8:12]}-4{h[13:16]}-{variant}{h[17:20]}-{h[20:32]}"


def new_id() -> str:
    """A fresh id (effect, undo entry, approval): `str(uuid.uuid4())`, same randomness
    (`os.urandom`) and format, at a third of its cost on the hot path of every new call."""
    return uuid4_text(os.urandom(16))


def lock_key(*parts: str) -> str:
    """A lock key (hex, as call signatures are) for anything that is not a call."""
    return blake3.blake3("\0".join(parts).encode()).hexdigest()


def session_lock_key(org_id: str, session_id: str) -> str:
    return lock_key("session", org_id, session_id)


def event_json(payload: dict[str, Any]) -> str:
    return orjson.dumps(payload).decode()


class IntentLost(Database):
    """The store's connection failed while a new run was being recorded: its intent may have
    committed, and nothing was sent to the tool. The caller records the run as not run once
    the store answers again (`services.held`), so that it is never left in doubt."""

    def __init__(self, detail: str, org_id: str, effect_id: str, attempt: int) -> None:
        super().__init__(detail)
        self.org_id = org_id
        self.effect_id = effect_id
        self.attempt = attempt
