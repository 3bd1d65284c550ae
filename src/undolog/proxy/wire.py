"""What goes on the wire: JSON responses, the error body, records rendered as JSON."""

from __future__ import annotations

import datetime as dt
import json
import re
from collections.abc import Mapping
from typing import Any

import orjson
from starlette.responses import Response

from undolog.engine.changes import args_diff, args_hash, proposed_args
from undolog.logs import internal_error_message
from undolog.store.records import (
    ApprovalRecord,
    EffectRecord,
    SessionRecord,
    ToolRecord,
    UndoEntryRecord,
)
from undolog_sdk.errors import UndoLogError

__all__ = [
    "JSONDecodeError",
    "approval_json",
    "effect_json",
    "error_body",
    "error_response",
    "internal_error_message",
    "iso",
    "json_response",
    "loads_exact",
    "recent_call_json",
    "session_json",
    "tool_json",
    "undo_entry_json",
]

JSON_TYPE = "application/json"

# The shortest integer literal that can fall outside [-2**63, 2**64 - 1] has 19 digits.
_LONG_DIGIT_RUN = re.compile(rb"[0-9]{19}")


class JSONDecodeError(ValueError):
    """A request body that is not valid JSON."""


def _no_constants(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def loads_exact(body: bytes) -> Any:
    """Parse a request body, keeping integers exact.

    orjson silently turns an integer beyond 64 bits into a float, which would make an
    uncanonicalizable argument (an integer outside [-2^63, 2^64-1]) look valid.
    A body with a run of 19+ digits is therefore parsed again by the standard library,
    whose integers are exact, so canonicalisation can refuse them. The fast path stays orjson.

    Raises:
        JSONDecodeError: the body is not valid JSON.
    """
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise JSONDecodeError(str(exc)) from None
    if _LONG_DIGIT_RUN.search(body) is None:
        return data
    try:
        return json.loads(body, parse_constant=_no_constants)
    except ValueError as exc:
        raise JSONDecodeError(str(exc)) from None
    except RecursionError:  # orjson allows deeper nesting than the standard library
        raise JSONDecodeError("JSON nested too deeply") from None


def iso(us: int | None) -> str | None:
    """Microseconds since the epoch as an RFC 3339 UTC timestamp."""
    if us is None:
        return None
    moment = dt.datetime.fromtimestamp(us / 1_000_000, tz=dt.UTC)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def now_iso() -> str:
    return dt.datetime.now(tz=dt.UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def json_response(
    data: Any, status: int = 200, headers: Mapping[str, str] | None = None
) -> Response:
    return Response(orjson.dumps(data), status_code=status, media_type=JSON_TYPE, headers=headers)


def error_body(request_id: str, code: str, message: str, **extra: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "request_id": request_id,
        "code": code,
        "message": message,
        "timestamp": now_iso(),
    }
    body.update({k: v for k, v in extra.items() if v is not None})
    return body


def error_response(
    request_id: str, error: UndoLogError, *, code: str | None = None, status: int | None = None
) -> Response:
    """The reference's error body for an UndoLog error (code/status overridable)."""
    fields = error.fields()
    headers = None
    retry_after = fields.get("retry_after")
    if retry_after is not None:
        headers = {"Retry-After": str(retry_after)}
    return json_response(
        error_body(request_id, code or error.code, error.message, **fields),
        status or error.http_status,
        headers,
    )


def _loads(text: str | None) -> Any:
    return None if text is None else orjson.loads(text)


def tool_json(tool: ToolRecord) -> dict[str, Any]:
    return {
        "name": tool.name,
        "tier": tool.tier,
        "version": tool.version,
        "compensation": _loads(tool.compensation_json),
        "idempotent_upstream": tool.idempotent_upstream,
        "upstream": tool.upstream,
        "updated_at": iso(tool.updated_us),
    }


def effect_json(effect: EffectRecord, replay_count: int = 0) -> dict[str, Any]:
    return {
        "effect_id": effect.effect_id,
        "session_id": effect.session_id,
        "step_index": effect.step_index,
        "tool_name": effect.tool_name,
        "tool_version": effect.tool_version,
        "tier": effect.tier,
        "state": effect.state,
        "mode": effect.mode,
        "attempts": effect.attempts,
        "call_signature": effect.call_signature,
        "args": _loads(effect.args_json),
        "result": _loads(effect.result_json),
        "error": effect.error,
        "replay_count": replay_count,
        "created_at": iso(effect.created_us),
        "executed_at": iso(effect.executed_us),
        "finished_at": iso(effect.finished_us),
        "lease_expires_at": iso(effect.lease_expires_us),
    }


def undo_entry_json(entry: UndoEntryRecord) -> dict[str, Any]:
    return {
        "entry_id": entry.entry_id,
        "seq": entry.seq,
        "effect_id": entry.effect_id,
        "fn_name": entry.fn_name,
        "fn_version": entry.fn_version,
        "args": _loads(entry.args_json),
        "max_retries": entry.max_retries,
        "retry_backoff_ms": entry.retry_backoff_ms,
        "state": entry.state,
        "attempts": entry.attempts,
        "last_error": entry.last_error,
        "registered_at": iso(entry.registered_us),
    }


def approval_json(approval: ApprovalRecord) -> dict[str, Any]:
    return {
        "id": approval.approval_id,
        "org_id": approval.org_id,
        "session_id": approval.session_id,
        "effect_id": approval.effect_id,
        "tool_name": approval.tool_name,
        "args": _loads(approval.args_json),
        "status": approval.status,
        "created_at": iso(approval.created_us),
        "timeout_at": iso(approval.timeout_us),
        "decided_at": iso(approval.decided_us),
        "decided_by": approval.decided_by,
        "reason": approval.reason,
        # docs/approvals.md: the rule behind it, its approvers, and an approver's edit.
        "rule": approval.rule,
        "approvers_required": approval.approvers_required,
        "approvals": len(_loads(approval.approved_by_json) or []),  # so far ("1 of 2")
        "approved_by": [a.get("by") for a in _loads(approval.approved_by_json) or []],
        "approved_args": _loads(approval.approved_args_json),
        # What an approval approves (docs/approvals.md): the hash of the arguments the call
        # runs with if approved now (`approved_args`, else the requested ones), to send back
        # as the approve body's `args_hash`; and the hash of the requested ones.
        "args_hash": args_hash(proposed_args(approval)),
        "requested_args_hash": args_hash(approval.args_json),
        "args_diff": (
            args_diff(_loads(approval.args_json), _loads(approval.approved_args_json))
            if approval.approved_args_json is not None
            else None
        ),
    }


def recent_call_json(effect: EffectRecord) -> dict[str, Any]:
    """One of a session's latest calls, beside an approval: what it was and how it ended
    (no arguments nor result: the session's page has those)."""
    return {
        "effect_id": effect.effect_id,
        "step_index": effect.step_index,
        "tool_name": effect.tool_name,
        "tier": effect.tier,
        "state": effect.state,
        "created_at": iso(effect.created_us),
    }


def session_json(session: SessionRecord) -> dict[str, Any]:
    return {
        "session_id": session.session_id,
        "state": session.state,
        "last_step": session.last_step,
        "created_at": iso(session.created_us),
        "updated_at": iso(session.updated_us),
    }
