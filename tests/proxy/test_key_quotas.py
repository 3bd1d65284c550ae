"""Quotas of valid keys (issue 22), through the app in process on both stores: tool calls and
new sessions per key (a token bucket each), open event streams per key, each refused with
`429 rate_limited`, `Retry-After` and the quota's name, while the org's other keys go on.

The tool calls run in SDK mode (the proxy records them and answers `execute`), so no tool
server is needed. Refills are set slow (a call token per 100 s, a session token per 20 s) so
that none comes while a test runs.
"""

from __future__ import annotations

import contextlib
import uuid
from typing import Any

import httpx
import pytest

from tests.proxy.conftest import make_settings, new_key
from tests.support.asgi import HeldResponse, held_get, in_process
from undolog.config import (
    DEFAULT_KEY_EVENT_STREAMS,
    DEFAULT_KEY_SESSIONS_PER_MINUTE,
    KeyConfig,
    OrgConfig,
    Settings,
    ToolConfig,
    hash_api_key,
)

pytestmark = pytest.mark.security

TOOL_CALL = "/mcp/tool_call"
SLOW_REFILL_PER_SECOND = 0.01  # one call token per 100 s


class Org:
    """An org with two agent keys, an approver key and an admin key."""

    def __init__(self) -> None:
        self.org_id = f"org-{uuid.uuid4().hex[:12]}"
        self.agent, self.other_agent = new_key(), new_key()
        self.approver, self.admin = new_key(), new_key()

    def config(self) -> OrgConfig:
        keys = (
            ("agent-1", "agent", self.agent),
            ("agent-2", "agent", self.other_agent),
            ("approver", "approver", self.approver),
            ("admin", "admin", self.admin),
        )
        return OrgConfig(
            org_id=self.org_id,
            keys=tuple(KeyConfig(n, r, hash_api_key(k)) for n, r, k in keys),
        )

    def settings(self, store_url: str, **quotas: Any) -> Settings:
        tool = ToolConfig(self.org_id, "note", "compensable", compensation={"fn_name": "unnote"})
        return make_settings(
            store_url, "http://127.0.0.1:9", (self.config(),), tools=(tool,), **quotas
        )


def note(session: str, step: int = 1) -> dict[str, Any]:
    """A COMPENSABLE call the SDK runs itself: recorded, answered `execute`."""
    return {
        "session_id": session,
        "tool_name": "note",
        "step_index": step,
        "args": {"n": step},
        "mode": "sdk",
    }


def new_session() -> str:
    return str(uuid.uuid4())


def new_sessions(count: int) -> list[str]:
    return [new_session() for _ in range(count)]


def assert_over_quota(response: httpx.Response | HeldResponse, quota: str) -> None:
    """A 429 in the error format, naming `quota`, with `Retry-After` as in the body."""
    if isinstance(response, httpx.Response):
        assert response.status_code == 429, response.text
    else:
        assert response.status == 429, response.body
    body = response.json()
    assert body["code"] == "rate_limited"
    assert body["quota"] == quota
    assert set(body) >= {"request_id", "code", "message", "timestamp", "retry_after"}
    assert body["retry_after"] >= 1
    assert response.headers["retry-after"] == str(body["retry_after"])


# --- new sessions --------------------------------------------------------------------------


async def test_one_agent_key_opening_many_sessions_is_refused_while_other_keys_go_on(
    store_url: str,
) -> None:
    org = Org()
    settings = org.settings(store_url, key_sessions_per_minute=3)
    async with in_process(settings) as running, running.client(org.agent) as agent:
        first = new_session()
        opened = [await agent.post(TOOL_CALL, json=note(s)) for s in (first, *new_sessions(2))]
        assert [r.status_code for r in opened] == [200, 200, 200], opened[-1].text
        refused = await agent.post(TOOL_CALL, json=note(new_session()))
        assert_over_quota(refused, "new_sessions")
        assert "session" in refused.json()["message"]
        # The key's sessions still take calls: only new ones are refused.
        more = await agent.post(TOOL_CALL, json=note(first, step=2))
        assert more.status_code == 200, more.text
        async with running.client(org.other_agent) as other:
            fresh = await other.post(TOOL_CALL, json=note(new_session()))
        assert fresh.status_code == 200, fresh.text
        # Nothing was written for the refused session.
        async with running.client(org.admin) as admin:
            listed = (await admin.get("/sessions")).json()
        assert len(listed) == 4


async def test_with_the_defaults_a_flood_of_new_sessions_stops_after_the_quota(
    store_url: str,
) -> None:
    """The attack as measured (one key, 1,500 sessions in 6 s): the first 120 open, then 2 a
    second come back, so a refusal comes within a few more."""
    org = Org()
    async with in_process(org.settings(store_url)) as running, running.client(org.agent) as agent:
        statuses = []
        while 429 not in statuses and len(statuses) < 2 * DEFAULT_KEY_SESSIONS_PER_MINUTE:
            statuses.append((await agent.post(TOOL_CALL, json=note(new_session()))).status_code)
        assert statuses[:DEFAULT_KEY_SESSIONS_PER_MINUTE] == [200] * DEFAULT_KEY_SESSIONS_PER_MINUTE
        assert statuses[-1] == 429, f"{len(statuses)} new sessions without a refusal"


async def test_a_session_another_process_opened_is_not_new_to_this_one(store_url: str) -> None:
    """Processes count on their own: a session this one has not seen may exist already
    (another worker, a restart). Once the key's new-session tokens are spent, the store says
    whether it does; an existing session is never refused."""
    org = Org()
    settings = org.settings(store_url, key_sessions_per_minute=2)
    elsewhere = new_session()
    async with in_process(settings) as first, first.client(org.agent) as agent:
        assert (await agent.post(TOOL_CALL, json=note(elsewhere))).status_code == 200
    async with in_process(settings) as second, second.client(org.agent) as agent:
        for _ in range(2):
            assert (await agent.post(TOOL_CALL, json=note(new_session()))).status_code == 200
        assert_over_quota(await agent.post(TOOL_CALL, json=note(new_session())), "new_sessions")
        known = await agent.post(TOOL_CALL, json=note(elsewhere, step=2))
        assert known.status_code == 200, known.text


# --- calls ---------------------------------------------------------------------------------


async def test_a_key_over_its_call_quota_is_refused_and_the_orgs_other_keys_are_not(
    store_url: str,
) -> None:
    org = Org()
    settings = org.settings(
        store_url, key_calls_per_second=SLOW_REFILL_PER_SECOND, key_call_burst=4
    )
    session = new_session()
    async with in_process(settings) as running, running.client(org.agent) as agent:
        answers = [await agent.post(TOOL_CALL, json=note(session, s)) for s in range(1, 5)]
        assert [a.status_code for a in answers] == [200] * 4
        refused = await agent.post(TOOL_CALL, json=note(session, 5))
        assert_over_quota(refused, "calls")
        assert refused.json()["retry_after"] <= 100
        async with running.client(org.other_agent) as other:
            ok = await other.post(TOOL_CALL, json=note(new_session()))
        assert ok.status_code == 200, ok.text
        # The refused call was not recorded: with a token it runs as step 5.
        async with running.client(org.admin) as admin:
            shown = (await admin.get(f"/sessions/{session}")).json()
        assert [e["step_index"] for e in shown["effects"]] == [1, 2, 3, 4]


# --- event streams -------------------------------------------------------------------------


async def test_one_agent_key_cannot_take_all_of_its_orgs_event_streams(store_url: str) -> None:
    """With the defaults: an org holds 100 streams, a key 10 of them."""
    org = Org()
    async with in_process(org.settings(store_url)) as running:
        assert running.runtime.broker.max_per_org == 100
        async with contextlib.AsyncExitStack() as streams:
            opened = [
                await streams.enter_async_context(held_get(running, "/events", org.agent))
                for _ in range(DEFAULT_KEY_EVENT_STREAMS + 1)
            ]
            assert [s.status for s in opened[:-1]] == [200] * DEFAULT_KEY_EVENT_STREAMS
            assert_over_quota(opened[-1], "event_streams")
            async with held_get(running, "/events", org.approver) as dashboard:
                assert dashboard.status == 200
                assert dashboard.headers["content-type"].startswith("text/event-stream")
            async with held_get(running, "/events", org.other_agent) as other:
                assert other.status == 200
        # Closed streams are given back.
        async with held_get(running, "/events", org.agent) as again:
            assert again.status == 200


async def test_agent_keys_together_leave_a_quarter_of_the_orgs_streams_to_people(
    store_url: str,
) -> None:
    org = Org()
    settings = org.settings(store_url, key_event_streams=2)
    async with in_process(settings) as running:
        running.runtime.broker.max_per_org = 4  # agents together: 3
        async with (
            held_get(running, "/events", org.agent) as a1,
            held_get(running, "/events", org.agent) as a2,
            held_get(running, "/events", org.other_agent) as b1,
            held_get(running, "/events", org.other_agent) as b2,
        ):
            assert [a1.status, a2.status, b1.status] == [200, 200, 200]
            assert_over_quota(b2, "event_streams")
            assert "approvers" in b2.json()["message"]
            async with held_get(running, "/events", org.approver) as dashboard:
                assert dashboard.status == 200
                async with held_get(running, "/events", org.admin) as full:
                    assert full.status == 429
                    assert full.json()["code"] == "too_many_subscribers"
                    assert full.headers["retry-after"] == str(full.json()["retry_after"])
