"""`undolog serve --config FILE`, run for real, takes its MCP upstreams from the file's [mcp]."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from tests.mcp.conftest import text_of
from tests.support.servers import ProcessServer, free_port, undolog_command
from undolog.config import hash_api_key
from undolog_sdk.errors import AuthFailed

pytestmark = pytest.mark.slow

API_KEY = "ul_test_" + uuid.uuid4().hex


def _clean_env() -> dict[str, str]:
    """This process's environment without UNDOLOG_* settings that could override the file."""
    return {k: v for k, v in os.environ.items() if not k.startswith("UNDOLOG_")}


def _config(tmp_path: Path, mcp: str) -> Path:
    """A config file with a SQLite store, one org (its key hashed) and the given [mcp] part."""
    # A JSON string is a TOML basic string, escapes included.
    path = tmp_path / "undolog.toml"
    path.write_text(
        f"""
[server]
database_url = {json.dumps(f"sqlite:///{tmp_path / 'undolog.db'}")}

[[orgs]]
id = "acme"
[[orgs.keys]]
name = "ops"
role = "admin"
sha256 = "{hash_api_key(API_KEY)}"
{mcp}""",
        encoding="utf-8",
    )
    return path


_TIME_UPSTREAM = f"""
[[mcp.upstreams]]
name = "time"
transport = "stdio"
command = {json.dumps(sys.executable)}
args = ["-m", "mcp_server_time", "--local-timezone", "UTC"]
"""


@pytest.fixture
def serve(tmp_path: Path) -> Iterator[ProcessServer]:
    port = free_port()
    command = undolog_command("serve", "--config", str(_config(tmp_path, _TIME_UPSTREAM)))
    server = ProcessServer(
        [*command, "--port", str(port), "--log-level", "warning"],
        env=_clean_env(),
        port=port,
        log_path=str(tmp_path / "serve.log"),
    ).start()
    try:
        yield server
    finally:
        server.stop()


async def test_serve_puts_the_config_files_mcp_upstreams_behind_mcp(serve: ProcessServer) -> None:
    headers = {"X-Api-Key": API_KEY, "X-UndoLog-Session-Id": str(uuid.uuid4())}
    async with (
        httpx2.AsyncClient(headers=headers, timeout=30) as http,
        Client(streamable_http_client(f"{serve.url}/mcp", http_client=http)) as client,
    ):
        tools = {t.name for t in (await client.list_tools()).tools}
        result = await client.call_tool("time.get_current_time", {"timezone": "UTC"})
    assert "time.get_current_time" in tools
    assert not result.is_error, text_of(result)
    assert json.loads(text_of(result))["timezone"] == "UTC"
    assert result.meta is not None and result.meta["undolog"]["status"] == "passed_through"
    # The org and its key came from the same file: any other key is refused.
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}
    accept = {"Accept": "application/json, text/event-stream"}
    async with httpx.AsyncClient(timeout=30) as other:
        wrong = await other.post(
            f"{serve.url}/mcp", json=body, headers={**accept, "X-Api-Key": "ul_wrong"}
        )
    # Said as an MCP client shows it (a JSON-RPC error), with the spec's 401 challenge.
    assert wrong.status_code == 401 and "www-authenticate" in wrong.headers
    assert wrong.json()["error"]["data"]["code"] == AuthFailed.code


@pytest.mark.parametrize(
    ("mcp", "named"),
    [
        (
            _TIME_UPSTREAM + "[mcp.upstreams.tools.get_current_time]\ntier = 'sometimes'\n",
            "mcp.upstreams[0].tools.get_current_time.tier",
        ),
        (
            _TIME_UPSTREAM + "[mcp.upstreams.tools.convert_time]\ntier = 'compensable'\n",
            "mcp.upstreams[0].tools.convert_time: a compensable tool needs a compensation",
        ),
        ("[[mcp.upstreams]]\nname = 'time'\ntransport = 'stdio'\n", "needs a command"),
        (_TIME_UPSTREAM.replace('name = "time"', 'name = "t.ime"'), "mcp.upstreams[0].name"),
        ("[mcp]\nupstream = []\n", "mcp: unknown keys ['upstream']"),
        (
            "[[orgs]]\nid = 'globex'\n" + _TIME_UPSTREAM,
            "mcp.upstreams[0] ('time') names no orgs, and the config declares 2 orgs",
        ),
    ],
    ids=[
        "unknown tier",
        "compensable without compensation",
        "stdio without command",
        "dotted name",
        "misspelt key",
        "no orgs with two orgs",
    ],
)
def test_serve_with_a_bad_mcp_table_exits_naming_the_problem_and_changes_nothing(
    tmp_path: Path, mcp: str, named: str
) -> None:
    config = _config(tmp_path, mcp)
    database_url = f"sqlite:///{tmp_path / 'undolog.db'}"
    migrated = subprocess.run(
        undolog_command("migrate", "--database-url", database_url),
        env=_clean_env(),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert migrated.returncode == 0, migrated.stderr
    before = (config.read_bytes(), _digest(tmp_path / "undolog.db"))

    result = subprocess.run(
        undolog_command("serve", "--config", str(config), "--port", str(free_port())),
        env=_clean_env(),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode != 0
    assert result.stderr.startswith(f"error: config file {config}: ")
    assert named in result.stderr
    assert "Traceback" not in result.stderr
    assert (config.read_bytes(), _digest(tmp_path / "undolog.db")) == before


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()
