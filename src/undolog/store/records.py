"""Rows of the store as frozen dataclasses.

JSON payloads (tool args, results, undo args, event payloads) are kept as the exact JSON text
that was stored, so a replay hands back the recorded bytes without a parse/serialise round
trip. Times are integer microseconds since the Unix epoch (`*_us`): portable across SQLite and
PostgreSQL, and fine-grained enough to order `registered_at < executed_at`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from undolog_sdk.wire import EffectState, ExecutionMode

__all__ = [
    "SESSION_TOUCH_US",
    "ApprovalRecord",
    "AuditHeadRecord",
    "EffectRecord",
    "EventRecord",
    "Finish",
    "KeyRecord",
    "McpTaskRecord",
    "OrgRecord",
    "PolicyRecord",
    "SessionRecord",
    "ToolRecord",
    "UndoEntryRecord",
    "WebhookDeliveryRecord",
]


@dataclass(frozen=True, slots=True)
class OrgRecord:
    org_id: str
    name: str
    approval_timeout_s: int
    auto_approve_on_timeout: bool
    created_us: int
    # Days a finished session is kept (docs/retention.md); None: kept forever.
    retention_days: int | None = None


@dataclass(frozen=True, slots=True)
class PolicyRecord:
    """An org's policy rules as one JSON list, in order (`undolog.engine.rules`)."""

    org_id: str
    rules_json: str
    updated_us: int
    updated_by: str | None


@dataclass(frozen=True, slots=True)
class KeyRecord:
    """An API key as stored: its SHA-256 only, never the key itself."""

    key_id: str  # opaque, shown to operators ("key_" + 12 hex)
    key_hash: str
    org_id: str
    name: str
    role: str  # Role value: agent | approver | admin
    source: str  # where it comes from: config | cli | demo
    created_us: int
    last_used_us: int | None
    revoked_us: int | None


@dataclass(frozen=True, slots=True)
class ToolRecord:
    org_id: str
    name: str
    tier: str  # ToolTier value: safe | compensable | irreversible
    version: str
    compensation_json: str | None  # CompensationDescriptor as JSON, for COMPENSABLE tools
    idempotent_upstream: bool
    upstream: str | None  # a configured upstream's name; None: `default`
    updated_us: int


# A call touches its session's `updated_us` only when it is older than this (microseconds):
# most calls then change no indexed column of the session row (a HOT update on PostgreSQL).
SESSION_TOUCH_US = 1_000_000


@dataclass(frozen=True, slots=True)
class SessionRecord:
    org_id: str
    session_id: str
    state: str  # SessionState value
    last_step: int  # highest step index seen; an unnumbered call takes last_step + 1
    created_us: int
    # Its last change of state, or its last call to within `SESSION_TOUCH_US` (a call moves it
    # only when it is older than that).
    updated_us: int
    # The id of the API key whose call created it (None: created before owners were kept).
    owner_key_id: str | None = None


@dataclass(frozen=True, slots=True)
class EffectRecord:
    effect_id: str
    org_id: str
    session_id: str
    step_index: int
    tool_name: str
    tool_version: str | None
    tier: str
    call_signature: str
    args_json: str
    state: str  # EffectState value
    mode: str  # ExecutionMode value: who runs the tool
    attempts: int
    result_json: str | None
    error: str | None
    lease_expires_us: int | None
    executed_us: int | None
    finished_us: int | None
    created_us: int
    updated_us: int


@dataclass(frozen=True, slots=True)
class UndoEntryRecord:
    seq: int  # push order, assigned by the store; the stack unwinds highest first
    entry_id: str
    org_id: str
    session_id: str
    effect_id: str
    fn_name: str
    fn_version: str
    args_json: str
    max_retries: int
    retry_backoff_ms: int
    registered_us: int
    state: str  # UndoState value
    attempts: int
    last_error: str | None
    updated_us: int
    runner: str = ExecutionMode.PROXY  # who runs the compensation (ExecutionMode value)
    lease_expires_us: int | None = None  # while claimed (running): when the claim lapses
    claim_token_hash: str | None = None  # while claimed: SHA-256 hex of the holder's token
    handed_until_us: int | None = None  # a rollback handed it to its runner: claim it till then


@dataclass(frozen=True, slots=True)
class ApprovalRecord:
    approval_id: str
    org_id: str
    effect_id: str
    session_id: str
    tool_name: str
    args_json: str
    status: str  # ApprovalStatus value
    created_us: int
    timeout_us: int
    decided_us: int | None
    decided_by: str | None
    reason: str | None
    # Migration 13 (docs/approvals.md): the policy rule that asked for or decided it, how many
    # distinct approver keys it needs, who approved so far (JSON list of {"key_id", "by"}),
    # the arguments an approver changed the call to. Migration 16: the id of the API key whose
    # call asked for it (None: no key, e.g. the engine's own).
    rule: str | None = None
    approvers_required: int = 1
    approved_by_json: str = "[]"
    approved_args_json: str | None = None
    requested_by_key_id: str | None = None


@dataclass(frozen=True, slots=True)
class EventRecord:
    event_id: int
    org_id: str
    type: str
    session_id: str | None
    effect_id: str | None
    payload_json: str
    created_us: int


@dataclass(frozen=True, slots=True)
class WebhookDeliveryRecord:
    """One event to deliver to one webhook (the `webhook_outbox` table, migration 14)."""

    delivery_id: int
    org_id: str
    webhook: str  # the configured webhook's name
    event_id: int
    state: str  # pending | delivered | dead (services/webhooks.py `DeliveryState`)
    attempts: int
    next_attempt_us: int
    last_error: str | None
    created_us: int
    updated_us: int


@dataclass(frozen=True, slots=True)
class AuditHeadRecord:
    """Where an org's audit chain stands after its last export (docs/audit.md)."""

    org_id: str
    head_hash: str  # the `hash` of the chain's last record
    last_event_id: int  # the event that record came from: the next export starts after it
    record_count: int  # records in the chain from its start
    exported_us: int


@dataclass(frozen=True, slots=True)
class McpTaskRecord:
    """An MCP task: a task-augmented `tools/call` of the gateway (migration 19, docs/mcp.md).

    A call that waits for a person keeps only its effect and approval (its state is derived
    from them) until the task ends, when its answer is kept (migration 23: the status a task
    ends in is final); a call that ended at once keeps the answer it gave (`result_json`)."""

    task_id: str  # random, unguessable; looked up with the caller's org
    org_id: str
    owner_key_id: str | None  # the API key whose call created it
    session_id: str | None  # None: a read-only call made without a session
    effect_id: str | None  # the call's effect, when it recorded one
    approval_id: str | None  # set while/when the call waited for a person
    tool_name: str
    result_json: str | None  # the `CallToolResult` (wire JSON) of a call that ended at once
    created_us: int
    ttl_ms: int
    expires_us: int  # created_us + ttl: the row may be deleted from then on
    ended_us: int | None = None  # when a task that waited ended (None: created ended)
    answers_effect: bool = False  # that kept answer is the effect's result (not a refusal)


# The states an effect is finished from unless a caller says otherwise (the wire values).
FINISHABLE = (EffectState.EXECUTING.value, EffectState.IN_DOUBT.value)
SDK_RUNNER = ExecutionMode.SDK.value


@dataclass(frozen=True, slots=True)
class Finish:
    """An effect's end, as `finish_effect` writes it: the effect moves from one of
    `from_states` (running or in doubt) to `target` with its result or error, and its event
    (`event_type`, the payload's `stage`, `tool_name` and `attempt`, then `extra`) is logged
    in the same transaction. An effect whose mode is `self_reporting_mode` (its runner
    reports what it has) counts as delivered then."""

    org_id: str
    effect_id: str
    target: str
    result_json: str | None
    error: str | None
    now_us: int
    event_type: str
    extra: dict[str, Any] = field(default_factory=dict)
    from_states: Sequence[str] = FINISHABLE
    self_reporting_mode: str = SDK_RUNNER
