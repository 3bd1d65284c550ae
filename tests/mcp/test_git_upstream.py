"""mcp-server-git (PyPI) behind the gateway, in front of a fresh repository.

Every claim about what ran is read back from the repository itself (`git rev-list`, `git
branch`, the index), not only from UndoLog's metadata. The tiers are `git_gateway_config`'s.
"""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from mcp import Client, StdioServerParameters

from tests.mcp.conftest import Gateway, git, git_server_command, text_of
from undolog_sdk.errors import NotFound

pytestmark = pytest.mark.slow


def _commits(repo: Path) -> int:
    return int(git(repo, "rev-list", "--count", "HEAD"))


def _staged(repo: Path, path: str) -> str | None:
    """The blob the index holds for `path`, if it holds one."""
    entry = git(repo, "ls-files", "--stage", "--", path).split()
    return entry[1] if entry else None


async def test_git_tools_are_listed_under_the_prefix_exactly_as_the_server_lists_them(
    git_gateway: Gateway, git_repo: Path, era: str
) -> None:
    command, args = git_server_command(git_repo)
    async with Client(StdioServerParameters(command=command, args=args)) as direct:
        upstream = {t.name: t for t in (await direct.list_tools()).tools}
    async with git_gateway.client(era=era) as client:
        listed = {t.name: t for t in (await client.list_tools()).tools}

    assert set(listed) == {f"git.{name}" for name in upstream}
    # Exactly, but for the gateway's own `execution`: any tool may be called as a task in the
    # handshake era (docs/mcp.md, "MCP Tasks"); the 2026-07-28 era has no such field.
    optional = "optional" if era == "legacy" else None
    for name, tool in upstream.items():
        gateway_tool = listed[f"git.{name}"]
        task_support = gateway_tool.execution.task_support if gateway_tool.execution else None
        assert task_support == optional, name
        assert gateway_tool.model_dump(exclude={"name", "execution"}) == tool.model_dump(
            exclude={"name", "execution"}
        ), name
    status = listed["git.git_status"]
    assert status.annotations is not None and status.annotations.read_only_hint is True
    commit = listed["git.git_commit"]
    assert commit.annotations is not None and commit.annotations.read_only_hint is False
    assert commit.input_schema["required"] == ["repo_path", "message"]


async def test_git_reads_pass_through_and_nothing_is_recorded(
    git_gateway: Gateway, git_repo: Path, era: str, session_id: str
) -> None:
    repo_path = {"repo_path": str(git_repo)}
    async with git_gateway.client(session_id, era=era) as client:
        status = await client.call_tool("git.git_status", repo_path)
        log = await client.call_tool("git.git_log", repo_path)
    assert not status.is_error and not log.is_error, text_of(status) + text_of(log)
    assert "working tree clean" in text_of(status)
    assert git(git_repo, "rev-parse", "HEAD").strip() in text_of(log)
    assert status.meta is not None and status.meta["undolog"]["status"] == "passed_through"
    with git_gateway.rest() as rest:
        answer = rest.get(f"/sessions/{session_id}")
    assert answer.status_code == 404  # no effect, so not even a session
    assert answer.json()["code"] == NotFound.code


async def test_a_staged_file_is_recorded_and_a_rollback_unstages_it(
    git_gateway: Gateway, git_repo: Path, era: str, session_id: str
) -> None:
    (git_repo / "notes.txt").write_text("one\n")
    async with git_gateway.client(session_id, era=era) as client:
        added = await client.call_tool(
            "git.git_add", {"repo_path": str(git_repo), "files": ["notes.txt"]}
        )
    assert not added.is_error, text_of(added)
    assert added.meta is not None and added.meta["undolog"]["status"] == "executed"
    assert _staged(git_repo, "notes.txt") is not None
    with git_gateway.rest() as rest:
        view = rest.get(f"/sessions/{session_id}").json()
        assert [(e["tool_name"], e["state"]) for e in view["effects"]] == [
            ("git.git_add", "committed")
        ]
        answer = rest.post(f"/sessions/{session_id}/rollback")
    assert answer.status_code == 200, answer.text
    assert answer.json()["outcome"] == "compensated"
    assert _staged(git_repo, "notes.txt") is None  # git_reset ran on the repository
    assert (git_repo / "notes.txt").read_text() == "one\n"


# A call identical to one whose answer the client has already received is a new step, not a
# retry (tests/mcp/test_delivery.py has the retries).
async def test_the_same_write_after_its_answer_arrived_runs_again_as_a_new_step(
    git_gateway: Gateway, git_repo: Path, era: str, session_id: str
) -> None:
    args = {"repo_path": str(git_repo), "files": ["notes.txt"]}
    (git_repo / "notes.txt").write_text("one\n")
    async with git_gateway.client(session_id, era=era) as client:
        first = await client.call_tool("git.git_add", args)
        assert not first.is_error, text_of(first)
        staged_first = _staged(git_repo, "notes.txt")
        (git_repo / "notes.txt").write_text("two\n")
        second = await client.call_tool("git.git_add", args)
    assert not second.is_error, text_of(second)
    assert first.meta is not None and second.meta is not None
    was, now = first.meta["undolog"], second.meta["undolog"]
    assert now["status"] == "executed"
    assert now["effect_id"] != was["effect_id"]
    assert now["step_index"] == was["step_index"] + 1
    # The second add really ran: the index holds the file's new content.
    assert _staged(git_repo, "notes.txt") == git(git_repo, "hash-object", "notes.txt").strip()
    assert _staged(git_repo, "notes.txt") != staged_first


async def test_a_commit_waits_for_approval_runs_once_after_it_and_its_retry_gets_that_run(
    git_gateway: Gateway, git_repo: Path, era: str, session_id: str
) -> None:
    (git_repo / "notes.txt").write_text("one\n")
    git(git_repo, "add", "notes.txt")
    args = {"repo_path": str(git_repo), "message": "add notes"}
    async with git_gateway.client(session_id, era=era) as client:
        waiting = await client.call_tool("git.git_commit", args)
        assert waiting.is_error
        assert waiting.meta is not None
        pending = waiting.meta["undolog"]
        assert pending["status"] == "pending_approval"
        assert pending["approval_id"] in text_of(waiting)
        assert _commits(git_repo) == 1  # nothing ran
        again = await client.call_tool("git.git_commit", args)
        assert again.meta is not None
        assert again.meta["undolog"]["approval_id"] == pending["approval_id"]
        assert _commits(git_repo) == 1

        with git_gateway.rest() as rest:
            answer = rest.post(f"/approvals/{pending['approval_id']}/approve", json={})
        assert answer.status_code == 200, answer.text
        assert answer.json()["execution"] == "committed"
        assert _commits(git_repo) == 2
        head = git(git_repo, "rev-parse", "HEAD").strip()
        assert git(git_repo, "log", "-1", "--format=%s").strip() == "add notes"
        # Stage something new: if the retry ran the commit again, it would commit this.
        (git_repo / "more.txt").write_text("more\n")
        git(git_repo, "add", "more.txt")
        retried = await client.call_tool("git.git_commit", args)
    assert not retried.is_error, text_of(retried)
    assert retried.meta is not None
    assert retried.meta["undolog"]["status"] == "replayed"
    assert retried.meta["undolog"]["effect_id"] == pending["effect_id"]
    assert text_of(retried) == f"Changes committed successfully with hash {head}"
    assert _commits(git_repo) == 2
    assert _staged(git_repo, "more.txt") is not None
    with git_gateway.rest() as rest:
        view = rest.get(f"/sessions/{session_id}").json()
    assert [(e["tool_name"], e["state"]) for e in view["effects"]] == [
        ("git.git_commit", "committed")
    ]


async def test_a_write_the_config_does_not_name_waits_for_approval_by_its_annotations(
    git_gateway: Gateway, git_repo: Path, era: str
) -> None:
    args = {"repo_path": str(git_repo), "branch_name": "feature"}
    async with git_gateway.client(str(uuid.uuid4()), era=era) as client:
        waiting = await client.call_tool("git.git_create_branch", args)
    assert waiting.is_error
    assert waiting.meta is not None and waiting.meta["undolog"]["status"] == "pending_approval"
    assert git(git_repo, "branch", "--list", "feature") == ""
