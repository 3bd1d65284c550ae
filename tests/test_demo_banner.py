"""The `serve --demo` banner's keys work for the README's commands, as printed (issue 24).

One real `serve --demo` child process; the README's CLI commands run as child processes with
the environment the banner's `export` lines give each shell: a person's shell (the approver
key) approves and rolls back, an operator's repair takes the admin key, the agent's shell (the
agent key) makes the calls.
"""

from __future__ import annotations

import os
import re
import subprocess
import uuid
from pathlib import Path

import httpx

from tests.support.servers import ProcessServer, undolog_command
from tests.test_cli import _serve_demo, servers

__all__ = ["servers"]  # the fixture, re-exported


def _exports(banner: str, heading: str) -> dict[str, str]:
    """The `export NAME=VALUE` lines of the banner's block that starts with `heading`."""
    block = banner.split(heading, 1)[1].split(":\n", 1)[1]
    found: dict[str, str] = {}
    for line in block.splitlines():
        match = re.fullmatch(r"    export (\w+)=(\S+)", line)
        if match is None:
            break
        found[match.group(1)] = match.group(2)
    return found


def _undolog(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("UNDOLOG_")}
    return subprocess.run(
        undolog_command(*args),
        env={**clean, **env},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_the_banners_keys_work_for_the_readmes_commands(
    tmp_path: Path, servers: list[ProcessServer]
) -> None:
    server, _, agent_key, approver_key, log = _serve_demo(
        tmp_path, servers, f"sqlite:///{tmp_path / 'x.db'}"
    )
    banner = log.read_text(encoding="utf-8")
    agent = _exports(banner, "in the agent's shell")
    person = _exports(banner, "in a person's shell")
    assert agent == {"UNDOLOG_PROXY_URL": server.url, "UNDOLOG_API_KEY": agent_key}
    assert person == {"UNDOLOG_PROXY_URL": server.url, "UNDOLOG_API_KEY": approver_key}
    admin = re.search(r"undolog undo retry\|resolve ENTRY --api-key (\S+)", banner)
    assert admin is not None, banner

    # The agent's calls (the banner's `try:` line): a write, and one that waits for a person.
    session = str(uuid.uuid4())

    def call(tool: str, step: int, **args: str) -> httpx.Response:
        body = {"session_id": session, "tool_name": tool, "step_index": step, "args": args}
        headers = {"X-Api-Key": agent["UNDOLOG_API_KEY"]}
        return httpx.post(f"{server.url}/mcp/tool_call", json=body, headers=headers, timeout=10)

    sent = call("send_email", 1, to="a@b.c", subject="hi")
    assert sent.status_code == 200, sent.text
    waiting = call("delete_database", 2, db_name="d")
    assert waiting.status_code == 202, waiting.text
    approval_id = waiting.json()["approval_id"]

    # `/mcp` lists the demo tools for the agent key, no `[mcp]` config written.
    listing = httpx.post(
        f"{server.url}/mcp",
        json={"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}},
        headers={"X-Api-Key": agent_key, "Accept": "application/json, text/event-stream",
                 "MCP-Protocol-Version": "2025-11-25"},
        timeout=10,
    )  # fmt: skip
    assert listing.status_code == 200, listing.text
    names = {t["name"] for t in listing.json()["result"]["tools"]}
    assert {"search_web", "send_email", "delete_database"} <= names

    # A person's shell: README's `undolog approvals list|approve`, `undolog sessions ...`.
    listed = _undolog(person, "approvals", "list")
    assert listed.returncode == 0 and approval_id in listed.stdout, listed.stderr
    approved = _undolog(person, "approvals", "approve", approval_id)
    assert approved.returncode == 0, approved.stderr
    assert _undolog(person, "sessions", "list").returncode == 0
    rolled = _undolog(person, "sessions", "rollback", session)
    assert rolled.returncode == 0, rolled.stderr + rolled.stdout
    assert "compensated" in rolled.stdout

    # An operator's repair takes the admin key: it is let in (the entry is not failed).
    entry = httpx.get(
        f"{server.url}/sessions/{session}",
        headers={"X-Api-Key": approver_key},
        timeout=10,
    ).json()["undo_stack"][0]["entry_id"]
    as_person = _undolog(person, "undo", "retry", entry)
    assert "may not use" in as_person.stderr
    repair = _undolog(person, "undo", "retry", entry, "--api-key", admin.group(1))
    assert "may not use" not in repair.stderr and "forbidden" not in repair.stderr, repair.stderr
