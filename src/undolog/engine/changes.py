"""Approve with changes: the arguments an approver edits, who approved, and the diff shown.

Pure values and functions used by `approvals.py` (the decision) and the front ends (the
diff). docs/approvals.md ("Approve with changes", "Several approvers") is the reference.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

from undolog.store.records import ApprovalRecord
from undolog_sdk.errors import Forbidden, InvalidRequest
from undolog_sdk.signature import canonical_json

__all__ = ["Approver", "Edit", "approvers_after", "args_diff", "check_edit"]


@dataclass(frozen=True, slots=True)
class Approver:
    """Who decides: the authenticated key's id and its recorded name (`key:NAME`)."""

    key_id: str | None
    by: str | None


@dataclass(frozen=True, slots=True)
class Edit:
    """Arguments an approver wants the call to run with, canonicalised."""

    args_json: str


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
    approval: ApprovalRecord, who: Approver, edit: Edit | None
) -> tuple[list[dict[str, Any]], str | None]:
    """Who has approved once `who` approves (distinct keys), and the arguments approved.

    Arguments that differ from the ones approved so far start the count again: every approver
    of the call approved the very arguments it runs with. An edit back to the requested
    arguments is no edit (None).

    Raises:
        Forbidden: the key that made a rule-required call approving it.
    """
    if (
        approval.rule is not None
        and who.key_id is not None
        and who.key_id == approval.requested_by_key_id
    ):
        raise Forbidden("the key that made the call cannot approve it")
    approved: list[dict[str, Any]] = orjson.loads(approval.approved_by_json)
    current = approval.approved_args_json
    if edit is not None:
        wanted = None if edit.args_json == approval.args_json else edit.args_json
        if wanted != current:
            return [{"key_id": who.key_id, "by": who.by}], wanted
    if who.key_id is None or all(a.get("key_id") != who.key_id for a in approved):
        approved.append({"key_id": who.key_id, "by": who.by})
    return approved, current


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
