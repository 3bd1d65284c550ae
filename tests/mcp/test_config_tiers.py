"""The MCP gateway's tiers come from its config: the API cannot lower them.

`git.git_create_branch` is not named in `git_gateway_config`: its annotations make it
irreversible. `PUT /tools/git.git_create_branch {"tier": "safe"}` used to make the next
`/mcp` call pass through; now it is refused, and even a registry row changed behind the
gateway's back does not open the gate: the gateway registers its own tier again.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.mcp.conftest import Gateway, git, git_gateway_config, serve_gateway
from undolog.engine import Engine
from undolog.store import open_store

pytestmark = [pytest.mark.slow, pytest.mark.security]


@pytest.fixture
def tiered_gateway(tmp_path: Path, git_repo: Path, gateway_store: str) -> Iterator[Gateway]:
    with serve_gateway(git_gateway_config(git_repo), gateway_store, tmp_path) as gateway:
        yield gateway


async def _pending(gateway: Gateway, repo: Path, branch: str) -> bool:
    args = {"repo_path": str(repo), "branch_name": branch}
    async with gateway.client(str(uuid.uuid4())) as client:
        result = await client.call_tool("git.git_create_branch", args)
    return bool(result.meta and result.meta["undolog"]["status"] == "pending_approval")


@pytest.mark.parametrize("gateway_store", ["sqlite", "postgres"], indirect=True)
async def test_the_api_cannot_lower_a_tier_the_gateway_config_sets(
    tiered_gateway: Gateway, git_repo: Path
) -> None:
    assert await _pending(tiered_gateway, git_repo, "first")  # registered by the gateway
    async with httpx.AsyncClient(
        base_url=tiered_gateway.url, headers={"X-Api-Key": tiered_gateway.api_key}
    ) as rest:
        for tier in ("safe", "compensable"):
            changed = await rest.put("/tools/git.git_create_branch", json={"tier": tier})
            assert changed.status_code == 403, changed.text
            assert changed.json()["code"] == "forbidden"
        named = await rest.put("/tools/git.git_status", json={"tier": "irreversible"})
        assert named.json()["code"] == "forbidden"
    assert await _pending(tiered_gateway, git_repo, "second")
    assert git(git_repo, "branch", "--list", "second") == ""


@pytest.mark.parametrize("gateway_store", ["sqlite", "postgres"], indirect=True)
async def test_a_registry_row_changed_behind_the_gateway_does_not_open_the_gate(
    tiered_gateway: Gateway, git_repo: Path, gateway_store: str
) -> None:
    assert await _pending(tiered_gateway, git_repo, "first")

    async def lower() -> None:
        store = await open_store(gateway_store)
        try:
            await Engine(store).register_tool(
                tiered_gateway.org_id, "git.git_create_branch", tier="safe"
            )
        finally:
            await store.close()

    await lower()
    # As once the proxy's registry cache (2 s) has expired: the next call reads the row.
    tiered_gateway.server.app.fastapi.state.runtime.engine._tools.clear()
    assert await _pending(tiered_gateway, git_repo, "second")
    assert git(git_repo, "branch", "--list", "second") == ""
