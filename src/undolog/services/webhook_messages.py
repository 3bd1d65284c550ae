"""What a webhook receives: the signed generic JSON body, or a Slack-compatible message.

Pure functions over an event row (and its approval, when it names one); the sender
(services/webhooks.py) does the I/O. The signature scheme and a receiver's check are in
docs/notifications.md.
"""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote

import orjson

from undolog.engine.changes import args_hash, proposed_args
from undolog.store.records import ApprovalRecord, EventRecord
from undolog_sdk.wire import EventType

__all__ = [
    "SIGNATURE_HEADER",
    "Message",
    "build_message",
    "sign",
]

SIGNATURE_HEADER = "X-UndoLog-Signature"
EVENT_ID_HEADER = "X-UndoLog-Event-Id"
EVENT_TYPE_HEADER = "X-UndoLog-Event"
MAX_ARGS_CHARS = 1000  # of a call's arguments in a Slack message (the JSON body has them all)

_TITLES = {
    EventType.APPROVAL_REQUIRED.value: "Approval required",
    EventType.APPROVAL_APPROVED.value: "Approved",
    EventType.APPROVAL_PARTIALLY_APPROVED.value: "Partly approved",
    EventType.APPROVAL_REJECTED.value: "Rejected",
    EventType.APPROVAL_TIMED_OUT.value: "Approval timed out",
    EventType.COMPENSATION_FAILED.value: "Compensation needs a person",
}


@dataclass(frozen=True)
class Message:
    """A body to POST and its headers (without the signature, which is made per attempt)."""

    body: bytes
    headers: dict[str, str]


def _iso(us: int | None) -> str | None:
    if us is None:
        return None
    return datetime.fromtimestamp(us / 1_000_000, UTC).isoformat().replace("+00:00", "Z")


def sign(secret: str, timestamp: int, body: bytes) -> str:
    """The `X-UndoLog-Signature` value: `t=<unix seconds>,v1=<hex HMAC-SHA256 of
    "<t>.<body>">`."""
    mac = hmac.new(secret.encode(), str(timestamp).encode() + b"." + body, hashlib.sha256)
    return f"t={timestamp},v1={mac.hexdigest()}"


def links(dashboard_url: str, event: EventRecord, approval_id: str | None) -> dict[str, str]:
    """Dashboard links: the approval (the approvals view; a person signs in, then approves or
    rejects there) and the session."""
    base = dashboard_url.rstrip("/") + "/ui/"
    found = {}
    if approval_id:
        found["approval"] = f"{base}#/approvals/pending/{quote(approval_id, safe='')}"
    if event.session_id:
        found["session"] = f"{base}#/sessions/{quote(event.session_id, safe='')}"
    return found


def _json_body(
    event: EventRecord, approval: ApprovalRecord | None, urls: dict[str, str]
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "id": f"evt_{event.event_id}",
        "type": event.type,
        "created_at": _iso(event.created_us),
        "org_id": event.org_id,
        "session_id": event.session_id,
        "effect_id": event.effect_id,
        "data": orjson.loads(event.payload_json),
        "links": urls,
    }
    if approval is not None:
        body["approval"] = {
            "approval_id": approval.approval_id,
            "status": approval.status,
            "tool_name": approval.tool_name,
            "args": orjson.loads(approval.args_json),
            # An approver's edit: the arguments the call runs with (docs/notifications.md).
            "approved_args": (
                orjson.loads(approval.approved_args_json) if approval.approved_args_json else None
            ),
            # What runs if approved now (the edit, else `args`) and its hash; the requested
            # arguments' hash (docs/approvals.md, "What an approval approves").
            "runs_with": orjson.loads(proposed_args(approval)),
            "args_hash": args_hash(proposed_args(approval)),
            "requested_args_hash": args_hash(approval.args_json),
            "created_at": _iso(approval.created_us),
            "timeout_at": _iso(approval.timeout_us),
            "decided_at": _iso(approval.decided_us),
            "decided_by": approval.decided_by,
            "reason": approval.reason,
            # Several approvers (a `require` rule): how many so far, of how many, and who.
            "approvals": len(_approvers(approval)),
            "approvers_required": approval.approvers_required,
            "approved_by": _approvers(approval),
        }
    return body


def _approvers(approval: ApprovalRecord) -> list[str]:
    return [str(a.get("by")) for a in orjson.loads(approval.approved_by_json or "[]")]


def _escape(text: str) -> str:
    """Slack mrkdwn's three control characters (the text may come from an agent)."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


# Inside a code span Slack has no escape for a backtick: one would end the span (and "```"
# open a block), letting an agent's text format or link the rest of the message. It is shown
# as U+02CB MODIFIER LETTER GRAVE ACCENT, which looks alike and ends nothing; line breaks
# (which also end a span) as spaces.
_CODE_SAFE = str.maketrans({"`": "\u02cb", "\n": " ", "\r": " "})


def _code(text: str, limit: int = MAX_ARGS_CHARS) -> str:
    """`text` as one Slack code span that nothing in it can end, cut at `limit` characters."""
    if len(text) > limit:
        text = text[:limit] + "…"
    return f"`{_escape(text.translate(_CODE_SAFE))}`"


def _button(text: str, url: str, style: str | None = None) -> dict[str, Any]:
    button: dict[str, Any] = {
        "type": "button",
        "text": {"type": "plain_text", "text": text},
        "url": url,
    }
    if style:
        button["style"] = style
    return button


def _slack_body(
    event: EventRecord, approval: ApprovalRecord | None, urls: dict[str, str]
) -> dict[str, Any]:
    data = orjson.loads(event.payload_json)
    title = _TITLES.get(event.type, event.type)
    tool = approval.tool_name if approval else str(data.get("fn_name") or data.get("tool_name"))
    text = _escape(f"UndoLog: {title}: {tool} (org {event.org_id})")
    lines = [f"*{_escape(title)}*: {_code(tool)}", f"org {_code(event.org_id)}"]
    if event.session_id:
        lines.append(f"session {_code(event.session_id)}")
    if approval is not None:
        if approval.approved_args_json is None:
            lines.append(f"args: {_code(approval.args_json)}")
        else:  # an approver's edit: what runs, and what the agent asked for
            runs = _code(approval.approved_args_json)
            lines.append(f"runs with (changed by an approver): {runs}")
            lines.append(f"asked for: {_code(approval.args_json)}")
        if approval.decided_by:
            lines.append(f"decided by {_escape(approval.decided_by)}")
        if event.type == EventType.APPROVAL_PARTIALLY_APPROVED.value:
            so_far = _approvers(approval)
            lines.append(f"approvals: {len(so_far)} of {approval.approvers_required} "
                         f"({_escape(', '.join(so_far))})")  # fmt: skip
        if event.type == EventType.APPROVAL_REQUIRED.value:
            lines.append(f"times out at {_iso(approval.timeout_us)}")
    if event.type == EventType.COMPENSATION_FAILED.value and data.get("error"):
        lines.append(f"error: {_code(str(data['error']))}")
    blocks: list[dict[str, Any]] = [
        {"type": "section", "text": {"type": "mrkdwn", "text": "\n".join(lines)}}
    ]
    buttons = []
    if event.type == EventType.APPROVAL_REQUIRED.value and "approval" in urls:
        buttons += [
            _button("Approve", urls["approval"], "primary"),
            _button("Reject", urls["approval"], "danger"),
        ]
    elif "session" in urls:
        buttons.append(_button("Open in UndoLog", urls["session"]))
    if buttons:
        blocks.append({"type": "actions", "elements": buttons})
    return {"text": text, "blocks": blocks}


def build_message(
    kind: str, event: EventRecord, approval: ApprovalRecord | None, dashboard_url: str
) -> Message:
    """The body of one event for a webhook of `kind` (`json` or `slack`), and its headers."""
    urls = links(dashboard_url, event, approval.approval_id if approval else None)
    content = (
        _slack_body(event, approval, urls) if kind == "slack" else _json_body(event, approval, urls)
    )
    headers = {
        "Content-Type": "application/json",
        "User-Agent": "UndoLog-Webhooks/1",
        EVENT_ID_HEADER: f"evt_{event.event_id}",
        EVENT_TYPE_HEADER: event.type,
    }
    return Message(orjson.dumps(content), headers)
