"""Approve with changes: the arguments an approver edits, who approved what, and the diff shown.

Pure values and functions used by `approvals.py` (the decision) and the front ends (the
diff, the hashes). docs/approvals.md ("Approve with changes", "What an approval approves",
"Several approvers") is the reference.

Every approval is for one exact argument set, named by its hash (`args_hash`: the BLAKE3 of
the arguments' canonical JSON, the bytes the call signature hashes them as). The arguments on
the table are the requested ones until an approver edits them; an edit starts a new round, so
the approvers counted are exactly those who approved the arguments that run.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson
from blake3 import blake3

from undolog.store.records import ApprovalRecord
from undolog_sdk.errors import ApprovalArgsChanged, Forbidden, InvalidRequest
from undolog_sdk.signature import canonical_json

__all__ = [
    "Approver",
    "Edit",
    "approvers_after",
    "args_diff",
    "args_hash",
    "check_edit",
    "proposed_args",
]


@dataclass(frozen=True, slots=True)
class Approver:
    """Who decides: the authenticated key's id and its recorded name (`key:NAME`)."""

    key_id: str | None
    by: str | None


@dataclass(frozen=True, slots=True)
class Edit:
    """Arguments an approver wants the call to run with, canonicalised."""

    args_json: str


def args_hash(args_json: str) -> str:
    """The hash that names one argument set: BLAKE3-256 of its canonical JSON (UTF-8), as 64
    lowercase hex characters. `args_json` must be canonical (`canonical_json`)."""
    return blake3(args_json.encode("utf-8")).hexdigest()


def proposed_args(approval: ApprovalRecord) -> str:
    """The canonical arguments the call runs with if approved now: an approver's edit, else
    the requested ones."""
    return approval.approved_args_json or approval.args_json


def check_edit(args: Any) -> Edit:
    """The approver's arguments, checked as a tool call's are (a JSON object that has a
    canonical form; the body limit bounds its size). Raises `InvalidRequest`."""
    if not isinstance(args, dict):
        raise InvalidRequest("'args' must be a JSON object")
    try:
        return Edit(canonical_json(args))
    except ValueError as exc:
        raise InvalidRequest(f"'args' cannot be canonicalised: {exc}") from None


def approvers_after(
    approval: ApprovalRecord,
    who: Approver,
    edit: Edit | None,
    seen_hash: str | None = None,
    *,
    allow_self_approval: bool = False,
) -> tuple[list[dict[str, Any]], str | None]:
    """Who has approved once `who` approves (distinct keys, each with the `args_hash` it
    approved), and the edited arguments on the table (None: the requested ones).

    `seen_hash` is the hash of the arguments the approver was shown (optional). An approval
    without `edit` approves the arguments on the table, and only if the approver can have
    seen them: when `seen_hash` names others, or when it is missing while an approver's
    edit is on the table, it is refused. Arguments that differ from those on the table
    start a new round from this approver: every approver counted approved the very
    arguments the call runs with. An edit back to the requested arguments is no edit (None).

    Raises:
        Forbidden: the key that made the call approving it (allowed by `allow_self_approval`
            only for an approval no policy rule asked for, that needs one approver).
        ApprovalArgsChanged: the arguments on the table are not the ones the approver saw.
    """
    if (
        who.key_id is not None
        and who.key_id == approval.requested_by_key_id
        and (
            not allow_self_approval
            or approval.rule is not None  # a policy rule asked for another person
            or approval.approvers_required > 1
        )
    ):
        raise Forbidden("the key that made the call cannot approve it")
    current = approval.approved_args_json
    on_table = args_hash(proposed_args(approval))
    if seen_hash is not None and seen_hash != on_table:
        raise ApprovalArgsChanged(approval.approval_id, on_table)
    approved: list[dict[str, Any]] = orjson.loads(approval.approved_by_json)
    if edit is not None:
        wanted = None if edit.args_json == approval.args_json else edit.args_json
        if wanted != current:
            return [_entry(who, args_hash(edit.args_json))], wanted
    elif seen_hash is None and current is not None:
        raise ApprovalArgsChanged(approval.approval_id, on_table)
    if who.key_id is None or all(a.get("key_id") != who.key_id for a in approved):
        approved.append(_entry(who, on_table))
    return approved, current


def _entry(who: Approver, hashed: str) -> dict[str, Any]:
    return {"key_id": who.key_id, "by": who.by, "args_hash": hashed}


def args_diff(requested: Any, approved: Any) -> dict[str, Any]:
    """The top-level keys an approver added, removed or changed (for the approval card)."""
    if not isinstance(requested, dict) or not isinstance(approved, dict):
        return {"added": {}, "removed": {}, "changed": {}}
    return {
        "added": {k: v for k, v in approved.items() if k not in requested},
        "removed": {k: v for k, v in requested.items() if k not in approved},
        "changed": {
            k: {"from": v, "to": approved[k]}
            for k, v in requested.items()
            if k in approved and canonical_json(approved[k]) != canonical_json(v)
        },
    }
