"""Session owners through a real proxy and a real demo upstream, on both stores.

A session belongs to the key whose call created it. Two `agent` keys of one org, A and B:
B cannot list, read, roll back or complete A's session, read A's effects or approvals, commit
or fail A's SDK-run effect, claim or report A's SDK compensation, call a tool in A's session
(not even a replay of A's call), or see A's events on the stream, live or on resume. What B
is refused answers exactly like a missing thing, so B cannot probe. A does all of it, and
approver and admin keys see the whole org, including sessions from before owners were kept.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from tests.proxy.conftest import ProxyHarness, make_settings, new_key, role_keys
from tests.support.servers import ThreadServer
from tests.support.sse import EventStream, SseEvent
from undolog.config import KeyConfig, OrgConfig, hash_api_key
from undolog.engine.model import ORG_WIDE, Actor
from undolog.proxy.owners import EventFilter
from undolog.store import EventRecord, Queries, Store, open_store

pytestmark = pytest.mark.security

TOOL_CALL = "/mcp/tool_call"
LOCAL = {"tier": "compensable", "compensation": {"fn_name": "undo_local", "max_retries": 1}}


@dataclass
class Org:
    proxy: ProxyHarness
    agent_a: str
    agent_b: str

    def a(self) -> httpx.Client:
        return self.proxy.client(self.agent_a)

    def b(self) -> httpx.Client:
        return self.proxy.client(self.agent_b)


@pytest.fixture
def org(store_url: str, demo_upstream: ThreadServer) -> Iterator[Org]:
    """A proxy whose org has an admin, an approver and two agent keys (A and B)."""
    from undolog.proxy import create_app

    org_id, admin, approver, agent_a, agent_b = (
        f"org-{uuid.uuid4().hex[:12]}",
        *(new_key() for _ in range(4)),
    )
    keys = (
        *role_keys(admin, approver=approver),
        KeyConfig(name="agent-a", role="agent", key_hash=hash_api_key(agent_a)),
        KeyConfig(name="agent-b", role="agent", key_hash=hash_api_key(agent_b)),
    )
    settings = make_settings(store_url, demo_upstream.url, (OrgConfig(org_id=org_id, keys=keys),))
    server = ThreadServer(create_app(settings), settings=settings).start()
    try:
        harness = ProxyHarness(
            server.url,
            demo_upstream.url,
            store_url,
            org_id,
            admin,
            settings,
            server=server,
            agent_key=agent_a,
            approver_key=approver,
        )
        harness.register_demo_tools()
        with harness.client() as admin_client:
            admin_client.put("/tools/local_write", json=LOCAL).raise_for_status()
        yield Org(harness, agent_a, agent_b)
    finally:
        server.stop()


def call(
    c: httpx.Client, session: str, tool: str, step: int | None = 1, **extra: Any
) -> httpx.Response:
    body: dict[str, Any] = {"session_id": session, "tool_name": tool, "args": extra.pop("args", {})}
    if step is not None:
        body["step_index"] = step
    return c.post(TOOL_CALL, json={**body, **extra})


def run(c: httpx.Client, session: str, tool: str, step: int | None = 1, **extra: Any) -> str:
    """A call that must be answered 2xx; its effect id."""
    response = call(c, session, tool, step, **extra)
    assert response.status_code in (200, 202), response.text
    effect_id: str = response.json()["effect_id"]
    return effect_id


@dataclass
class Session:
    """An agent's session with one of each thing: a proxy-run effect, a pending approval, an
    SDK-run effect still executing."""

    id: str
    effect: str
    approval: str
    sdk_effect: str


def busy_session(c: httpx.Client) -> Session:
    session = str(uuid.uuid4())
    effect = run(c, session, "echo", 1, args={"t": "a"})
    pending = call(c, session, "delete_database", 2, args={"db_name": "prod"})
    assert pending.status_code == 202, pending.text
    sdk = run(c, session, "local_write", 3, args={"n": 3}, mode="sdk")
    return Session(session, effect, pending.json()["approval_id"], sdk)


def view(c: httpx.Client, session: str) -> dict[str, Any]:
    response = c.get(f"/sessions/{session}")
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


def like_missing(
    refused: httpx.Response, missing: httpx.Response, real_id: str, missing_id: str
) -> None:
    """`refused` (about `real_id`) is word for word the 404 of the missing `missing_id`."""
    assert missing.status_code == 404, missing.text
    assert refused.status_code == 404, refused.text
    assert refused.json()["code"] == missing.json()["code"] == "not_found"
    assert refused.json()["message"] == missing.json()["message"].replace(missing_id, real_id)
    assert set(refused.json()) == set(missing.json())


def store_do(proxy: ProxyHarness, action: Any) -> Any:
    """Run `action(q)` in a transaction on the proxy's store, from the test."""

    async def go() -> Any:
        store = await open_store(proxy.database_url)
        try:
            async with store.transaction() as q:
                return await action(q)
        finally:
            await store.close()

    return asyncio.run(go())


# --- reads -------------------------------------------------------------------------------------


def test_each_agent_lists_its_own_sessions_and_approver_and_admin_list_all(org: Org) -> None:
    mine, theirs = str(uuid.uuid4()), str(uuid.uuid4())
    with org.a() as a, org.b() as b:
        run(a, mine, "echo")
        run(b, theirs, "echo")
        listed_a = {s["session_id"] for s in a.get("/sessions").json()}
        listed_b = {s["session_id"] for s in b.get("/sessions").json()}
    assert (listed_a, listed_b) == ({mine}, {theirs})
    for key in (org.proxy.api_key, org.proxy.approver_key):
        with org.proxy.client(key) as c:
            assert {s["session_id"] for s in c.get("/sessions").json()} == {mine, theirs}


def test_another_agents_session_effects_and_approvals_read_as_missing(org: Org) -> None:
    missing = str(uuid.uuid4())
    with org.a() as a:
        s = busy_session(a)
    with org.b() as b:
        pairs = [
            ("/sessions/{}", s.id),
            ("/effects/{}", s.effect),
            ("/effects/{}", s.sdk_effect),
            ("/approvals/{}", s.approval),
        ]
        for template, real in pairs:
            like_missing(
                b.get(template.format(real)), b.get(template.format(missing)), real, missing
            )
    with org.a() as a:
        assert a.get(f"/effects/{s.effect}").status_code == 200
        assert a.get(f"/approvals/{s.approval}").status_code == 200
        body = view(a, s.id)
    assert {s.effect, s.sdk_effect} <= {e["effect_id"] for e in body["effects"]}
    for key in (org.proxy.api_key, org.proxy.approver_key):
        with org.proxy.client(key) as c:
            assert view(c, s.id)["state"] == "active"
            assert c.get(f"/effects/{s.sdk_effect}").status_code == 200
            assert c.get(f"/approvals/{s.approval}").status_code == 200


# --- writes ------------------------------------------------------------------------------------


def test_another_agent_cannot_roll_back_complete_commit_or_fail_and_nothing_changes(
    org: Org,
) -> None:
    missing = str(uuid.uuid4())
    with org.a() as a:
        s = busy_session(a)
        before = view(a, s.id)
    with org.b() as b:
        for path in ("/sessions/{}/rollback", "/sessions/{}/complete"):
            like_missing(b.post(path.format(s.id)), b.post(path.format(missing)), s.id, missing)
        reports = [("commit", {"result": {"forged": True}}), ("fail", {"error": "forged"})]
        for action, body in reports:
            refused = b.post(f"/effects/{s.sdk_effect}/{action}", json=body)
            absent = b.post(f"/effects/{missing}/{action}", json=body)
            like_missing(refused, absent, s.sdk_effect, missing)
    with org.a() as a:
        after = view(a, s.id)
        assert after == before
        assert a.get(f"/effects/{s.sdk_effect}").json()["state"] == "executing"
        committed = a.post(f"/effects/{s.sdk_effect}/commit", json={"result": {"row": 3}})
        assert committed.status_code == 200, committed.text
        done = a.post(f"/sessions/{s.id}/complete")
        assert done.status_code == 200, done.text


def test_another_agent_cannot_claim_or_report_an_sdk_compensation(org: Org) -> None:
    missing = str(uuid.uuid4())
    session = str(uuid.uuid4())
    with org.a() as a:
        local = run(a, session, "local_write", 1, args={"n": 1}, mode="sdk")
        assert a.post(f"/effects/{local}/commit", json={"result": {"row": 1}}).status_code == 200
        waiting = a.post(f"/sessions/{session}/rollback")
        assert waiting.json()["outcome"] == "waiting_for_runner", waiting.text
        entry = waiting.json()["next_entry"]["entry_id"]
    with org.b() as b:
        like_missing(
            b.post(f"/undo/{entry}/claim"), b.post(f"/undo/{missing}/claim"), entry, missing
        )
    with org.a() as a:
        claimed = a.post(f"/undo/{entry}/claim")
        assert claimed.status_code == 200, claimed.text
        token = claimed.json()["claim_token"]
    with org.b() as b:  # even holding A's claim token, B cannot report on A's entry
        reports = [
            ("complete", {"claim_token": token}),
            ("fail", {"claim_token": token, "error": "x"}),
        ]
        for action, body in reports:
            refused = b.post(f"/undo/{entry}/{action}", json=body)
            absent = b.post(f"/undo/{missing}/{action}", json=body)
            like_missing(refused, absent, entry, missing)
    with org.a() as a:
        [held] = [u for u in view(a, session)["undo_stack"] if u["entry_id"] == entry]
        assert held["state"] == "running"
        done = a.post(f"/undo/{entry}/complete", json={"claim_token": token})
        assert done.status_code == 200, done.text
        assert a.post(f"/sessions/{session}/rollback").json()["outcome"] == "compensated"


# --- tool calls --------------------------------------------------------------------------------


@pytest.mark.parametrize("step", [1, None], ids=["numbered", "step-less"])
def test_another_agent_cannot_call_a_tool_in_a_session_not_even_a_replay(
    org: Org, step: int | None
) -> None:
    session = str(uuid.uuid4())
    with org.a() as a:
        first = call(a, session, "echo", step, args={"t": "secret"})
        assert first.status_code == 200, first.text
        before = view(a, session)
    with org.b() as b:
        attempts = [
            call(b, session, "echo", step, args={"t": "secret"}),  # A's call: a replay for A
            call(b, session, "echo", 2 if step else None, args={"t": "new"}),
            call(b, session, "send_email", 7 if step else None, args={"to": "x@y.z"}),
            call(b, session, "delete_database", 8 if step else None, args={"db_name": "x"}),
            call(b, session, "search_web", step, args={"query": "q"}),  # SAFE: nothing logged
            call(b, session, "local_write", 9 if step else None, args={"n": 9}, mode="sdk"),
        ]
    for refused in attempts:
        assert (refused.status_code, refused.json()["code"]) == (403, "forbidden"), refused.text
        assert "secret" not in refused.text
    with org.a() as a:
        assert view(a, session) == before
    assert sum(org.proxy.counters("echo").values()) == 1
    assert org.proxy.counters("send_email") == {}


def test_an_admin_may_call_in_an_agents_session_which_stays_the_agents(org: Org) -> None:
    session = str(uuid.uuid4())
    with org.a() as a:
        run(a, session, "echo", 1)
    with org.proxy.client() as admin:
        run(admin, session, "echo", 2)
    with org.a() as a:  # still A's session
        assert len(view(a, session)["effects"]) == 2
        run(a, session, "echo", 3)


def test_a_session_without_owner_is_for_approver_and_admin_only(org: Org) -> None:
    session = str(uuid.uuid4())
    with org.a() as a:
        s = busy_session(a)
        run(a, session, "echo", 1)

    async def forget_owners(q: Queries) -> int:  # as a session from before migration 9
        return await q._execute(
            "UPDATE sessions SET owner_key_id = NULL WHERE org_id = ?", org.proxy.org_id
        )

    assert store_do(org.proxy, forget_owners) == 2
    missing = str(uuid.uuid4())
    with org.a() as a:
        assert a.get("/sessions").json() == []
        like_missing(a.get(f"/sessions/{s.id}"), a.get(f"/sessions/{missing}"), s.id, missing)
        like_missing(a.get(f"/effects/{s.effect}"), a.get(f"/effects/{missing}"), s.effect, missing)
        refused = call(a, session, "echo", 2)
        assert (refused.status_code, refused.json()["code"]) == (403, "forbidden")
    for key in (org.proxy.api_key, org.proxy.approver_key):
        with org.proxy.client(key) as c:
            assert {x["session_id"] for x in c.get("/sessions").json()} == {s.id, session}
            assert c.get(f"/approvals/{s.approval}").status_code == 200
    with org.proxy.client() as admin:
        run(admin, session, "echo", 2)


# --- events ------------------------------------------------------------------------------------


async def _events_of_b_while_both_work(org: Org, headers: dict[str, str]) -> list[SseEvent]:
    """B's stream while A and B each make a call; up to B's own `effect_committed`."""
    mine, theirs = str(uuid.uuid4()), str(uuid.uuid4())
    proxy = org.proxy
    async with (
        proxy.async_client(org.agent_b) as b,
        proxy.async_client(org.agent_a) as a,
        EventStream(b, headers=headers) as stream,
    ):
        for client, session in ((a, theirs), (b, mine)):
            body = {"session_id": session, "tool_name": "echo", "step_index": 1, "args": {}}
            assert (await client.post(TOOL_CALL, json=body)).status_code == 200
        seen = await stream.until("effect_committed")
    assert {e.json["session_id"] for e in seen} == {mine}
    return seen


async def test_an_agents_live_stream_carries_only_its_own_sessions_events(org: Org) -> None:
    seen = await _events_of_b_while_both_work(org, {})
    assert [e.event for e in seen] == ["effect_intercepted", "effect_committed"]


async def test_an_agent_resuming_its_stream_replays_only_its_own_sessions_events(
    org: Org,
) -> None:
    theirs = str(uuid.uuid4())
    async with org.proxy.async_client(org.agent_a) as a:
        body = {"session_id": theirs, "tool_name": "echo", "step_index": 1, "args": {}}
        assert (await a.post(TOOL_CALL, json=body)).status_code == 200
    # From the start: A's history is skipped, B's own call is the first thing B gets.
    seen = await _events_of_b_while_both_work(org, {"Last-Event-ID": "0"})
    assert [e.event for e in seen] == ["effect_intercepted", "effect_committed"]
    async with (
        org.proxy.async_client(org.agent_b) as b,
        EventStream(b, headers={"Last-Event-ID": "0"}) as replay,
    ):
        again = await replay.take(2)
    assert [e.json["session_id"] for e in again] == [seen[0].json["session_id"]] * 2
    async with (  # the admin's replay has everyone's
        org.proxy.async_client() as admin,
        EventStream(admin, headers={"Last-Event-ID": "0"}) as everyone,
    ):
        sessions = {e.json["session_id"] for e in await everyone.take(6)}
    assert theirs in sessions and len(sessions) == 3


@pytest.mark.parametrize("store_url", ["postgres"], indirect=True)
async def test_an_agents_stream_on_one_proxy_filters_events_another_proxy_wrote(
    org: Org,
) -> None:
    """Events of another process reach the broker by LISTEN/NOTIFY; the filter is the
    stream's, so they are held to the same rule."""
    from undolog.proxy import create_app

    settings = org.proxy.settings
    other = ThreadServer(create_app(settings), settings=settings).start()
    try:
        mine, theirs = str(uuid.uuid4()), str(uuid.uuid4())
        async with (
            org.proxy.async_client(org.agent_b) as b_here,
            httpx.AsyncClient(base_url=other.url, headers={"X-Api-Key": org.agent_a}) as a,
            httpx.AsyncClient(base_url=other.url, headers={"X-Api-Key": org.agent_b}) as b,
            EventStream(b_here) as stream,
        ):
            for client, session in ((a, theirs), (b, mine)):
                body = {"session_id": session, "tool_name": "echo", "step_index": 1, "args": {}}
                assert (await client.post(TOOL_CALL, json=body)).status_code == 200
            seen = await stream.until("effect_committed")
    finally:
        other.stop()
    assert [(e.event, e.json["session_id"]) for e in seen] == [
        ("effect_intercepted", mine),
        ("effect_committed", mine),
    ]


async def test_the_event_filter_passes_an_agent_its_own_sessions_events_only(
    store: Store, org_id: str
) -> None:
    mine, theirs, ownerless, later = (str(uuid.uuid4()) for _ in range(4))
    async with store.transaction() as q:
        await q.touch_session(org_id, mine, 1, 1, "key-a")
        await q.touch_session(org_id, theirs, 1, 1, "key-b")
        await q.touch_session(org_id, ownerless, 1, 1)

    def event(session: str | None) -> EventRecord:
        return EventRecord(1, org_id, "effect_intercepted", session, None, "{}", 1)

    agent = EventFilter(store, org_id, Actor("key-a", own_sessions_only=True))
    everyone = EventFilter(store, org_id, ORG_WIDE)
    cases = {mine: True, theirs: False, ownerless: False, None: False, later: False}
    for session, expected in cases.items():
        assert await agent.delivers(event(session)) is expected, session
        assert await everyone.delivers(event(session)) is True
    # A session not there yet is not remembered as hidden: once it is A's, A gets its events.
    async with store.transaction() as q:
        await q.touch_session(org_id, later, 1, 2, "key-a")
    assert await agent.delivers(event(later)) is True
