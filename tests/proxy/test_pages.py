"""Searches, filters and pages of `GET /sessions` and `GET /approvals`, who asked for an
approval and its session's recent calls, and `GET /events/recent`: a real proxy and a real
demo upstream, on both stores (docs/dashboard.md).

The attacks: a filter, a search or a forged cursor never reaches another key's sessions (an
agent key) nor another org's rows; bad parameters are a 400 saying which and why.
"""

from __future__ import annotations

import base64
import json
import uuid
from typing import Any

import httpx
import pytest

from tests.proxy.conftest import ProxyHarness

TOOL_CALL = "/mcp/tool_call"
NEXT = "X-UndoLog-Next-Cursor"


def call(c: httpx.Client, session: str, tool: str, args: dict[str, Any], step: int) -> Any:
    body = {"session_id": session, "tool_name": tool, "step_index": step, "args": args}
    response = c.post(TOOL_CALL, json=body)
    assert response.status_code in (200, 202), response.text
    return response.json()


def pages_of(c: httpx.Client, path: str, **params: Any) -> list[list[dict[str, Any]]]:
    """Every page of a list, following the cursor to the end."""
    found: list[list[dict[str, Any]]] = []
    cursor = None
    while True:
        query = {**params, **({"cursor": cursor} if cursor else {})}
        response = c.get(path, params=query)
        assert response.status_code == 200, response.text
        found.append(response.json())
        cursor = response.headers.get(NEXT)
        if cursor is None:
            return found
        assert len(found) < 50, "the pages never end"


def forged(kind: str, value: int, id_: str) -> str:
    return base64.urlsafe_b64encode(json.dumps([kind, value, id_]).encode()).decode().rstrip("=")


def error(response: httpx.Response) -> str:
    assert response.status_code == 400, response.text
    body = response.json()
    assert body["code"] == "invalid_request"
    message: str = body["message"]
    return message


# -- sessions ---------------------------------------------------------------------------------


def test_sessions_page_through_every_session_once_latest_first(proxy: ProxyHarness) -> None:
    sessions = [str(uuid.uuid4()) for _ in range(7)]
    with proxy.client(proxy.agent_key) as agent, proxy.client() as admin:
        for n, session in enumerate(sessions):
            call(agent, session, "echo", {"n": n}, 1)
        pages = pages_of(admin, "/sessions", limit=3)
        everything = admin.get("/sessions").json()
    assert [len(p) for p in pages] == [3, 3, 1]
    paged = [s["session_id"] for page in pages for s in page]
    assert paged == [s["session_id"] for s in everything]  # the same order, nothing twice
    assert sorted(paged) == sorted(sessions)
    assert {s["created_by"] for s in everything} == {"key:agent"}


def test_sessions_filter_by_state_and_search_the_id_the_key_and_the_tools(
    proxy: ProxyHarness,
) -> None:
    done, mailing, by_admin = (str(uuid.uuid4()) for _ in range(3))
    with proxy.client(proxy.agent_key) as agent, proxy.client() as admin:
        call(agent, done, "echo", {"n": 1}, 1)
        agent.post(f"/sessions/{done}/complete").raise_for_status()
        call(agent, mailing, "send_email", {"to": "a@example.com", "subject": "hi"}, 1)
        call(admin, by_admin, "echo", {"n": 2}, 1)

        def ids(**params: Any) -> set[str]:
            response = admin.get("/sessions", params=params)
            assert response.status_code == 200, response.text
            return {s["session_id"] for s in response.json()}

        assert ids(state="completed") == {done}
        assert ids(state="active") == {mailing, by_admin}
        assert ids(q=done[4:13].upper()) == {done}  # a piece of the id, any case
        assert ids(q="SEND_E") == {mailing}  # a tool it called
        assert ids(q="admin") == {by_admin}  # the creating key's name
        assert ids(q="agent", state="active") == {mailing}
        assert ids(q="%") == set()  # wildcards are literal
        assert ids(q="_") == {mailing}  # only `send_email` has one: `echo` has none
        assert ids(q="   ") == {done, mailing, by_admin}  # blank: no filter


@pytest.mark.parametrize(
    ("params", "says"),
    [
        ({"state": "bogus"}, "invalid state 'bogus'"),
        ({"state": ""}, "invalid state ''"),
        ({"q": "x" * 201}, "q must be at most 200 characters"),
        ({"q": "a\x00b"}, "must not contain NUL"),
        ({"cursor": "not-a-cursor"}, "cursor is not one this list handed out"),
        ({"cursor": forged("a", 1, "x")}, "cursor is not one this list handed out"),
        ({"cursor": forged("s", -1, "x")}, "cursor is not one this list handed out"),
        ({"cursor": forged("s", 2**63, "x")}, "cursor is not one this list handed out"),
        ({"limit": "many"}, "limit"),
    ],
)
def test_bad_session_parameters_are_a_400_saying_why(
    proxy: ProxyHarness, params: dict[str, str], says: str
) -> None:
    with proxy.client() as c:
        assert says in error(c.get("/sessions", params=params))


# -- approvals --------------------------------------------------------------------------------


def test_approvals_page_filter_by_tool_and_state_and_name_who_asked(proxy: ProxyHarness) -> None:
    with proxy.client(proxy.agent_key) as agent, proxy.client() as admin:
        asked = []
        for n in range(5):
            session = str(uuid.uuid4())
            call(agent, session, "echo", {"n": n}, 1)
            asked.append(call(agent, session, "delete_database", {"db_name": f"db{n}"}, 2))
        by_admin = call(admin, str(uuid.uuid4()), "publish_to_production", {"artifact": "a"}, 1)
        admin.post(f"/approvals/{asked[0]['approval_id']}/reject").raise_for_status()

        pages = pages_of(admin, "/approvals", state="all", limit=2)
        assert [len(p) for p in pages] == [2, 2, 2]
        every = [a["id"] for page in pages for a in page]
        newest_first = [by_admin["approval_id"], *(a["approval_id"] for a in reversed(asked))]
        assert every == newest_first
        pending = [a["id"] for page in pages_of(admin, "/approvals", limit=2) for a in page]
        assert pending == newest_first[:-1]  # the default stays `pending`

        deletes = admin.get("/approvals", params={"tool": "delete_database", "state": "all"})
        assert len(deletes.json()) == 5
        assert {a["requested_by"] for a in deletes.json()} == {"key:agent"}
        rejected = admin.get("/approvals", params={"state": "rejected"}).json()
        assert [a["id"] for a in rejected] == [asked[0]["approval_id"]]
        mine = admin.get(f"/approvals/{by_admin['approval_id']}").json()
        assert mine["requested_by"] == "key:admin"
        assert "recent_calls" not in mine  # only when asked for: the reference's shape


def test_an_approval_carries_its_sessions_recent_calls_when_asked(proxy: ProxyHarness) -> None:
    session = str(uuid.uuid4())
    with proxy.client(proxy.agent_key) as agent, proxy.client() as admin:
        for step in range(1, 5):
            call(agent, session, "echo", {"n": step}, step)
        pending = call(agent, session, "delete_database", {"db_name": "x"}, 5)
        listed = admin.get("/approvals", params={"recent_calls": 3}).json()
        one = admin.get(f"/approvals/{pending['approval_id']}", params={"recent_calls": 2})
    (approval,) = listed
    recent = approval["recent_calls"]
    assert [(r["step_index"], r["tool_name"]) for r in recent] == [
        (5, "delete_database"),
        (4, "echo"),
        (3, "echo"),
    ]
    assert recent[0]["state"] == "awaiting_approval"
    assert set(recent[0]) == {"effect_id", "step_index", "tool_name", "tier", "state",
                              "created_at"}  # fmt: skip
    assert [r["step_index"] for r in one.json()["recent_calls"]] == [5, 4]


@pytest.mark.parametrize(
    ("params", "says"),
    [
        ({"state": "bogus"}, "invalid state 'bogus'"),
        ({"tool": "t" * 201}, "tool must be at most 200 characters"),
        ({"recent_calls": "21"}, "recent_calls must be a whole number from 0 to 20"),
        ({"recent_calls": "-1"}, "recent_calls must be a whole number from 0 to 20"),
        ({"recent_calls": "two"}, "recent_calls must be a whole number from 0 to 20"),
        ({"cursor": forged("s", 1, "x")}, "cursor is not one this list handed out"),
        ({"cursor": "%%%"}, "cursor is not one this list handed out"),
    ],
)
def test_bad_approval_parameters_are_a_400_saying_why(
    proxy: ProxyHarness, params: dict[str, str], says: str
) -> None:
    with proxy.client() as c:
        assert says in error(c.get("/approvals", params=params))


# -- recent events ----------------------------------------------------------------------------


def test_recent_events_are_the_latest_newest_first_with_ids_to_resume_from(
    proxy: ProxyHarness,
) -> None:
    session = str(uuid.uuid4())
    with proxy.client(proxy.agent_key) as agent, proxy.client() as admin:
        for step in range(1, 4):
            call(agent, session, "echo", {"n": step}, step)
        latest = admin.get("/events/recent", params={"limit": 2}).json()
        everything = admin.get("/events/recent").json()
        of_session = admin.get("/events/recent", params={"session_id": session}).json()
        bad = [admin.get("/events/recent", params={"limit": v}) for v in ("0", "501", "x")]
    assert [e["id"] for e in latest] == [e["id"] for e in everything[:2]]
    ids = [int(e["id"]) for e in everything]
    assert ids == sorted(ids, reverse=True)
    assert set(latest[0]) == {"id", "type", "timestamp", "org_id", "session_id", "effect_id",
                              "payload"}  # fmt: skip
    assert {e["session_id"] for e in of_session} == {session}
    assert len(of_session) >= 3
    for response in bad:
        assert "limit must be a whole number from 1 to 500" in error(response)


# -- attacks ----------------------------------------------------------------------------------


@pytest.mark.security
def test_an_agent_key_pages_and_searches_its_own_sessions_only(proxy_factory: Any) -> None:
    proxy: ProxyHarness = proxy_factory()
    other_org: ProxyHarness = proxy_factory()
    mine, admins = str(uuid.uuid4()), str(uuid.uuid4())
    theirs = str(uuid.uuid4())
    with (
        proxy.client(proxy.agent_key) as agent,
        proxy.client() as admin,
        other_org.client(other_org.agent_key) as stranger,
    ):
        call(agent, mine, "echo", {"n": 1}, 1)
        call(admin, admins, "send_email", {"to": "x@example.com", "subject": "s"}, 1)
        call(stranger, theirs, "send_email", {"to": "y@example.com", "subject": "s"}, 1)
        admin_row = next(s for s in admin.get("/sessions").json() if s["session_id"] == admins)

        def seen(c: httpx.Client, **params: Any) -> set[str]:
            return {s["session_id"] for page in pages_of(c, "/sessions", **params) for s in page}

        assert seen(agent) == {mine}
        assert seen(agent, q="send_email") == set()  # the admin's session matches, unseen
        assert seen(agent, q=admins) == set()
        assert seen(agent, q="admin") == set()
        assert seen(agent, state="active", limit=1) == {mine}
        # A cursor forged to sit just before the admin's session: still only the agent's own.
        updated_us = 2**62
        for cursor in (forged("s", updated_us, ""), forged("s", 0, admins)):
            page = agent.get("/sessions", params={"cursor": cursor}).json()
            assert {s["session_id"] for s in page} <= {mine}
        assert admin_row["created_by"] == "key:admin"
        # Another org: neither its rows nor its key names, whatever the search.
        assert seen(admin, q=theirs) == set()
        assert theirs not in seen(admin)
        assert seen(stranger) == {theirs}
        assert seen(stranger, q=mine) == set()


@pytest.mark.security
def test_an_agent_key_lists_no_approvals_and_sees_only_its_own_recent_events(
    proxy_factory: Any,
) -> None:
    proxy: ProxyHarness = proxy_factory()
    other_org: ProxyHarness = proxy_factory()
    mine, admins = str(uuid.uuid4()), str(uuid.uuid4())
    with (
        proxy.client(proxy.agent_key) as agent,
        proxy.client() as admin,
        other_org.client() as stranger,
    ):
        call(agent, mine, "echo", {"n": 1}, 1)
        pending = call(admin, admins, "delete_database", {"db_name": "x"}, 1)
        call(stranger, str(uuid.uuid4()), "delete_database", {"db_name": "y"}, 1)
        for params in ({}, {"state": "all"}, {"tool": "delete_database"}):
            assert agent.get("/approvals", params=params).status_code == 403
        hidden = agent.get(f"/approvals/{pending['approval_id']}", params={"recent_calls": 5})
        assert hidden.status_code == 404
        events = agent.get("/events/recent", params={"limit": 500}).json()
        assert {e["session_id"] for e in events} == {mine}
        other = agent.get("/events/recent", params={"session_id": admins})
        assert other.status_code == 404
        assert other.json()["message"] == f"session '{admins}' not found"
        # Another org's admin: none of this org's approvals, events or sessions.
        assert pending["approval_id"] not in {
            a["id"] for a in stranger.get("/approvals", params={"state": "all"}).json()
        }
        assert stranger.get(f"/approvals/{pending['approval_id']}").status_code == 404
        assert stranger.get("/events/recent", params={"session_id": admins}).json() == []
        assert mine not in {e["session_id"] for e in stranger.get("/events/recent").json()}
