"""The demo tools as registry entries: tiers and compensations for the demo org."""

from __future__ import annotations

import dataclasses
from typing import Any

from undolog.mcp.config import McpSettings, ToolServerTool
from undolog_sdk.tier import ToolTier

__all__ = ["DEMO_MCP_TOOLS", "DEMO_TOOLS", "EXAMPLE_TOOLS", "with_demo_mcp_tools"]

_SAFE = ToolTier.SAFE.value
_COMPENSABLE = ToolTier.COMPENSABLE.value
_IRREVERSIBLE = ToolTier.IRREVERSIBLE.value


def _undo(fn_name: str) -> dict[str, Any]:
    # The demo compensations honour the Idempotency-Key: a lost run may run again.
    return {"fn_name": fn_name, "max_retries": 3, "retry_backoff_ms": 200, "idempotent": True}


DEMO_TOOLS: dict[str, dict[str, Any]] = {
    "search_web": {"tier": _SAFE},
    "send_email": {"tier": _COMPENSABLE, "compensation": _undo("undo_send_email")},
    "transfer_funds": {"tier": _COMPENSABLE, "compensation": _undo("reverse_transfer")},
    "create_record": {"tier": _COMPENSABLE, "compensation": _undo("delete_record")},
    "delete_database": {"tier": _IRREVERSIBLE},
    "publish_to_production": {"tier": _IRREVERSIBLE},
    "echo": {"tier": _COMPENSABLE, "compensation": _undo("echo")},
    "flaky": {"tier": _COMPENSABLE, "compensation": _undo("echo")},
    "slow": {"tier": _COMPENSABLE, "compensation": _undo("echo")},
    "broken": {"tier": _COMPENSABLE, "compensation": _undo("echo")},
    "fail": {"tier": _COMPENSABLE, "compensation": _undo("echo")},
}


def _example_undo(fn_name: str) -> dict[str, Any]:
    return {"fn_name": fn_name, "fn_version": "1.0.0", "args": {}, "max_retries": 3,
            "retry_backoff_ms": 100}  # fmt: skip


# The SDK tools of `examples/agent.py` and `examples/rollback.py`, as their decorators declare
# them (`charge_card` as agent.py's): `serve --demo` registers them, since the demo's agent key
# may not (only admin keys register tools).
EXAMPLE_TOOLS: dict[str, dict[str, Any]] = {
    "search_customers": {"tier": _SAFE},
    "charge_card": {
        "tier": _COMPENSABLE,
        "compensation": {
            "fn_name": "refund_charge",
            "fn_version": "1.0.0",
            "args": {"reason": "session rolled back"},
            "max_retries": 3,
            "retry_backoff_ms": 1000,
        },
    },
    "delete_customer_data": {"tier": _IRREVERSIBLE},
    "reserve_seat": {"tier": _COMPENSABLE, "compensation": _example_undo("release_seat")},
    "issue_ticket": {"tier": _COMPENSABLE, "compensation": _example_undo("void_ticket")},
}


def _schema(required: list[str], **properties: dict[str, Any]) -> dict[str, Any]:
    return {"type": "object", "properties": properties, "required": required}


_TEXT: dict[str, Any] = {"type": "string"}

# The demo tools `serve --demo` publishes at `/mcp` (docs/mcp.md, "The demo at /mcp"): the
# six a person tries from an MCP client, one or two of each tier (the registry says which).
DEMO_MCP_TOOLS: dict[str, tuple[str, dict[str, Any]]] = {
    "search_web": ("Search the web (a deterministic demo).", _schema(["query"], query=_TEXT)),
    "send_email": (
        "Send an e-mail. UndoLog can undo it (undo_send_email).",
        _schema(["to", "subject"], to=_TEXT, subject=_TEXT, body=_TEXT),
    ),
    "transfer_funds": (
        "Move money between two accounts. UndoLog can undo it (reverse_transfer).",
        _schema(
            ["from_account", "to_account", "amount"],
            from_account=_TEXT,
            to_account=_TEXT,
            amount={"type": "number"},
        ),
    ),
    "create_record": (
        "Create a record in a table. UndoLog can undo it (delete_record).",
        _schema(["table"], table=_TEXT, data={"type": "object"}),
    ),
    "delete_database": (
        "Delete a database. Cannot be undone: waits for a person's approval.",
        _schema(["db_name"], db_name=_TEXT),
    ),
    "publish_to_production": (
        "Publish an artifact to production. Cannot be undone: waits for a person's approval.",
        _schema(["artifact"], artifact=_TEXT),
    ),
}


def with_demo_mcp_tools(mcp: McpSettings, org_id: str) -> McpSettings:
    """`mcp` with the demo tools published at `/mcp` for `org_id` (what `serve --demo` does)."""
    published = tuple(
        ToolServerTool(name, description, schema, (org_id,))
        for name, (description, schema) in DEMO_MCP_TOOLS.items()
    )
    return dataclasses.replace(mcp, tool_server_tools=mcp.tool_server_tools + published)
