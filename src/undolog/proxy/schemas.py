"""Pydantic models of what the proxy's routes take and send, for the OpenAPI document only.

The routes build their bodies by hand (`wire.py`, orjson) and parse requests by hand; these
models describe those bodies, they never run on a request. `openapi.py` attaches them to the
routes. Fields a route may leave empty are nullable; JSON values a client chose (args,
results) are `Any`.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, RootModel, WithJsonSchema

__all__ = [
    "Approval",
    "CommitBody",
    "Compensation",
    "DecisionBody",
    "DecisionResult",
    "DryRunAnswer",
    "DryRunBody",
    "Effect",
    "ErrorBody",
    "FailBody",
    "Health",
    "NoteBody",
    "Overview",
    "PolicyRule",
    "PolicyRules",
    "PolicyRulesBody",
    "Ready",
    "RejectBody",
    "ResolveBody",
    "Rollback",
    "Session",
    "SessionClosed",
    "SessionView",
    "Tool",
    "ToolBody",
    "ToolCallAnswer",
    "ToolCallBody",
    "ToolCallPending",
    "UndoAfterStep",
    "UndoClaim",
    "UndoEntries",
    "UndoEntry",
    "UndoFailBody",
    "UndoReportBody",
    "UndoSelectionBody",
    "WholeSession",
]

# Text every store can hold: no NUL (PostgreSQL TEXT refuses it; see `inputs.py`).
STORABLE = r"^[^\x00]*$"
UUID = r"^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$"
_JSON_REF = {"$ref": "#/components/schemas/JsonValue"}
# Where a model's field is a `JsonValue`; `openapi.py` turns the mark into `_JSON_REF` (pydantic
# itself cannot point a field at a schema it does not generate).
JSON_MARK = "x-undolog-json-value"
# A JSON value the canonical form can hold (`undolog_sdk.signature.canonical_json`): any JSON,
# with every integer in [-2**63, 2**64 - 1]. Put in the document's components by `openapi.py`.
JSON_VALUE_SCHEMA: dict[str, Any] = {
    "description": "any JSON value; integers from -2**63 to 2**64 - 1",
    "anyOf": [
        {"type": "null"},
        {"type": "boolean"},
        {"type": "string"},
        {"type": "integer", "minimum": -(2**63), "maximum": 2**64 - 1},
        {"type": "number", "not": {"type": "integer"}},
        {"type": "array", "items": _JSON_REF},
        {"type": "object", "additionalProperties": _JSON_REF},
    ],
}
JsonValue = Annotated[Any, WithJsonSchema({JSON_MARK: True})]
JsonObject = Annotated[
    dict[str, Any], WithJsonSchema({"type": "object", "additionalProperties": {JSON_MARK: True}})
]
# A tool's name becomes a path segment upstream (`undolog.upstreams.check_tool_name`).
TOOL_NAME = r"^(?!\.+$)[A-Za-z0-9_.:-]{1,128}$"


class ErrorBody(BaseModel):
    """Every error answer (error-codes reference); some codes add fields of their own."""

    model_config = ConfigDict(extra="allow")
    request_id: str
    code: str = Field(description="a code of the error-codes reference")
    message: str
    timestamp: str = Field(description="RFC 3339, UTC")
    retry_after: int | None = Field(None, description="seconds; also the Retry-After header")
    quota: str | None = Field(
        None, description="rate_limited by the key's quota: calls, new_sessions, event_streams"
    )


class Health(BaseModel):
    status: Literal["ok"]
    service: str


class Ready(BaseModel):
    status: Literal["ok"]
    service: str
    store: Literal["ok"]


class Tool(BaseModel):
    name: str
    tier: str
    version: str
    compensation: dict[str, Any] | None
    idempotent_upstream: bool
    upstream: str | None = Field(description="a configured upstream; null: `default`")
    updated_at: str | None


# `args` of a compensation: an object, or a value taken as `{}` (null, false, 0, "", []).
_FALSY_OR_OBJECT = {
    "anyOf": [
        {"type": "object", "additionalProperties": {JSON_MARK: True}},
        {"enum": [None, False, 0, ""]},
        {"type": "array", "maxItems": 0},
    ]
}


class Compensation(BaseModel):
    """The compensation of a COMPENSABLE tool (`undolog_sdk.tier.CompensationDescriptor`)."""

    model_config = ConfigDict(extra="forbid")
    fn_name: str = Field(min_length=1, pattern=STORABLE)
    fn_version: str = Field("1.0.0", pattern=STORABLE)
    args: Annotated[Any, WithJsonSchema(_FALSY_OR_OBJECT)] = None
    max_retries: int = Field(3, ge=0, le=1000)
    retry_backoff_ms: int = Field(1000, ge=0, le=3_600_000)
    idempotent: bool = False


# A COMPENSABLE tool must come with its compensation (otherwise 400).
_COMPENSABLE_NEEDS_ONE: dict[str, Any] = {
    "if": {"properties": {"tier": {"const": "compensable"}}, "required": ["tier"]},
    "then": {
        "required": ["compensation"],
        "properties": {"compensation": {"$ref": "#/components/schemas/Compensation"}},
    },
}


class ToolBody(BaseModel):
    """`compensation` is required for (and checked only on) a `compensable` tool."""

    model_config = ConfigDict(extra="forbid", json_schema_extra=_COMPENSABLE_NEEDS_ONE)
    tier: Literal["safe", "compensable", "irreversible"]
    version: str = Field("1.0.0", pattern=STORABLE)
    compensation: dict[str, Any] | None = None
    idempotent_upstream: bool = False
    upstream: str | None = Field(
        None, description="the name of a configured upstream open to the caller's org"
    )


class Effect(BaseModel):
    effect_id: str
    session_id: str
    step_index: int
    tool_name: str
    tool_version: str | None
    tier: str
    state: str
    mode: str
    attempts: int
    call_signature: str
    args: Any
    result: Any
    error: str | None
    replay_count: int
    created_at: str | None
    executed_at: str | None
    finished_at: str | None
    lease_expires_at: str | None


class CommitBody(BaseModel):
    """The result of an SDK-executed call (any JSON value the canonical form can hold)."""

    result: JsonValue


class FailBody(BaseModel):
    error: str


_COMMITTED_NEEDS_RESULT: dict[str, Any] = {
    "if": {"properties": {"outcome": {"const": "committed"}}, "required": ["outcome"]},
    "then": {"required": ["result"]},
}


class ResolveBody(BaseModel):
    """`result` is required to resolve as `committed` (the operator says what the call did)."""

    model_config = ConfigDict(json_schema_extra=_COMMITTED_NEEDS_RESULT)
    outcome: Literal["committed", "failed"]
    result: JsonValue = None
    error: str | None = Field(None, pattern=STORABLE)


class Session(BaseModel):
    session_id: str
    state: str
    last_step: int
    created_at: str | None
    updated_at: str | None
    created_by: str | None = Field(
        None, description="in GET /sessions: `key:NAME` of the key whose call created it"
    )


class UndoEntry(BaseModel):
    entry_id: str
    seq: int
    effect_id: str
    fn_name: str
    fn_version: str
    args: Any
    max_retries: int
    retry_backoff_ms: int
    state: str
    attempts: int
    last_error: str | None
    registered_at: str | None


class UndoClaim(UndoEntry):
    payload: Any
    attempts_left: int
    claim_token: str


class UndoReportBody(BaseModel):
    claim_token: str = Field(min_length=1, description="from POST /undo/{entry}/claim")


class UndoFailBody(UndoReportBody):
    error: str


class NoteBody(BaseModel):
    note: str = Field(pattern=STORABLE)


class RecentCall(BaseModel):
    """One of a session's latest calls, shown beside an approval."""

    effect_id: str
    step_index: int
    tool_name: str
    tier: str
    state: str
    created_at: str | None


class RecentEvent(BaseModel):
    """An event from history, as `GET /events` sends it in `data:`, with its `id`."""

    id: str = Field(description="the event id: resume `GET /events` after it")
    type: str
    timestamp: str | None
    org_id: str
    session_id: str | None
    effect_id: str | None
    payload: Any


class Approval(BaseModel):
    id: str
    org_id: str
    session_id: str
    effect_id: str
    tool_name: str
    args: Any = Field(description="the call's arguments, as the JSON object it was made with")
    arguments: Any = Field(description="the same as `args` (kept for clients of 0.1.0)")
    status: str
    created_at: str | None
    timeout_at: str | None
    decided_at: str | None
    decided_by: str | None
    reason: str | None
    rule: str | None = Field(description="the policy rule that required or decided it")
    approvers_required: int = Field(description="distinct approver keys it needs")
    approvals: int = Field(description='approvals so far (a `require` rule\'s "1 of 2")')
    approved_by: list[str | None] = Field(description="who approved so far (`key:NAME`)")
    approved_args: Any = Field(description="the arguments an approver changed the call to")
    args_hash: str = Field(
        description="hash of the arguments the call runs with if approved now (approve "
        "with it as `args_hash`): BLAKE3 of their canonical JSON"
    )
    requested_args_hash: str = Field(description="hash of the requested arguments")
    args_diff: dict[str, Any] | None = Field(
        description="top-level keys `added`, `removed`, `changed` by the approver"
    )
    requested_by: str | None = Field(
        description="`key:NAME` of the key whose call asked for it (never the secret)"
    )
    mode: str | None = Field(
        description="who runs the call: `proxy` or `sdk` (only `proxy` takes changed `args`)"
    )
    recent_calls: list[RecentCall] | None = Field(
        None, description="with `recent_calls=N`: the session's latest N calls, last first"
    )


class WebhookDelivery(BaseModel):
    """A row of the webhook outbox (docs/notifications.md)."""

    delivery_id: int
    webhook: str
    event_id: str
    state: str = Field(description="pending | delivered | dead")
    attempts: int
    next_attempt_us: int
    last_error: str | None = Field(description="a status code or an error class, never a body")
    created_us: int
    updated_us: int


class PolicyRule(BaseModel):
    """One policy rule (docs/approvals.md, "Policy rules")."""

    model_config = ConfigDict(extra="forbid")
    name: str = Field(pattern=r"^[A-Za-z0-9_.-]{1,64}$")
    tool: str = Field("*", description="a tool's name, or `*` for every tool")
    condition: str = Field("true", max_length=2000, description="an expression over the args")
    action: Literal["approve", "deny", "require"]
    approvers: int = Field(1, ge=1, le=10, description="`require` only: distinct approvers")


class PolicyRulesBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    rules: list[PolicyRule] = Field(max_length=100)


class PolicyRules(BaseModel):
    rules: list[PolicyRule]


class DryRunBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    tool_name: str = Field(min_length=1, pattern=STORABLE)
    args: JsonObject


class DryRunAnswer(BaseModel):
    tool_name: str
    tier: str
    rule: PolicyRule | None
    decision: Literal["execute", "approval", "deny"]
    approvers: int
    error: str | None = None  # a condition that could not be decided: its rule failed closed


class SessionView(Session):
    effects: list[Effect]
    undo_stack: list[UndoEntry]
    approvals: list[dict[str, Any]]


class SessionClosed(BaseModel):
    session_id: str
    state: str


class UnsettledEffect(BaseModel):
    effect_id: str
    tool_name: str
    state: str


class DependentEffect(UnsettledEffect):
    step_index: int


class Rollback(BaseModel):
    """The rollback's answer; a 409/502 carries the same fields inside the error body."""

    session_id: str
    state: str
    undo_stack: list[UndoEntry]
    next_entry: UndoEntry | None
    in_doubt_effects: list[UnsettledEffect]
    outcome: str
    code: str | None = Field(None, description="`empty_undo_stack` when nothing was to undo")
    message: str | None = None
    selected: list[str] | None = Field(
        None, description="a selective undo only: the entries it undoes, newest first"
    )
    dependents: list[DependentEffect] | None = Field(
        None, description="a selective undo only: later calls left in place (docs/undo.md)"
    )


class UndoEntries(BaseModel):
    model_config = ConfigDict(extra="forbid")
    entries: list[Annotated[str, Field(min_length=1, max_length=200)]] = Field(
        min_length=1, max_length=100, description="the undo entries to undo"
    )
    force: bool = Field(False, description="undo even when later calls may depend on it")


class UndoAfterStep(BaseModel):
    model_config = ConfigDict(extra="forbid")
    after_step: int = Field(
        ge=0, le=4294967295, description="undo every entry of a call after this step"
    )
    force: bool = Field(False, description="undo even when later calls may depend on it")


class WholeSession(BaseModel):
    """`{}` (or no body): roll the whole session back."""

    model_config = ConfigDict(extra="forbid")


class UndoSelectionBody(RootModel[WholeSession | UndoEntries | UndoAfterStep]):
    """No body (or `{}`): roll the whole session back. With `entries`, or `after_step`: undo
    those entries only, and keep the session open (docs/undo.md)."""


class RejectBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    reason: str | None = None


class DecisionBody(RejectBody):
    args: JsonObject | None = Field(
        None, description="the arguments the call runs with instead (null: as requested)"
    )
    args_hash: str | None = Field(
        None,
        pattern="^[0-9a-f]{64}$",
        description="the `args_hash` of the approval you saw; if the call's arguments are no "
        "longer those, 409 approval_args_changed",
    )


class DecisionResult(BaseModel):
    status: str
    approval_id: str
    effect_id: str
    execution: (
        Literal[
            "awaiting_agent",
            "awaiting_approvers",
            "in_doubt",
            "failed",
            "commit_pending",
            "committed",
        ]
        | None
    ) = Field(None, description="approve only: what became of the approved call")
    result: Any = None
    error: str | None = None
    approvals: int | None = Field(None, description="awaiting_approvers: approvals so far")
    approvers_required: int | None = None


class ToolCallBody(BaseModel):
    session_id: str = Field(pattern=UUID, json_schema_extra={"format": "uuid"})
    tool_name: str = Field(min_length=1, pattern=STORABLE)
    tool_version: str | None = Field(None, pattern=STORABLE)
    step_index: int | None = Field(None, ge=0, le=4294967295)
    args: JsonObject
    mode: Literal["proxy", "sdk"] = "proxy"
    declared_tier: Literal["safe", "compensable", "irreversible"] | None = Field(
        None,
        description="the tier the caller's code declares; the stricter of it and the "
        "registry's applies",
    )
    declared_compensation: Compensation | None = Field(
        None,
        description="sdk mode only: the compensation the caller's code declares; recorded "
        "(and run on rollback) instead of the registry's",
    )


_TIER = Literal["safe", "compensable", "irreversible"]


class ToolCallAnswer(BaseModel):
    """`executed`/`replayed` carry the result; `execute` tells the SDK to run the tool and
    names the tier it runs under (`tier`: the stricter of `declared_tier` and
    `registered_tier`)."""

    status: Literal["executed", "replayed", "execute"]
    effect_id: str
    result: Any = None
    step_index: int | None = None
    attempt: int | None = None
    tier: _TIER | None = None
    declared_tier: _TIER | None = None
    registered_tier: _TIER | None = None


class ToolCallPending(BaseModel):
    status: Literal["pending_approval"]
    approval_id: str | None
    effect_id: str
    retry_after: int
    tier: _TIER | None = None
    declared_tier: _TIER | None = None
    registered_tier: _TIER | None = None


class Overview(BaseModel):
    calls: int
    replays: int
    pending_approvals: int
    sessions: int
    sessions_compensating: int
    sessions_needing_attention: int
    effects_in_doubt: int
    effects_by_state: dict[str, int]
    sessions_by_state: dict[str, int]
    approvals_by_status: dict[str, int]
