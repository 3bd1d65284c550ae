"""Session owners through the MCP gateway: an agent key's `tools/call` in a session another
key created is refused (`forbidden`), with nothing recorded and nothing run upstream, on both
stores; the session's own key goes on in it."""

from __future__ import annotations

import secrets
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.mcp.conftest import Gateway, gateway_config, text_of
from tests.support.servers import ThreadServer
from undolog.config import KeyConfig, OrgConfig, Settings, hash_api_key
from undolog.mcp.config import parse_mcp_settings

pytestmark = [pytest.mark.slow, pytest.mark.security]


def _entity(name: str) -> dict[str, object]:
    return {"name": name, "entityType": "person", "observations": ["owners test"]}


@pytest.fixture
def agents(tmp_path: Path, gateway_store: str) -> Iterator[tuple[Gateway, Gateway]]:
    """One gateway, one org, two agent keys: A's view and B's view of it."""
    from undolog.proxy import create_app

    org_id = f"org-{secrets.token_hex(6)}"
    key_a, key_b = ("ul_test_" + secrets.token_urlsafe(18) for _ in range(2))
    keys = (
        KeyConfig(name="agent-a", role="agent", key_hash=hash_api_key(key_a)),
        KeyConfig(name="agent-b", role="agent", key_hash=hash_api_key(key_b)),
    )
    settings = Settings(
        database_url=gateway_store,
        upstream_timeout_seconds=20.0,
        lease_seconds=30.0,
        log_level="warning",
        orgs=(OrgConfig(org_id=org_id, keys=keys),),
        mcp=parse_mcp_settings(gateway_config(tmp_path / "memory.jsonl")),
    )
    server = ThreadServer(create_app(settings)).start()
    try:
        memory = tmp_path / "memory.jsonl"
        yield (
            Gateway(server.url, key_a, org_id, memory, server),
            Gateway(server.url, key_b, org_id, memory, server),
        )
    finally:
        server.stop()


@pytest.mark.parametrize("gateway_store", ["sqlite", "postgres"], indirect=True)
async def test_an_agent_cannot_call_tools_in_another_agents_session(
    agents: tuple[Gateway, Gateway],
) -> None:
    a, b = agents
    session = str(uuid.uuid4())
    async with a.client(session) as client:
        made = await client.call_tool("memory.create_entities", {"entities": [_entity("alice")]})
        assert not made.is_error, text_of(made)
    async with b.client(session) as client:
        replay = await client.call_tool("memory.create_entities", {"entities": [_entity("alice")]})
        write = await client.call_tool("memory.create_entities", {"entities": [_entity("mallory")]})
        delete = await client.call_tool("memory.delete_entities", {"entityNames": ["alice"]})
    for refused in (replay, write, delete):
        assert refused.is_error
        assert refused.meta is not None
        assert refused.meta["undolog"]["error"]["code"] == "forbidden", text_of(refused)
    assert a.entities() == ["alice"]
    with a.rest() as rest:
        view = rest.get(f"/sessions/{session}").json()
    assert len(view["effects"]) == 1
    async with a.client(session) as client:  # A goes on in its session
        more = await client.call_tool("memory.create_entities", {"entities": [_entity("bob")]})
        assert not more.is_error, text_of(more)
    assert sorted(a.entities()) == ["alice", "bob"]
