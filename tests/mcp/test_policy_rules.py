"""Policy rules hold for MCP `tools/call` too: they are evaluated in the engine's intercept,
the one path of REST and MCP calls (docs/approvals.md)."""

from __future__ import annotations

import pytest

from tests.mcp.conftest import Gateway

pytestmark = pytest.mark.slow

RULES = [
    {"name": "temp-deletes", "tool": "memory.delete_entities",
     "condition": 'entityNames contains "temp"', "action": "approve"},
    {"name": "no-admins", "tool": "memory.create_entities",
     "condition": 'entities[0].name == "admin"', "action": "deny"},
]  # fmt: skip


def _entity(name: str) -> dict[str, object]:
    return {"name": name, "entityType": "person", "observations": ["seen by the rules test"]}


def _text(result) -> str:  # type: ignore[no-untyped-def]
    return "\n".join(c.text for c in result.content if getattr(c, "type", "") == "text")


@pytest.mark.parametrize("gateway_store", ["sqlite", "postgres"], indirect=True)
async def test_rules_approve_and_deny_mcp_calls(
    gateway: Gateway, era: str, session_id: str
) -> None:
    with gateway.rest() as rest:
        assert rest.put("/policy/rules", json={"rules": RULES}).status_code == 200
    async with gateway.client(session_id, era=era) as client:
        made = await client.call_tool("memory.create_entities", {"entities": [_entity("temp")]})
        assert not made.is_error, _text(made)
        # A destructive call the rule approves runs without a person.
        gone = await client.call_tool("memory.delete_entities", {"entityNames": ["temp"]})
        assert not gone.is_error, _text(gone)
        assert gateway.entities() == []
        denied = await client.call_tool("memory.create_entities", {"entities": [_entity("admin")]})
    assert denied.is_error
    assert "no-admins" in _text(denied)
    assert gateway.entities() == []
