"""A tools/call while the store is down is told in UndoLog's words over MCP too (PostgreSQL).

PostgreSQL is cut off by a TCP forwarder between the proxy and it (tests/support/forwarder.py),
never by stopping the shared server. The REST side of the same rule is in
tests/proxy/test_store_down.py: the engine's own failure (`intercept_failed`) carries a fixed
message, and the driver's text ("unexpected connection_lost() call", addresses) goes to the
log only. The MCP gateway answers from the same outcome (`services/calls.told`).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from mcp import MCPError
from mcp_types import INTERNAL_ERROR

from tests.mcp.conftest import gateway_config, serve_gateway
from tests.proxy.test_ready import pg_forwarder
from tests.proxy.test_store_down import DATABASE_WORDS
from tests.support.forwarder import Forwarder

__all__ = ["pg_forwarder"]  # the fixture, used here

pytestmark = [pytest.mark.postgres, pytest.mark.slow]


def _entity(name: str) -> dict[str, object]:
    return {"name": name, "entityType": "person", "observations": ["test"]}


async def test_a_tools_call_while_the_store_is_down_names_no_database_text(
    pg_forwarder: tuple[Forwarder, str], tmp_path: Path, session_id: str
) -> None:
    forwarder, url = pg_forwarder
    with serve_gateway(gateway_config(tmp_path / "memory.jsonl"), url, tmp_path) as gateway:
        try:
            async with gateway.client(session_id) as client:
                first = await client.call_tool(
                    "memory.create_entities", {"entities": [_entity("before")]}
                )
                assert not first.is_error
                forwarder.cut()
                with pytest.raises(MCPError) as caught:
                    await client.call_tool(
                        "memory.create_entities", {"entities": [_entity("during")]}
                    )
        finally:
            forwarder.restore()  # so the store can close cleanly
        entities = gateway.entities()

    error = caught.value.error
    assert error.code == INTERNAL_ERROR
    assert error.message.startswith("UndoLog could not record the call:"), error.message
    assert not any(word in error.message.lower() for word in DATABASE_WORDS), error.message
    assert "during" not in entities  # no intent recorded: the tool did not run
    assert "before" in entities
