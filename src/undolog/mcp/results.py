"""What the MCP gateway answers to a `tools/call`: `CallToolResult`s built from the engine's
records and refusals, with UndoLog's part (effect, step, approval, error) under
`_meta["undolog"]`.
"""

from __future__ import annotations

from typing import Any

import orjson
from mcp_types import CallToolResult, TextContent

from undolog.engine import Decision
from undolog_sdk.errors import UndoLogError
from undolog_sdk.wire import CallStatus

__all__ = [
    "META_KEY",
    "approval_text",
    "awaiting",
    "awaiting_text",
    "effect_meta",
    "recorded_result",
    "refusal",
    "text_result",
    "with_meta",
]

META_KEY = "undolog"  # the key of `_meta` on our results: effect, step, approval, error


def text_result(text: str, meta: dict[str, Any], *, is_error: bool) -> CallToolResult:
    return CallToolResult(
        content=[TextContent(type="text", text=text)],
        is_error=is_error,
        _meta={META_KEY: meta},
    )


def recorded_result(result_json: str | None) -> CallToolResult:
    """A recorded ToolResult (`{"success", "output", "error"}`) as the MCP result it was."""
    recorded = orjson.loads(result_json) if result_json else None
    output = recorded.get("output") if isinstance(recorded, dict) else None
    if isinstance(output, dict) and "content" in output:
        return CallToolResult.model_validate(output)
    # Recorded by someone else (an operator resolving an in-doubt call): show it as text.
    ok = bool(recorded.get("success", True)) if isinstance(recorded, dict) else True
    return CallToolResult(
        content=[TextContent(type="text", text=orjson.dumps(recorded).decode())],
        is_error=not ok,
    )


def refusal(exc: UndoLogError) -> CallToolResult:
    """The call did not give a result: refused by UndoLog, or the upstream was not reached."""
    return text_result(
        f"{exc.message} (UndoLog: {exc.code})",
        {"error": {"code": exc.code, "message": exc.message, **exc.fields()}},
        is_error=True,
    )


def approval_text(tool_name: str, approval_id: str | None) -> str:
    """What a call that waits for a person says first, whichever way it is answered."""
    return (
        f"'{tool_name}' cannot be undone, so it waits for a person to approve it "
        f"(approval {approval_id}; POST /approvals/{approval_id}/approve or "
        f"`undolog approvals approve {approval_id}`). It has not run."
    )


def awaiting_text(decision: Decision, retry_after: int) -> str:
    return (
        approval_text(decision.tool.name, decision.approval_id)
        + " Once it is approved, call the tool again with the same arguments in the same "
        f"session: that call returns its result. Retry after {retry_after}s or later."
    )


def awaiting(decision: Decision, retry_after: int) -> CallToolResult:
    approval_id = decision.approval_id
    text = awaiting_text(decision, retry_after)
    meta = {
        "status": CallStatus.PENDING_APPROVAL,
        "approval_id": approval_id,
        "effect_id": decision.effect_id,
        "step_index": decision.step_index,
        "retry_after": retry_after,
    }
    return text_result(text, meta, is_error=True)


def with_meta(result: CallToolResult, decision: Decision, status: str) -> CallToolResult:
    return effect_meta(result, decision.effect_id, decision.step_index, status)


def effect_meta(
    result: CallToolResult, effect_id: str, step_index: int | None, status: str
) -> CallToolResult:
    """`result` with UndoLog's part: how the call ended, and its effect."""
    meta = dict(result.meta or {})
    meta[META_KEY] = {"status": status, "effect_id": effect_id, "step_index": step_index}
    return result.model_copy(update={"meta": meta})
