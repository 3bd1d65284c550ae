"""A real proxy with the MCP gateway in front of real MCP servers from PyPI and npm.

The upstreams: `mcp-server-time` (PyPI, a dev dependency) over stdio, and
`@modelcontextprotocol/server-memory` (npm, installed into `.mcp-servers/` by `.ci/run`) over
stdio with its graph in a temporary file. Clients are the official `mcp` package's `Client`
over Streamable HTTP, in either protocol era.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import sys
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from tests.support.servers import ThreadServer
from undolog.config import OrgConfig, Settings, hash_api_key
from undolog.mcp.config import parse_mcp_settings

ROOT = Path(__file__).resolve().parents[2]
MEMORY_SERVER = ROOT / ".mcp-servers" / "node_modules" / ".bin" / "mcp-server-memory"
ERAS = ["legacy", "2026-07-28"]  # the handshake era (2025-11-25) and the stateless one


def memory_server_command() -> str:
    if MEMORY_SERVER.exists() and shutil.which("node"):
        return str(MEMORY_SERVER)
    message = (
        "npm's @modelcontextprotocol/server-memory is not in .mcp-servers/ (.ci/run installs it)"
    )
    if os.environ.get("CI"):
        pytest.fail(message)
    pytest.skip(message)


@dataclass
class Gateway:
    url: str
    api_key: str
    org_id: str
    memory_file: Path
    server: ThreadServer

    @contextlib.asynccontextmanager
    async def client(
        self,
        session_id: str | None = None,
        *,
        era: str = "legacy",
        elicitation_callback: Any = None,
        **headers: str,
    ) -> AsyncIterator[Client]:
        """An unmodified MCP client; the only UndoLog parts are one URL and two headers."""
        sent = {"X-Api-Key": self.api_key, **headers}
        if session_id is not None:
            sent["X-UndoLog-Session-Id"] = session_id
        async with httpx2.AsyncClient(headers=sent, timeout=30) as http:
            transport = streamable_http_client(f"{self.url}/mcp", http_client=http)
            client_ = Client(transport, mode=era, elicitation_callback=elicitation_callback)
            async with client_ as client:
                yield client

    def rest(self) -> httpx.Client:
        return httpx.Client(base_url=self.url, headers={"X-Api-Key": self.api_key}, timeout=30)

    def entities(self) -> list[str]:
        """The memory server's entity names, read from its file (its real state)."""
        if not self.memory_file.exists():
            return []
        names = []
        for line in self.memory_file.read_text().splitlines():
            if line.strip():
                item = json.loads(line)
                if item.get("type") == "entity":
                    names.append(item["name"])
        return names


def gateway_config(memory_file: Path) -> dict[str, Any]:
    return {
        "upstreams": [
            {
                "name": "time",
                "transport": "stdio",
                "command": sys.executable,
                "args": ["-m", "mcp_server_time", "--local-timezone", "UTC"],
            },
            {
                "name": "memory",
                "transport": "stdio",
                "command": memory_server_command(),
                "env": {"MEMORY_FILE_PATH": str(memory_file)},
                "tools": {
                    "create_entities": {
                        "tier": "compensable",
                        "compensation": {
                            "tool": "delete_entities",
                            "args": {"entityNames": "$.original_args.entities[*].name"},
                            "max_retries": 1,
                            "retry_backoff_ms": 10,
                        },
                    },
                    "read_graph": {"tier": "safe"},
                },
            },
        ]
    }


@pytest.fixture
def gateway_store(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """SQLite unless a test asks for `postgres` (`indirect` parametrisation)."""
    if getattr(request, "param", "sqlite") == "postgres":
        return str(request.getfixturevalue("pg_url"))
    return f"sqlite:///{tmp_path / 'undolog.db'}"


@pytest.fixture
def gateway(tmp_path: Path, gateway_store: str) -> Iterator[Gateway]:
    from undolog.proxy import create_app

    org_id, key = f"org-{secrets.token_hex(6)}", "ul_test_" + secrets.token_urlsafe(18)
    memory_file = tmp_path / "memory.jsonl"
    settings = Settings(
        database_url=gateway_store,
        upstream_timeout_seconds=20.0,
        lease_seconds=30.0,
        log_level="warning",
        orgs=(OrgConfig(org_id=org_id, api_key_hashes=(hash_api_key(key),)),),
        mcp=parse_mcp_settings(gateway_config(memory_file)),
    )
    server = ThreadServer(create_app(settings)).start()
    try:
        yield Gateway(server.url, key, org_id, memory_file, server)
    finally:
        server.stop()


@pytest.fixture
def session_id() -> str:
    return str(uuid.uuid4())


@pytest.fixture(params=ERAS)
def era(request: pytest.FixtureRequest) -> str:
    return str(request.param)
