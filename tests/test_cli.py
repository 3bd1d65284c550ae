"""The `undolog` command, run for real as a child process (`python -m undolog ...`)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.support.servers import ProcessServer, free_port, undolog_command, wait_until
from undolog.config import hash_api_key


def clean_env() -> dict[str, str]:
    """This process's environment without UNDOLOG_* settings that could leak into a run."""
    return {k: v for k, v in os.environ.items() if not k.startswith("UNDOLOG_")}


def run(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        undolog_command(*args),
        env=clean_env(),
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.fixture
def servers() -> Iterator[list[ProcessServer]]:
    """Child servers started by a test, stopped (SIGTERM, then kill -9) at its end."""
    started: list[ProcessServer] = []
    yield started
    for server in reversed(started):
        server.stop()


def start(servers: list[ProcessServer], server: ProcessServer) -> ProcessServer:
    servers.append(server)
    return server.start()


def tool_call(url: str, api_key: str, tool: str, args: dict[str, object]) -> httpx.Response:
    body = {"session_id": str(uuid.uuid4()), "tool_name": tool, "step_index": 1, "args": args}
    return httpx.post(f"{url}/mcp/tool_call", json=body, headers={"X-Api-Key": api_key}, timeout=30)


# --- migrate -----------------------------------------------------------------------------


def test_migrate_creates_a_sqlite_schema_and_is_idempotent(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'undolog.db'}"
    first = run("migrate", "--database-url", url)
    second = run("migrate", "--database-url", url)
    assert first.returncode == 0, first.stderr
    assert re.fullmatch(r"schema at version \d+ \(sqlite\)\n", first.stdout)
    assert second.returncode == 0, second.stderr
    assert second.stdout == first.stdout
    assert (tmp_path / "undolog.db").exists()


def test_migrate_reads_the_database_url_from_env(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'env.db'}"
    result = subprocess.run(
        undolog_command("migrate"),
        env={**clean_env(), "UNDOLOG_DATABASE_URL": url},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "env.db").exists()


def test_migrate_on_postgres_reports_the_version(pg_url: str) -> None:
    result = run("migrate", "--database-url", pg_url)
    assert result.returncode == 0, result.stderr
    assert re.fullmatch(r"schema at version \d+ \(postgresql\)\n", result.stdout)


def test_migrate_with_an_unsupported_url_fails_with_a_message(tmp_path: Path) -> None:
    result = run("migrate", "--database-url", "mysql://root@localhost/x")
    assert result.returncode != 0
    assert "unsupported database URL" in result.stderr
    assert "Traceback" not in result.stderr


# --- serve -------------------------------------------------------------------------------


def _serve_demo(
    tmp_path: Path, servers: list[ProcessServer], database_url: str, run: int = 0
) -> tuple[ProcessServer, int, str, str, Path]:
    """`serve --demo` as a child process: (server, tools port, agent key, approver key, log)."""
    port, tools_port = free_port(), free_port()
    log = tmp_path / f"serve-{run}.log"
    args = undolog_command(
        "serve",
        "--demo",
        "--port",
        str(port),
        "--database-url",
        database_url,
        "--demo-tools-port",
        str(tools_port),
        "--log-level",
        "warning",
    )
    server = start(servers, ProcessServer(args, clean_env(), port, log_path=str(log)))
    output = log.read_text(encoding="utf-8")
    agent = re.search(r"agent key:\s+(\S+)", output)
    approver = re.search(r"approver key:\s+(\S+)", output)
    assert agent and approver, output
    # The banner says how to point the SDK and the CLI at this server, with the agent key.
    assert f"export UNDOLOG_API_KEY={agent.group(1)}\n" in output
    assert f"export UNDOLOG_PROXY_URL=http://127.0.0.1:{port}\n" in output
    return server, tools_port, agent.group(1), approver.group(1), log


def test_serve_demo_prints_an_agent_key_that_works_end_to_end(
    tmp_path: Path, servers: list[ProcessServer]
) -> None:
    server, tools_port, api_key, _, log = _serve_demo(
        tmp_path, servers, f"sqlite:///{tmp_path / 'x.db'}"
    )

    response = tool_call(server.url, api_key, "send_email", {"to": "a@b.c", "subject": "hi"})
    assert response.status_code == 200, response.text
    assert response.json()["status"] == "executed"
    assert response.json()["result"]["success"] is True
    counters = httpx.get(f"http://127.0.0.1:{tools_port}/counters/send_email", timeout=10)
    assert counters.json() == {response.json()["effect_id"]: 1}
    # The demo tools verify what the proxy signs: an unsigned call is refused.
    unsigned = httpx.post(f"http://127.0.0.1:{tools_port}/tools/echo", json={"args": {}})
    assert unsigned.status_code == 401
    assert tool_call(server.url, "ul_wrong", "send_email", {}).status_code == 403

    server.stop()
    assert server.proc is not None
    # uvicorn shuts down gracefully on SIGTERM, then re-raises the signal it caught.
    assert server.proc.returncode in (0, -signal.SIGTERM), log.read_text(encoding="utf-8")


def test_serve_with_a_config_file_serves_its_orgs_and_tools(
    tmp_path: Path, servers: list[ProcessServer]
) -> None:
    tools_port = free_port()
    tools_command = undolog_command("demo-tools", "--port", str(tools_port), "--inspect")
    secret = {"UNDOLOG_DEMO_TOOLS_SECRET": "shared-" + uuid.uuid4().hex}
    tools = start(servers, ProcessServer(tools_command, {**clean_env(), **secret}, tools_port))
    api_key = "ul_cli_" + uuid.uuid4().hex
    config = tmp_path / "undolog.toml"
    config.write_text(
        f"""
[server]
database_url = "sqlite:///{tmp_path / "c.db"}"

[[upstreams]]
name = "tools"
url = "{tools.url}"
secret_env = "TOOLS_SECRET"
orgs = ["acme"]

[[orgs]]
id = "acme"
[[orgs.keys]]
name = "ops"
role = "admin"
sha256 = "{hash_api_key(api_key)}"

[[tools]]
org = "acme"
name = "echo"
tier = "compensable"
compensation = {{ fn_name = "echo" }}
upstream = "tools"
""",
        encoding="utf-8",
    )
    proxy_port = free_port()
    server = start(
        servers,
        ProcessServer(
            undolog_command("serve", "--config", str(config), "--port", str(proxy_port)),
            {
                **clean_env(),
                "UNDOLOG_LOG_LEVEL": "warning",
                "TOOLS_SECRET": secret["UNDOLOG_DEMO_TOOLS_SECRET"],
            },
            proxy_port,
        ),
    )
    response = tool_call(server.url, api_key, "echo", {"hello": "world"})
    assert response.status_code == 200, response.text
    assert response.json()["result"]["output"] == {"hello": "world"}
    calls = httpx.get(f"{tools.url}/calls", timeout=10).json()
    assert [(c["tool"], c["org"]) for c in calls] == [("echo", "acme")]


@pytest.mark.parametrize(
    "text",
    ["[server]\nbogus = 1\n", "[[orgs]]\nname = 'no id'\n", "[server\n"],
    ids=["unknown setting", "org without id", "invalid TOML"],
)
def test_serve_with_a_bad_config_file_exits_with_a_clear_message(tmp_path: Path, text: str) -> None:
    config = tmp_path / "bad.toml"
    config.write_text(text, encoding="utf-8")
    result = run("serve", "--config", str(config), "--port", str(free_port()))
    assert result.returncode != 0
    assert result.stderr.startswith("error: ")
    assert str(config) in result.stderr
    assert "Traceback" not in result.stderr


def test_serve_with_a_missing_config_file_exits_with_a_clear_message(tmp_path: Path) -> None:
    result = run("serve", "--config", str(tmp_path / "missing.toml"))
    assert result.returncode != 0
    assert "missing.toml" in result.stderr
    assert "Traceback" not in result.stderr


def test_serve_with_a_bad_number_in_env_exits_with_a_clear_message() -> None:
    result = subprocess.run(
        undolog_command("serve"),
        env={**clean_env(), "UNDOLOG_PORT": "eighty"},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode != 0
    assert "port" in result.stderr
    assert "Traceback" not in result.stderr


# --- demo-tools --------------------------------------------------------------------------


def test_demo_tools_serves_the_demo_tool_server(servers: list[ProcessServer]) -> None:
    port = free_port()
    server = start(
        servers, ProcessServer(undolog_command("demo-tools", "--port", str(port)), {}, port)
    )
    assert httpx.get(f"{server.url}/health", timeout=10).json() == {"status": "ok"}
    answer = httpx.post(f"{server.url}/tools/echo", json={"args": {"x": 1}}, timeout=10)
    assert answer.json() == {"success": True, "output": {"x": 1}, "error": None}
    # Without --inspect the unauthenticated inspection routes are not served (issue 22).
    assert httpx.get(f"{server.url}/calls", timeout=10).status_code == 404
    server.stop()
    wait_until(lambda: server.proc is not None and server.proc.poll() is not None)


def test_serve_demo_prints_an_approver_key_and_revokes_the_previous_demo_keys(
    tmp_path: Path, servers: list[ProcessServer]
) -> None:
    database_url = f"sqlite:///{tmp_path / 'x.db'}"
    first, _, old_agent, old_approver, _ = _serve_demo(tmp_path, servers, database_url)
    call = tool_call(first.url, old_agent, "delete_database", {"db_name": "d"})
    assert call.status_code == 202, call.text
    approval_id = call.json()["approval_id"]
    refused = httpx.post(
        f"{first.url}/approvals/{approval_id}/approve",
        headers={"X-Api-Key": old_agent},
        timeout=10,
    )
    assert (refused.status_code, refused.json()["code"]) == (403, "forbidden")
    first.stop()

    second, _, agent, approver, _ = _serve_demo(tmp_path, servers, database_url, run=1)
    assert {agent, approver}.isdisjoint({old_agent, old_approver})
    for old in (old_agent, old_approver):
        gone = httpx.get(f"{second.url}/sessions", headers={"X-Api-Key": old}, timeout=10)
        assert (gone.status_code, gone.json()["code"]) == (403, "auth_failed")
    approved = httpx.post(
        f"{second.url}/approvals/{approval_id}/approve",
        headers={"X-Api-Key": approver},
        timeout=10,
    )
    assert approved.status_code == 200, approved.text
    assert approved.json()["status"] == "approved"
    # Read with the approver key: the new agent key sees only sessions it created itself.
    record = httpx.get(
        f"{second.url}/approvals/{approval_id}", headers={"X-Api-Key": approver}, timeout=10
    ).json()
    assert record["decided_by"] == "key:demo-approver"
    hidden = httpx.get(
        f"{second.url}/approvals/{approval_id}", headers={"X-Api-Key": agent}, timeout=10
    )
    assert (hidden.status_code, hidden.json()["code"]) == (404, "not_found")


def test_demo_tools_with_a_secret_refuses_unsigned_calls(servers: list[ProcessServer]) -> None:
    port = free_port()
    command = undolog_command("demo-tools", "--port", str(port), "--secret", "s3", "--inspect")
    server = start(servers, ProcessServer(command, {}, port))
    unsigned = httpx.post(f"{server.url}/tools/echo", json={"args": {"x": 1}}, timeout=10)
    assert unsigned.status_code == 401
    assert unsigned.json()["success"] is False
    assert httpx.get(f"{server.url}/calls", timeout=10).json() == []
