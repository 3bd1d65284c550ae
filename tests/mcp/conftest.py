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
import subprocess
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
from mcp_types import CallToolResult, TextContent

from tests.proxy.conftest import role_keys
from tests.support.servers import ThreadServer
from undolog.config import OrgConfig, Settings
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
    with serve_gateway(gateway_config(tmp_path / "memory.jsonl"), gateway_store, tmp_path) as g:
        yield g


@pytest.fixture
def session_id() -> str:
    return str(uuid.uuid4())


@pytest.fixture(params=ERAS)
def era(request: pytest.FixtureRequest) -> str:
    return str(request.param)


# --- any [mcp] table, and mcp-server-git (PyPI) in front of a fresh repository ----------------


@contextlib.contextmanager
def serve_gateway(
    mcp: dict[str, Any],
    database_url: str,
    state_dir: Path,
    *,
    org_id: str | None = None,
    api_key: str | None = None,
) -> Iterator[Gateway]:
    """A proxy in a thread whose `[mcp]` table is `mcp`, with a fresh org and key (or these)."""
    from undolog.proxy import create_app

    org_id = org_id or f"org-{secrets.token_hex(6)}"
    key = api_key or "ul_test_" + secrets.token_urlsafe(18)
    settings = Settings(
        database_url=database_url,
        upstream_timeout_seconds=20.0,
        lease_seconds=30.0,
        log_level="warning",
        allow_self_approval=True,  # the one admin key makes and approves calls
        orgs=(OrgConfig(org_id=org_id, keys=role_keys(key)),),
        # A call that needs an approval answers "pending" at once unless a test asks for
        # the long wait (tests/mcp/test_gateway_waits.py).
        mcp=parse_mcp_settings({"approval_wait_seconds": 0, **mcp}),
    )
    server = ThreadServer(create_app(settings)).start()
    try:
        yield Gateway(server.url, key, org_id, state_dir / "memory.jsonl", server)
    finally:
        server.stop()


def git(repo: Path, *args: str) -> str:
    """Run git in `repo`: the tests' view of the repository's real state."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    done = subprocess.run(
        ["git", *args], cwd=repo, env=env, capture_output=True, text=True, timeout=30, check=True
    )
    return done.stdout


@pytest.fixture
def git_repo(tmp_path: Path) -> Path:
    """A fresh repository with one commit, its identity set locally."""
    repo = tmp_path / "repo"
    repo.mkdir()
    git(repo, "init", "--quiet", "--initial-branch=main")
    git(repo, "config", "user.name", "UndoLog Tests")
    git(repo, "config", "user.email", "tests@undolog.invalid")
    (repo / "README.md").write_text("first\n")
    git(repo, "add", "README.md")
    git(repo, "commit", "--quiet", "-m", "first commit")
    return repo


def git_server_command(repo: Path) -> tuple[str, list[str]]:
    return sys.executable, ["-m", "mcp_server_git", "--repository", str(repo)]


def git_gateway_config(repo: Path) -> dict[str, Any]:
    """mcp-server-git marks its reads `readOnlyHint` and its writes not; the config says more.

    git_add is undone by git_reset, a coarse undo: it unstages everything, not only what the
    call staged. git_commit waits for a person. git_create_branch, git_checkout and git_reset
    are not named: not read-only, so irreversible by their annotations.
    """
    command, args = git_server_command(repo)
    return {
        "upstreams": [
            {
                "name": "git",
                "transport": "stdio",
                "command": command,
                "args": args,
                "tools": {
                    "git_status": {"tier": "safe"},
                    "git_log": {"tier": "safe"},
                    "git_add": {
                        "tier": "compensable",
                        "compensation": {
                            "tool": "git_reset",
                            "args": {"repo_path": "$.original_args.repo_path"},
                            "max_retries": 1,
                            "retry_backoff_ms": 10,
                        },
                    },
                    "git_commit": {"tier": "irreversible"},
                },
            }
        ]
    }


@pytest.fixture
def git_gateway(tmp_path: Path, git_repo: Path) -> Iterator[Gateway]:
    with serve_gateway(
        git_gateway_config(git_repo), f"sqlite:///{tmp_path / 'undolog.db'}", tmp_path
    ) as gateway:
        yield gateway


def text_of(result: CallToolResult) -> str:
    """The text content of a tool result."""
    return "\n".join(c.text for c in result.content if isinstance(c, TextContent))
