"""`undolog approvals list|approve|reject` against a real proxy, on both stores.

The commands run in process (typer's CliRunner) against a proxy on a loopback port; one test
runs the real `python -m undolog` as a child process to show the commands are wired in.
"""

from __future__ import annotations

import json
import os
import subprocess
import uuid
from typing import Any

import httpx
import pytest
from typer.testing import CliRunner, Result

from tests.proxy import conftest as proxy_fixtures
from tests.proxy.conftest import ProxyHarness
from tests.support.servers import free_port, undolog_command
from undolog.cli import app

# The proxy harness's fixtures (tests/proxy/conftest.py), used here by name.
demo_upstream = proxy_fixtures.demo_upstream
proxy_factory = proxy_fixtures.proxy_factory
proxy = proxy_fixtures.proxy

TABLE_HEADERS = ["approval", "tool", "status", "session", "created", "timeout", "args"]


def undolog(proxy: ProxyHarness, *args: str, key: str | None = None) -> Result:
    env = {"UNDOLOG_PROXY_URL": proxy.url, "UNDOLOG_API_KEY": key or proxy.api_key}
    return CliRunner().invoke(app, ["approvals", *args], env=env)


def await_approval(proxy: ProxyHarness, step: int = 1, session: str | None = None) -> str:
    body = {"session_id": session or str(uuid.uuid4()), "tool_name": "delete_database",
            "step_index": step, "args": {"db_name": f"db-{step}"}}  # fmt: skip
    with proxy.client() as c:
        response = c.post("/mcp/tool_call", json=body)
    assert response.status_code == 202, response.text
    approval_id: str = response.json()["approval_id"]
    return approval_id


def api_list(proxy: ProxyHarness, **params: Any) -> list[dict[str, Any]]:
    with proxy.client() as c:
        items: list[dict[str, Any]] = c.get("/approvals", params=params).json()
    return items


def test_list_prints_a_table_newest_first(proxy: ProxyHarness) -> None:
    session = str(uuid.uuid4())
    older, newer = await_approval(proxy, 1, session), await_approval(proxy, 2, session)
    result = undolog(proxy, "list")
    assert result.exit_code == 0, result.output
    header, rule, *rows = result.stdout.splitlines()
    assert header.split() == TABLE_HEADERS
    assert set(rule.replace(" ", "")) == {"-"}
    assert [row.split()[0] for row in rows] == [newer, older]
    assert rows[0].split()[1:3] == ["delete_database", "pending"]
    assert '{"db_name":"db-2"}' in rows[0]


def test_list_json_is_the_apis_answer(proxy: ProxyHarness) -> None:
    await_approval(proxy)
    result = undolog(proxy, "list", "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout) == api_list(proxy)


def test_list_filters_by_state_and_limits(proxy: ProxyHarness) -> None:
    session = str(uuid.uuid4())
    ids = [await_approval(proxy, step, session) for step in (1, 2, 3)]
    assert undolog(proxy, "approve", ids[0]).exit_code == 0
    approved = json.loads(undolog(proxy, "list", "--state", "approved", "--json").stdout)
    newest = json.loads(undolog(proxy, "list", "--limit", "1", "--json").stdout)
    assert [a["id"] for a in approved] == [ids[0]]
    assert [a["id"] for a in newest] == [ids[2]]


def test_a_list_of_decided_approvals_shows_who_decided_and_why(proxy: ProxyHarness) -> None:
    approval_id = await_approval(proxy)
    assert undolog(proxy, "reject", approval_id, "--reason", "wrong-db").exit_code == 0
    result = undolog(proxy, "list", "--state", "rejected")
    assert result.exit_code == 0, result.output
    header, _, row = result.stdout.splitlines()
    assert header.split() == [*TABLE_HEADERS, "decided", "by", "reason"]
    assert row.split()[0] == approval_id
    assert row.split()[-2:] == ["key:admin", "wrong-db"]


def test_a_state_is_sent_as_one_query_parameter(proxy: ProxyHarness) -> None:
    await_approval(proxy)
    result = undolog(proxy, "list", "--state", "pending&limit=0", "--json")
    assert result.exit_code == 1
    assert "invalid_request" in result.stderr


def test_list_with_an_unknown_state_fails_with_the_proxys_error(proxy: ProxyHarness) -> None:
    result = undolog(proxy, "list", "--state", "maybe")
    assert result.exit_code == 1
    assert "invalid_request" in result.stderr


def test_approve_runs_the_call_and_prints_its_result_with_the_reason_stored(
    proxy: ProxyHarness,
) -> None:
    approval_id = await_approval(proxy)
    result = undolog(proxy, "approve", approval_id, "--reason", "change CHG-7")
    assert result.exit_code == 0, result.output
    first, *rest = result.stdout.splitlines()
    assert first == f"approval {approval_id}: approved; execution committed"
    assert json.loads("\n".join(rest))["output"] == {"db_name": "db-1", "status": "deleted"}
    (record,) = api_list(proxy, state="approved")
    assert (record["reason"], record["decided_by"]) == ("change CHG-7", "key:admin")
    assert proxy.counters("delete_database") == {record["effect_id"]: 1}


def test_reject_with_a_reason_prints_json(proxy: ProxyHarness) -> None:
    approval_id = await_approval(proxy)
    result = undolog(proxy, "reject", approval_id, "--reason", "not today", "--json")
    assert result.exit_code == 0, result.output
    answer = json.loads(result.stdout)
    assert (answer["status"], answer["approval_id"]) == ("rejected", approval_id)
    (record,) = api_list(proxy, state="rejected")
    assert (record["reason"], record["decided_by"]) == ("not today", "key:admin")


def test_reject_prints_a_line(proxy: ProxyHarness) -> None:
    approval_id = await_approval(proxy)
    result = undolog(proxy, "reject", approval_id)
    assert result.exit_code == 0, result.output
    assert result.stdout.strip() == f"approval {approval_id}: rejected"


@pytest.mark.parametrize("second", ["approve", "reject"])
def test_deciding_twice_fails_with_the_proxys_error(proxy: ProxyHarness, second: str) -> None:
    approval_id = await_approval(proxy)
    assert undolog(proxy, "reject", approval_id).exit_code == 0
    result = undolog(proxy, second, approval_id)
    assert result.exit_code == 1
    assert "approval_already_resolved" in result.stderr


def test_an_unknown_approval_fails_with_not_found(proxy: ProxyHarness) -> None:
    result = undolog(proxy, "approve", str(uuid.uuid4()))
    assert result.exit_code == 1
    assert "not_found" in result.stderr


def test_without_an_api_key_the_command_is_refused() -> None:
    result = CliRunner().invoke(app, ["approvals", "list"], env={"UNDOLOG_API_KEY": ""})
    assert result.exit_code == 2
    assert "API key" in result.stderr


def test_an_unreachable_proxy_is_exit_code_2() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    result = CliRunner().invoke(app, ["approvals", "list", "--url", url, "--api-key", "k"])
    assert result.exit_code == 2
    assert "cannot reach the proxy" in result.stderr


def test_the_installed_command_lists_approvals(proxy: ProxyHarness) -> None:
    approval_id = await_approval(proxy)
    env = {k: v for k, v in os.environ.items() if not k.startswith("UNDOLOG_")}
    completed = subprocess.run(
        undolog_command("approvals", "list", "--json", "--url", proxy.url,
                        "--api-key", proxy.api_key),
        env=env, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert completed.returncode == 0, completed.stderr
    assert [a["id"] for a in json.loads(completed.stdout)] == [approval_id]
    assert httpx.get(f"{proxy.url}/health").status_code == 200


def test_approve_with_args_runs_the_changed_call_and_bad_json_is_refused(
    proxy: ProxyHarness,
) -> None:
    approval_id = await_approval(proxy)
    bad = undolog(proxy, "approve", approval_id, "--args", "{not json")
    assert bad.exit_code != 0
    assert api_list(proxy)[0]["status"] == "pending"
    result = undolog(proxy, "approve", approval_id, "--args", '{"db_name": "db-copy"}')
    assert result.exit_code == 0, result.output
    assert "execution committed" in result.stdout
    with proxy.client() as c:
        card = c.get(f"/approvals/{approval_id}").json()
    assert card["approved_args"] == {"db_name": "db-copy"}
    assert card["args_diff"]["changed"] == {"db_name": {"from": "db-1", "to": "db-copy"}}


def test_approve_with_the_args_hash_seen_and_a_stale_one_is_refused(proxy: ProxyHarness) -> None:
    approval_id = await_approval(proxy)
    [card] = [a for a in api_list(proxy) if a["id"] == approval_id]
    stale = undolog(proxy, "approve", approval_id, "--args-hash", "0" * 64)
    assert stale.exit_code != 0
    assert "approval_args_changed" in stale.output
    done = undolog(proxy, "approve", approval_id, "--args-hash", card["args_hash"], "--json")
    assert done.exit_code == 0, done.output
    assert json.loads(done.stdout)["execution"] == "committed"
