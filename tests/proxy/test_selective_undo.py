"""Selective undo through a real proxy and the demo tool server, on both stores.

`POST /sessions/{id}/rollback` with `{"entries": [...]}` or `{"after_step": N}` runs only those
compensations, newest first, and leaves the session open (docs/undo.md). The demo upstream's
per-key execution counts show that every compensation ran exactly once, also when selective
undos race each other or a full rollback.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from tests.proxy.conftest import ProxyHarness
from tests.proxy.test_rollback import (
    EMAIL,
    RECORD,
    TRANSFER,
    call,
    cli,
    compensation_calls,
    effect_of,
    entry_of,
    executions,
    new_session,
    register,
    rollback,
    three_writes,
    upstream_state,
    view,
)


def undo(client: httpx.Client, session: str, **body: Any) -> httpx.Response:
    return client.post(f"/sessions/{session}/rollback", json=body)


def test_undoing_one_entry_runs_only_its_compensation_and_the_session_goes_on(
    proxy: ProxyHarness,
) -> None:
    session = new_session()
    with proxy.client() as client:
        [(_, _, _), (_, _, _), (record, _, made)] = three_writes(client, session)
        entry_id = entry_of(view(client, session), record)["entry_id"]
        answer = undo(client, session, entries=[entry_id])
        after = view(client, session)
        more = call(client, session, "create_record", {"table": "t", "data": {"id": 8}}, 4)

    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert (body["outcome"], body["state"], body["selected"], body["dependents"]) == (
        "compensated",
        "active",
        [entry_id],
        [],
    )
    assert [c["tool"] for c in compensation_calls(proxy, session)] == ["delete_record"]
    assert upstream_state(proxy)["records"][made["output"]["record_id"]]["status"] == "deleted"
    assert (entry_of(after, record)["state"], effect_of(after, record)["state"]) == (
        "compensated",
        "compensated",
    )
    assert [u["state"] for u in after["undo_stack"]] == ["compensated", "pending", "pending"]
    assert after["state"] == "active"
    assert (more.status_code, more.json()["status"]) == (200, "executed")


def test_a_later_full_rollback_does_not_run_an_undone_entry_again(proxy: ProxyHarness) -> None:
    session = new_session()
    with proxy.client() as client:
        [(_email, _, _), (transfer, _, _), (_record, _, _)] = three_writes(client, session)
        entry_id = entry_of(view(client, session), transfer)["entry_id"]
        assert undo(client, session, entries=[entry_id], force=True).status_code == 200
        full = rollback(client, session)

    assert full.status_code == 200, full.text
    assert (full.json()["outcome"], full.json()["state"]) == ("compensated", "compensated")
    tools = [c["tool"] for c in compensation_calls(proxy, session)]
    assert tools == ["reverse_transfer", "delete_record", "undo_send_email"]
    assert executions(proxy, "reverse_transfer") == {entry_id: 1}
    assert upstream_state(proxy)["balances"] == {"ops": 1000, "ada": 1000}


def test_undo_after_a_step_runs_the_later_entries_newest_first(proxy: ProxyHarness) -> None:
    session = new_session()
    with proxy.client() as client:
        [(email, _, _), (transfer, _, _), (record, _, _)] = three_writes(client, session)
        answer = undo(client, session, after_step=1)
        data = view(client, session)

    assert answer.status_code == 200, answer.text
    assert answer.json()["outcome"] == "compensated"
    assert answer.json()["selected"] == [
        entry_of(data, record)["entry_id"],
        entry_of(data, transfer)["entry_id"],
    ]
    tools = [c["tool"] for c in compensation_calls(proxy, session)]
    assert tools == ["delete_record", "reverse_transfer"]
    assert entry_of(data, email)["state"] == "pending"
    assert effect_of(data, email)["state"] == "committed"
    assert data["state"] == "active"


def test_undo_after_the_last_step_is_empty(proxy: ProxyHarness) -> None:
    session = new_session()
    with proxy.client() as client:
        three_writes(client, session)
        answer = undo(client, session, after_step=3)

    assert answer.status_code == 200, answer.text
    assert (answer.json()["outcome"], answer.json()["selected"]) == ("empty_undo_stack", [])
    assert compensation_calls(proxy, session) == []


def test_later_committed_calls_are_listed_and_refused_without_force(proxy: ProxyHarness) -> None:
    session = new_session()
    with proxy.client() as client:
        [(email, _, _), (transfer, _, _), (record, _, _)] = three_writes(client, session)
        entry_id = entry_of(view(client, session), email)["entry_id"]
        refused = undo(client, session, entries=[entry_id])
        untouched = view(client, session)
        forced = undo(client, session, entries=[entry_id], force=True)

    assert refused.status_code == 409, refused.text
    assert refused.json()["code"] == "dependent_effects"
    assert refused.json()["dependents"] == [transfer, record]
    assert compensation_calls(proxy, session)[:0] == []
    assert [u["state"] for u in untouched["undo_stack"]] == ["pending"] * 3
    assert forced.status_code == 200, forced.text
    assert [d["effect_id"] for d in forced.json()["dependents"]] == [transfer, record]
    assert forced.json()["dependents"][0] == {
        "effect_id": transfer,
        "step_index": 2,
        "tool_name": "transfer_funds",
        "state": "committed",
    }
    assert [c["tool"] for c in compensation_calls(proxy, session)] == ["undo_send_email"]


def test_an_approved_irreversible_call_after_the_step_is_a_dependent(proxy: ProxyHarness) -> None:
    session = new_session()
    with proxy.client() as client, proxy.client(proxy.approver_key) as approver:
        call(client, session, "send_email", EMAIL, 1)
        waiting = call(client, session, "publish_to_production", {"version": "1.2"}, 2)
        assert waiting.status_code == 202, waiting.text
        approval = waiting.json()["approval_id"]
        approved = approver.post(f"/approvals/{approval}/approve", json={})
        assert approved.status_code == 200, approved.text
        refused = undo(client, session, after_step=0)

    assert (refused.status_code, refused.json()["code"]) == (409, "dependent_effects")
    assert refused.json()["dependents"] == [waiting.json()["effect_id"]]


def test_a_compensation_that_gives_up_escalates_and_the_session_stays_open(
    proxy: ProxyHarness,
) -> None:
    session = new_session()
    with proxy.client() as client:
        register(client, "create_record", "delete_record", args={"fail_times": 3}, max_retries=1)
        record = call(client, session, "create_record", RECORD, 1).json()["effect_id"]
        entry_id = entry_of(view(client, session), record)["entry_id"]
        failed = undo(client, session, entries=[entry_id])
        after_failure = view(client, session)
        still_open = call(client, session, "send_email", EMAIL, 2)
        assert client.post(f"/undo/{entry_id}/retry").status_code == 200
        again = undo(client, session, entries=[entry_id], force=True)  # the email came after
        data = view(client, session)

    assert (failed.status_code, failed.json()["code"]) == (502, "compensation_failed")
    assert failed.json()["state"] == "active"
    assert entry_of(after_failure, record)["state"] == "failed"
    assert effect_of(after_failure, record)["state"] == "compensation_failed"
    assert after_failure["state"] == "active"
    assert still_open.json()["status"] == "executed"
    assert again.status_code == 200, again.text
    assert entry_of(data, record)["state"] == "compensated"
    assert executions(proxy, "delete_record") == {entry_id: 1}


def test_a_failed_call_s_entry_is_left_for_its_retry(proxy: ProxyHarness) -> None:
    # Its call may still be retried and commit: the entry must stay on the stack for that.
    session = new_session()
    with proxy.client() as client:
        spec = {"tier": "compensable", "compensation": {"fn_name": "echo"},
                "idempotent_upstream": True}  # fmt: skip
        client.put("/tools/broken", json=spec).raise_for_status()
        assert call(client, session, "broken", {"n": 1}, 1).status_code == 502
        answer = undo(client, session, after_step=0)
        data = view(client, session)

    assert answer.status_code == 200, answer.text
    assert answer.json()["outcome"] == "empty_undo_stack"
    assert [u["state"] for u in data["undo_stack"]] == ["pending"]


@pytest.mark.parametrize(
    ("body", "status", "code"),
    [
        ({"entries": ["x"], "after_step": 1}, 400, "invalid_request"),
        ({"force": True}, 400, "invalid_request"),
        ({"entries": []}, 400, "invalid_request"),
        ({"entries": "x"}, 400, "invalid_request"),
        ({"entries": ["x" * 201]}, 400, "invalid_request"),
        ({"entries": ["e"] * 101}, 400, "invalid_request"),
        ({"after_step": -1}, 400, "invalid_request"),
        ({"after_step": True}, 400, "invalid_request"),
        ({"after_step": 1, "force": "yes"}, 400, "invalid_request"),
        ({"after_step": 1, "org_id": "other"}, 400, "invalid_request"),
        ({"entries": ["no-such-entry"]}, 404, "not_found"),
    ],
)
@pytest.mark.security
def test_a_bad_selection_is_refused(
    proxy: ProxyHarness, body: dict[str, Any], status: int, code: str
) -> None:
    session = new_session()
    with proxy.client() as client:
        call(client, session, "send_email", EMAIL, 1)
        answer = undo(client, session, **body)
        data = view(client, session)

    assert (answer.status_code, answer.json()["code"]) == (status, code), answer.text
    assert data["undo_stack"][0]["state"] == "pending"


@pytest.mark.security
def test_an_entry_of_another_session_or_org_is_not_found(
    proxy_factory: Callable[..., ProxyHarness],
) -> None:
    proxy, stranger = proxy_factory(), proxy_factory()
    mine, theirs, elsewhere = new_session(), new_session(), new_session()
    with proxy.client() as client, stranger.client() as other:
        call(client, mine, "send_email", EMAIL, 1)
        call(client, theirs, "send_email", EMAIL, 1)
        call(other, elsewhere, "send_email", EMAIL, 1)
        their_entry = view(client, theirs)["undo_stack"][0]["entry_id"]
        foreign_entry = view(other, elsewhere)["undo_stack"][0]["entry_id"]
        answers = [
            undo(client, mine, entries=[their_entry]),
            undo(client, mine, entries=[foreign_entry]),
            undo(other, mine, after_step=0),
        ]

    assert [(a.status_code, a.json()["code"]) for a in answers] == [(404, "not_found")] * 3
    assert compensation_calls(proxy, theirs) == []
    assert compensation_calls(stranger, elsewhere) == []


@pytest.mark.security
def test_roles_are_those_of_a_rollback(proxy: ProxyHarness) -> None:
    session, foreign = new_session(), new_session()
    with (
        proxy.client(proxy.agent_key) as agent,
        proxy.client(proxy.approver_key) as approver,
        proxy.client() as admin,
    ):
        call(agent, session, "send_email", EMAIL, 1)
        call(admin, foreign, "send_email", EMAIL, 1)
        by_agent_elsewhere = undo(agent, foreign, after_step=0)
        # A person may undo an agent's work (issue 24): an approver undoes any session.
        by_approver = undo(approver, foreign, after_step=0)
        by_agent = undo(agent, session, after_step=0)

    assert (by_agent_elsewhere.status_code, by_agent_elsewhere.json()["code"]) == (
        404,
        "not_found",
    )
    assert by_approver.status_code == 200, by_approver.text
    assert by_agent.status_code == 200, by_agent.text
    assert [c["tool"] for c in compensation_calls(proxy, session)] == ["undo_send_email"]
    assert [c["tool"] for c in compensation_calls(proxy, foreign)] == ["undo_send_email"]


# -- races -----------------------------------------------------------------------------------


async def _race(
    proxy: ProxyHarness, session: str, bodies: list[dict[str, Any] | None]
) -> list[int]:
    async with proxy.async_client() as client:
        answers = await asyncio.gather(
            *(
                client.post(f"/sessions/{session}/rollback", json=body)
                if body is not None
                else client.post(f"/sessions/{session}/rollback")
                for body in bodies
            )
        )
    return [a.status_code for a in answers]


def test_selective_undos_racing_a_full_rollback_run_each_compensation_once(
    proxy: ProxyHarness,
) -> None:
    session = new_session()
    with proxy.client() as client:
        writes = three_writes(client, session)
        entries = [entry_of(view(client, session), e)["entry_id"] for e, _, _ in writes]
    bodies: list[dict[str, Any] | None] = [
        {"entries": [entries[0]], "force": True},
        {"after_step": 1},
        None,
        {"entries": [entries[2]]},
        {"after_step": 0, "force": True},
        None,
    ]
    statuses = asyncio.run(_race(proxy, session, bodies))
    assert set(statuses) <= {200, 409}, statuses
    with proxy.client() as client:
        final = rollback(client, session)
        data = view(client, session)

    assert final.json()["outcome"] == "compensated", final.text
    assert [u["state"] for u in data["undo_stack"]] == ["compensated"] * 3
    for tool, entry_id in zip(
        ("undo_send_email", "reverse_transfer", "delete_record"), entries, strict=True
    ):
        assert executions(proxy, tool) == {entry_id: 1}
    assert len(compensation_calls(proxy, session)) == 3


def test_two_selective_undos_of_one_entry_run_it_once(proxy: ProxyHarness) -> None:
    session = new_session()
    with proxy.client() as client:
        [(_, _, _), (_, _, _), (record, _, _)] = three_writes(client, session)
        entry_id = entry_of(view(client, session), record)["entry_id"]
    body: dict[str, Any] = {"entries": [entry_id]}
    statuses = asyncio.run(_race(proxy, session, [body] * 4 + [{"after_step": 2}] * 2))
    assert set(statuses) <= {200, 409}, statuses
    with proxy.client() as client:
        again = undo(client, session, entries=[entry_id])
        data = view(client, session)

    assert again.json()["outcome"] == "compensated"
    assert entry_of(data, record)["state"] == "compensated"
    assert executions(proxy, "delete_record") == {entry_id: 1}
    assert data["state"] == "active"


def test_the_transfer_of_a_selective_undo_is_reversed(proxy: ProxyHarness) -> None:
    session = new_session()
    with proxy.client() as client:
        call(client, session, "transfer_funds", TRANSFER, 1)
        assert undo(client, session, after_step=0).status_code == 200
    assert upstream_state(proxy)["balances"] == {"ops": 1000, "ada": 1000}


# -- the operator CLI ------------------------------------------------------------------------


def test_the_cli_undoes_an_entry_or_the_steps_after_one(proxy: ProxyHarness) -> None:
    session = new_session()
    with proxy.client() as client:
        [(email, _, _), (_, _, _), (record, _, _)] = three_writes(client, session)
        email_entry = entry_of(view(client, session), email)["entry_id"]

    refused = cli(proxy, "sessions", "rollback", session, "--entry", email_entry)
    after = cli(proxy, "sessions", "rollback", session, "--after-step", "2")
    forced = cli(proxy, "sessions", "rollback", session, "--entry", email_entry, "--force")
    with proxy.client() as client:
        data = view(client, session)

    assert refused.returncode == 1
    assert "dependent_effects" in refused.stderr
    assert after.returncode == 0, after.stderr
    assert "undo: compensated" in after.stdout
    assert f"session {session}  state=active" in after.stdout
    assert forced.returncode == 0, forced.stderr
    assert "warning: step 2 transfer_funds (committed) may depend on what was undone" in (
        forced.stdout
    )
    assert entry_of(data, record)["state"] == entry_of(data, email)["state"] == "compensated"
    assert [c["tool"] for c in compensation_calls(proxy, session)] == [
        "delete_record",
        "undo_send_email",
    ]
