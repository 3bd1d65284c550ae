"""The saga's rule and records: `plan_next` (what to do with an undo stack, a pure function),
the claim a runner holds, and the payload a compensation is called with. `Saga` (saga.py)
carries them out in transactions.

Each claim carries a fresh, unguessable claim token; reporting on the entry (`complete`,
`fail_attempt`) requires it, so no other caller of the org can settle an entry someone else
is running (which once marked a compensation that ran `failed`). Only the token's SHA-256 is
stored: the token is a bearer credential, and a reader of the database (or a backup) must not
be able to report in the runner's name. A new claim after the lease lapsed replaces the hash,
which invalidates the old holder's token.
"""

from __future__ import annotations

import enum
import hashlib
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from undolog.engine.states import EffectState, UndoState
from undolog.store.records import EffectRecord, UndoEntryRecord
from undolog_sdk.errors import InvalidStateTransition

_DONE_ENTRY_STATES = frozenset({UndoState.COMPENSATED, UndoState.SKIPPED, UndoState.RESOLVED})
# Effects whose forward call never took effect: their compensation has nothing to undo.
_NEVER_RAN = frozenset(
    {EffectState.FAILED, EffectState.REJECTED, EffectState.TIMED_OUT, EffectState.AWAITING_APPROVAL}
)
# Effects whose outcome is unknown: the unwinding waits for an operator.
_UNSETTLED = frozenset({EffectState.EXECUTING, EffectState.IN_DOUBT, EffectState.PENDING})


class StepKind(enum.Enum):
    RUN = "run"  # claim this entry and run its compensation
    SKIP = "skip"  # its forward call never committed: mark skipped, look further down
    SETTLE = "settle"  # its effect is already compensated: mark the entry so
    BUSY = "busy"  # another runner holds it under a live lease
    OTHER_RUNNER = "other_runner"  # the top entry belongs to the other kind of runner
    BLOCKED = "blocked"  # its forward call is in doubt or still running
    FAILED = "failed"  # it exhausted its retries: an operator must retry or resolve it
    LOST = "lost"  # its runner died mid-run and it is not idempotent: outcome unknown
    DONE = "done"  # nothing left to undo


@dataclass(frozen=True, slots=True)
class Step:
    kind: StepKind
    entry: UndoEntryRecord | None = None
    effect: EffectRecord | None = None


def plan_next(
    stack: Sequence[tuple[UndoEntryRecord, EffectRecord]],
    runner: str,
    now_us: int,
    idempotent: Collection[str] | None = None,
) -> Step:
    """What to do next with a stack given newest first, for a runner of kind `runner`.

    `idempotent` holds the ids of entries whose compensation is declared idempotent (None:
    every entry). A claim whose lease lapsed (its runner died mid-run) runs again only for
    those; any other is `LOST`: its outcome is unknown and an operator must act.
    """
    for entry, effect in stack:
        if entry.state in _DONE_ENTRY_STATES:
            continue
        if entry.state == UndoState.FAILED:
            return Step(StepKind.FAILED, entry, effect)
        if effect.state in _NEVER_RAN:
            return Step(StepKind.SKIP, entry, effect)
        if effect.state == EffectState.COMPENSATED:
            return Step(StepKind.SETTLE, entry, effect)
        if effect.state in _UNSETTLED:
            return Step(StepKind.BLOCKED, entry, effect)
        lease = entry.lease_expires_us
        if entry.state == UndoState.RUNNING and lease is not None and lease > now_us:
            return Step(StepKind.BUSY, entry, effect)
        if (
            entry.state == UndoState.RUNNING
            and entry.last_error is None  # an attempt had started (see `Saga.start_attempt`)
            and idempotent is not None
            and entry.entry_id not in idempotent
        ):
            return Step(StepKind.LOST, entry, effect)
        if entry.runner != runner:
            return Step(StepKind.OTHER_RUNNER, entry, effect)
        return Step(StepKind.RUN, entry, effect)
    return Step(StepKind.DONE)


@dataclass(frozen=True, slots=True)
class Claim:
    """A claimed entry: run `entry`'s compensation with `payload`, then report with `token`."""

    entry: UndoEntryRecord
    effect: EffectRecord
    payload: dict[str, Any]
    attempts_left: int
    idempotent: bool = False  # the compensation may run again when its outcome is unknown
    token: str = ""


class NotHandedOver(InvalidStateTransition):
    """A claim of an undo entry that no rollback handed to its runner (or whose hand-off
    lapsed, or was already claimed): 409 `invalid_state_transition`, with a message that says
    how to get it handed. Without this, an agent could run a compensation outside any
    rollback, past a selective undo's `dependent_effects` (docs/undo.md)."""

    def __init__(self, entry_id: str, current_state: str) -> None:
        super().__init__(entry_id, current_state, UndoState.RUNNING.value)
        self.entry_id = entry_id
        self.message = (
            f"Undo entry '{entry_id}' was not handed to a runner: claim it after "
            "POST /sessions/{id}/rollback answers waiting_for_runner with it as next_entry"
        )
        self.args = (self.message,)

    def fields(self) -> dict[str, Any]:
        return {"entry_id": self.entry_id, "current_state": self.current_state,
                "target_state": self.target_state}  # fmt: skip


def handed(entry: UndoEntryRecord, now_us: int) -> bool:
    """Whether a rollback handed `entry` to its runner and the hand-off still holds."""
    return entry.handed_until_us is not None and entry.handed_until_us > now_us


LOST_RUN = (
    "compensation outcome unknown: its runner stopped mid-run and it is not declared "
    "idempotent; check the tool, then retry or resolve this entry"
)


def is_idempotent(compensation_json: str | None) -> bool:
    """Whether a tool's registered compensation is declared `idempotent`."""
    if compensation_json is None:
        return False
    data = orjson.loads(compensation_json)
    return isinstance(data, dict) and data.get("idempotent") is True


def hash_claim_token(token: str) -> str:
    """SHA-256 hex of a claim token: the only form in which the store keeps it."""
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


def compensation_payload(
    entry: UndoEntryRecord, effect: EffectRecord, approved_args_json: str | None = None
) -> dict[str, Any]:
    """What a compensation receives: its captured args plus the forward call's args/result
    (the args it ran with: an approver's changed ones, if any)."""
    payload: dict[str, Any] = dict(orjson.loads(entry.args_json))
    payload["original_args"] = orjson.loads(approved_args_json or effect.args_json)
    payload["original_result"] = orjson.loads(effect.result_json) if effect.result_json else None
    return payload
