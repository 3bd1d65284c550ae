"""Values that travel between the SDK, the proxy and the stores, each spelled once.

The server's engine and stores use these same enums (it depends on this package), so a state,
an event type or a mode is written in one place. Each member is also the plain string it
stands for (`EffectState.COMMITTED == "committed"`, `str()` and f-strings give the value), so
rows read from a store and JSON bodies compare equal to them without conversion. They are
`(str, Enum)` rather than `enum.StrEnum` because the SDK also runs on Python 3.10.

The tiers are `undolog_sdk.tier.ToolTier` (its values, in order: `TIER_VALUES` there). The
rule for text every store can hold is here as well (`unstorable`, `scrub`): the SDK checks it
in compensation descriptors and the server at the edge of its API.

The lifecycles (which move is legal) are the server's: `undolog.engine.states`.
"""

from __future__ import annotations

import enum

__all__ = [
    "ApprovalStatus",
    "CallStatus",
    "EffectState",
    "EventType",
    "ExecutionMode",
    "Outcome",
    "RollbackOutcome",
    "SessionState",
    "UndoState",
    "scrub",
    "unstorable",
]


class _WireEnum(str, enum.Enum):  # not StrEnum, which is 3.11+: the SDK runs on 3.10
    """A string enum whose `str()` and format are its value (as `enum.StrEnum` on 3.11+)."""

    def __str__(self) -> str:
        return str(self.value)

    def __format__(self, format_spec: str) -> str:
        return str(self.value).__format__(format_spec)


class ExecutionMode(_WireEnum):
    """Who runs a tool call, or a compensation (the `mode` of a tool call, the `runner` of an
    undo entry)."""

    PROXY = "proxy"  # the proxy runs it on the upstream tool server
    SDK = "sdk"  # the agent runs it locally and reports the outcome


class Outcome(_WireEnum):
    """The three answers of intercept (names as in the SDK reference)."""

    EXECUTE = "Execute"
    REPLAY = "Replay"
    AWAITING_APPROVAL = "AwaitingApproval"


class CallStatus(_WireEnum):
    """The `status` of an answer to `POST /mcp/tool_call`."""

    EXECUTED = "executed"  # the proxy ran the tool: `result` holds its answer
    REPLAYED = "replayed"  # the recorded result of an earlier run
    PENDING_APPROVAL = "pending_approval"  # 202: waits for a person
    EXECUTE = "execute"  # SDK mode: the agent runs the tool, then commits or fails it


class EffectState(_WireEnum):
    PENDING = "pending"  # intent recorded, nothing decided yet (never stored past its txn)
    EXECUTING = "executing"  # the tool may be running; guarded by a lease
    COMMITTED = "committed"  # ran and its result is recorded: retries replay it
    FAILED = "failed"  # ran and failed: a retry is a new attempt on the same effect
    AWAITING_APPROVAL = "awaiting_approval"  # IRREVERSIBLE: waits for a person
    REJECTED = "rejected"  # a person said no
    TIMED_OUT = "timed_out"  # nobody decided in time, and the org does not auto-approve
    IN_DOUBT = "in_doubt"  # the lease expired mid-run: outcome unknown until resolved
    COMPENSATING = "compensating"  # its compensation is running
    COMPENSATED = "compensated"  # undone
    COMPENSATION_FAILED = "compensation_failed"  # the undo gave up: a person must act


class SessionState(_WireEnum):
    ACTIVE = "active"  # accepting calls
    COMPLETED = "completed"  # ended normally
    FAILED = "failed"  # ended badly; may be rolled back
    COMPENSATING = "compensating"  # its undo stack is unwinding
    COMPENSATED = "compensated"  # everything undoable was undone
    COMPENSATION_FAILED = "compensation_failed"  # the unwinding stopped at a failed entry
    HALTED = "halted"  # a person rejected one of its calls


class UndoState(_WireEnum):
    PENDING = "pending"  # on the stack, not run
    RUNNING = "running"  # claimed by a runner
    COMPENSATED = "compensated"  # ran successfully
    FAILED = "failed"  # exhausted its retries
    SKIPPED = "skipped"  # its forward call never committed: nothing to undo
    RESOLVED = "resolved"  # an operator marked it handled by hand


class ApprovalStatus(_WireEnum):
    PENDING = "pending"
    APPROVED = "approved"
    REJECTED = "rejected"
    TIMED_OUT = "timed_out"
    AUTO_APPROVED = "auto_approved"


class RollbackOutcome(_WireEnum):
    """Where a rollback stands after a runner has done what it could (the `outcome` of
    `POST /sessions/{id}/rollback`)."""

    COMPENSATED = "compensated"  # every entry is undone (or skipped/resolved)
    EMPTY = "empty_undo_stack"  # nothing was ever on the stack
    COMPENSATION_FAILED = "compensation_failed"  # an entry gave up: an operator must act
    WAITING_FOR_RUNNER = "waiting_for_runner"  # the top entry is the other runner's
    # The two refusals carry the wire code they are answered with (409).
    BUSY = "in_progress"  # another runner holds the top entry
    BLOCKED = "effect_in_doubt"  # an entry's forward call is in doubt or still running


class EventType(_WireEnum):
    """The `type` of an event row, and the SSE event name (`GET /events`).

    The first seven are the REST reference's; the rest are UndoLog's additions for approval
    timeouts, sessions and the undo stack.
    """

    EFFECT_INTERCEPTED = "effect_intercepted"
    EFFECT_COMMITTED = "effect_committed"
    EFFECT_REPLAYED = "effect_replayed"
    EFFECT_FAILED = "effect_failed"  # also a move to in_doubt (payload stage `in_doubt`)
    APPROVAL_REQUIRED = "approval_required"
    APPROVAL_APPROVED = "approval_approved"  # also an auto-approval (payload `status`)
    # One of N approvers approved; the call still waits for the others (docs/approvals.md).
    APPROVAL_PARTIALLY_APPROVED = "approval_partially_approved"
    APPROVAL_REJECTED = "approval_rejected"
    APPROVAL_TIMED_OUT = "approval_timed_out"
    SESSION_COMPLETED = "session_completed"
    SESSION_COMPENSATING = "session_compensating"
    SESSION_COMPENSATED = "session_compensated"
    COMPENSATION_STARTED = "compensation_started"
    COMPENSATION_COMPLETED = "compensation_completed"
    COMPENSATION_RETRYING = "compensation_retrying"
    COMPENSATION_FAILED = "compensation_failed"
    COMPENSATION_SKIPPED = "compensation_skipped"  # its forward call never committed
    COMPENSATION_COMPENSATED = "compensation_compensated"  # settled without running again
    COMPENSATION_RETRIED = "compensation_retried"  # an operator put it back on the stack
    COMPENSATION_RESOLVED = "compensation_resolved"  # an operator handled it by hand
    CALL_DENIED = "call_denied"  # a policy rule refused a new call: nothing ran or was recorded

    @classmethod
    def compensation(cls, state: UndoState) -> EventType:
        """The event of an undo entry settled in `state` (skipped or compensated)."""
        return cls(f"compensation_{state.value}")


def unstorable(text: str) -> bool:
    """True when no store can hold `text`: it has a NUL (PostgreSQL text cannot hold it) or
    a lone surrogate (no UTF-8 for it)."""
    if "\x00" in text:
        return True
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def scrub(text: str) -> str:
    """`text` made storable: a NUL becomes U+FFFD, a lone surrogate `?`.

    For text that must be recorded whatever it holds (a failure report, a reason): refusing it
    over one character would lose the record, which is worse than a changed character.
    """
    if not unstorable(text):
        return text
    return text.replace("\x00", "\ufffd").encode("utf-8", "replace").decode("utf-8")
