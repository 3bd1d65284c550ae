"""The rows the shared SQL reads and writes: column sets derived from the record dataclasses
(`_columns.columns`), the updatable columns, and the states statements filter on by default."""

from __future__ import annotations

from undolog.store._columns import columns
from undolog.store.records import (
    ApprovalRecord,
    AuditHeadRecord,
    EffectRecord,
    EventRecord,
    KeyRecord,
    OrgRecord,
    PolicyRecord,
    SessionRecord,
    ToolRecord,
    UndoEntryRecord,
)
from undolog_sdk.wire import EffectState

EFFECT = columns(EffectRecord)
UNDO = columns(UndoEntryRecord)
APPROVAL = columns(ApprovalRecord)
TOOL = columns(ToolRecord)
KEY = columns(KeyRecord)
ORG = columns(OrgRecord)
SESSION = columns(SessionRecord)
EVENT = columns(EventRecord)
POLICY = columns(PolicyRecord)
AUDIT_HEAD = columns(AuditHeadRecord)
UNDO_NEW = UNDO.without("seq")  # the database assigns `seq`

# The states the statements below filter on, bound as parameters. Callers may pass others;
# these defaults are the wire values (undolog_sdk.wire), not rules of the store.
RUNNING = EffectState.EXECUTING.value

# What an id can name, for `Queries.session_owner`: its table and id column.
OWNED_BY_SESSION = {
    "session": ("sessions", "session_id"),
    "effect": ("effects", "effect_id"),
    "approval": ("approvals", "approval_id"),
    "undo_entry": ("undo_entries", "entry_id"),
}

EFFECT_FIELDS = frozenset(
    {
        "state",
        "attempts",
        "result",
        "error",
        "lease_expires_us",
        "executed_us",
        "finished_us",
        "updated_us",
    }
)
UNDO_FIELDS = frozenset(
    {
        "state",
        "attempts",
        "last_error",
        "updated_us",
        "registered_us",
        "lease_expires_us",
        "claim_token_hash",
        "handed_until_us",
    }
)
APPROVAL_FIELDS = frozenset(
    {"status", "decided_us", "decided_by", "reason", "timeout_us", "approved_by",
     "approved_args", "rule", "approvers_required"}
)  # fmt: skip
