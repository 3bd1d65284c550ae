"""What a webhook says about an approval (docs/notifications.md): the arguments that will run
and the ones asked for, and Slack text that an agent's arguments cannot break out of.

Before: the Slack "partly approved" and "approved" messages showed the requested arguments,
not the ones an approver's edit made run, and a backtick in the arguments ended the code span.
"""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from undolog.engine.changes import args_hash
from undolog.services.webhook_messages import build_message
from undolog.store.records import ApprovalRecord, EventRecord
from undolog_sdk.signature import canonical_json

ASKED = {"db_name": "scratch"}
EDITED = {"db_name": "prod-copy"}


def approval(**fields: Any) -> ApprovalRecord:
    base: dict[str, Any] = {
        "approval_id": "ap-1", "org_id": "acme", "effect_id": "ef-1", "session_id": "se-1",
        "tool_name": "delete_database", "args_json": canonical_json(ASKED), "status": "pending",
        "created_us": 1_000_000, "timeout_us": 2_000_000, "decided_us": None,
        "decided_by": None, "reason": None, "approvers_required": 2,
        "approved_by_json": '[{"key_id": "k1", "by": "key:ana"}]',
        "approved_args_json": canonical_json(EDITED),
    }  # fmt: skip
    base.update(fields)
    return ApprovalRecord(**base)


def event(type_: str, **payload: Any) -> EventRecord:
    return EventRecord(7, "acme", type_, "se-1", "ef-1", orjson.dumps(payload).decode(), 1)


def slack_text(record: ApprovalRecord, type_: str) -> str:
    body = orjson.loads(build_message("slack", event(type_), record, "https://ul.example").body)
    text: str = body["blocks"][0]["text"]["text"]
    return text


@pytest.mark.parametrize("type_", ["approval_partially_approved", "approval_approved"])
def test_slack_shows_the_edited_args_that_run_and_the_ones_asked_for(type_: str) -> None:
    text = slack_text(approval(), type_)
    assert 'runs with (changed by an approver): `{"db_name":"prod-copy"}`' in text
    assert 'asked for: `{"db_name":"scratch"}`' in text


def test_slack_shows_the_args_once_when_nobody_changed_them() -> None:
    text = slack_text(approval(approved_args_json=None), "approval_required")
    assert 'args: `{"db_name":"scratch"}`' in text
    assert "runs with" not in text


def test_the_json_body_shows_what_runs_and_what_was_asked_with_their_hashes() -> None:
    message = build_message("json", event("approval_partially_approved"), approval(), "https://x")
    body = orjson.loads(message.body)["approval"]
    assert (body["args"], body["approved_args"], body["runs_with"]) == (ASKED, EDITED, EDITED)
    assert body["args_hash"] == args_hash(canonical_json(EDITED))
    assert body["requested_args_hash"] == args_hash(canonical_json(ASKED))


@pytest.mark.security
@pytest.mark.parametrize(
    "evil",
    ["x` *bold* <https://evil.example|click> `y", "```\nblock\n```", "a\nb`", "<!channel> & co"],
)
def test_an_agents_args_cannot_break_out_of_the_slack_code_span(evil: str) -> None:
    record = approval(args_json=canonical_json({"db_name": evil}), approved_args_json=None)
    text = slack_text(record, "approval_required")
    [line] = [line for line in text.split("\n") if line.startswith("args: ")]
    span = line.removeprefix("args: ")
    # One span: a backtick at each end and none inside; no raw Slack control characters.
    assert span.startswith("`") and span.endswith("`") and span.count("`") == 2
    assert "<" not in span and ">" not in span
    assert "&" not in span.replace("&amp;", "").replace("&lt;", "").replace("&gt;", "")
    assert "\u02cb" in span or "`" not in evil


@pytest.mark.security
def test_the_slack_fallback_text_escapes_slacks_control_characters() -> None:
    record = approval(tool_name="drop<!here>", approved_args_json=None)
    body = orjson.loads(
        build_message("slack", event("approval_required"), record, "https://x").body
    )
    assert "<" not in body["text"] and "&lt;!here&gt;" in body["text"]
