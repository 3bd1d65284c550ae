"""What the CLI prints: `--version`, "none" for an empty table, `--json` on every command that
prints data. Commands run in process (typer's CliRunner) against a real proxy on a loopback
port, on both stores; `--version` and the database commands run as real child processes.
"""

from __future__ import annotations

import json
import re
import uuid
from pathlib import Path

import pytest
from typer.testing import CliRunner, Result

import undolog
from tests.proxy import conftest as proxy_fixtures
from tests.proxy.conftest import ProxyHarness
from tests.test_cli import run
from undolog.cli import app

demo_upstream = proxy_fixtures.demo_upstream
proxy_factory = proxy_fixtures.proxy_factory
proxy = proxy_fixtures.proxy


def undolog_cli(proxy: ProxyHarness, *args: str) -> Result:
    env = {"UNDOLOG_PROXY_URL": proxy.url, "UNDOLOG_API_KEY": proxy.api_key}
    return CliRunner().invoke(app, list(args), env=env)


def test_version_prints_the_packages_version() -> None:
    done = run("--version")
    assert (done.returncode, done.stdout, done.stderr) == (
        0,
        f"undolog {undolog.__version__}\n",
        "",
    )


@pytest.mark.parametrize(
    "args",
    [
        ["approvals", "list", "--state", "timed_out"],
        ["approvals", "list"],
        ["sessions", "list"],
    ],
    ids=["timed-out approvals", "pending approvals", "sessions"],
)
def test_an_empty_table_prints_none(proxy: ProxyHarness, args: list[str]) -> None:
    result = undolog_cli(proxy, *args)
    assert (result.exit_code, result.stdout) == (0, "none\n"), result.output


def test_a_session_with_nothing_to_undo_shows_none_under_its_undo_stack(
    proxy: ProxyHarness,
) -> None:
    session = str(uuid.uuid4())
    body = {"session_id": session, "tool_name": "delete_database", "step_index": 1,
            "args": {"db_name": "d"}}  # fmt: skip
    with proxy.client() as c:  # an irreversible call waits for approval: nothing to undo
        assert c.post("/mcp/tool_call", json=body).status_code == 202
    result = undolog_cli(proxy, "sessions", "show", session)
    assert result.exit_code == 0, result.output
    assert result.stdout.endswith("undo stack (top first):\nnone\n")


# Every command that prints data, and the command line that shows it.
JSON_COMMANDS = [
    ["sessions", "list"],
    ["sessions", "show"],
    ["sessions", "rollback"],
    ["undo", "retry"],
    ["undo", "resolve"],
    ["approvals", "list"],
    ["approvals", "approve"],
    ["approvals", "reject"],
    ["keys", "create"],
    ["keys", "list"],
    ["keys", "revoke"],
    ["migrate"],
    ["prune"],
]


@pytest.mark.parametrize("command", JSON_COMMANDS, ids=" ".join)
def test_every_command_that_prints_data_has_json(command: list[str]) -> None:
    result = CliRunner().invoke(app, [*command, "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert re.search(r"--json\b", result.stdout), result.stdout


def test_undo_retry_json_prints_the_proxys_error_on_a_missing_entry(proxy: ProxyHarness) -> None:
    result = undolog_cli(proxy, "undo", "retry", str(uuid.uuid4()), "--json")
    assert result.exit_code == 1
    assert "not_found" in result.stderr or "not found" in result.stderr.lower()


def test_keys_and_migrate_print_json(tmp_path: Path) -> None:
    database = f"sqlite:///{tmp_path / 'k.db'}"
    migrated = run("migrate", "--database-url", database, "--json")
    assert migrated.returncode == 0, migrated.stderr
    assert set(json.loads(migrated.stdout)) == {"schema_version", "database"}
    assert json.loads(migrated.stdout)["database"] == "sqlite"

    empty = run("keys", "list", "--database-url", database)
    assert (empty.returncode, empty.stdout) == (0, "none\n"), empty.stderr
    assert json.loads(run("keys", "list", "--database-url", database, "--json").stdout) == []
    seeded = run("keys", "create", "--database-url", database, "--org", "acme", "--name", "ops",
                 "--role", "admin", "--json")  # fmt: skip
    assert seeded.returncode == 0, seeded.stderr
    created = json.loads(seeded.stdout)
    assert set(created) == {"key_id", "org_id", "name", "role", "key"}
    listed = json.loads(run("keys", "list", "--database-url", database, "--json").stdout)
    assert [k["key_id"] for k in listed] == [created["key_id"]]
    assert created["key"] not in json.dumps(listed)
    assert not any("hash" in field for field in listed[0])
    revoked = run("keys", "revoke", created["key_id"], "--database-url", database, "--json")
    assert json.loads(revoked.stdout) == {"key_id": created["key_id"], "revoked": True}
