"""Roles and keys through a real proxy and a real demo upstream, on both stores.

The agent's own key cannot open the gate it is held at: it cannot approve or reject, register
or change a tool, or resolve. The decider on record is the key's name, never the body's text.
A tool whose tier the config sets keeps it. The config is the source of truth for its keys:
a key it drops stops working at the next start, a key it moves to another org leaves the old
one. Every route of the app is in the one permission table.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.proxy.conftest import ProxyHarness, make_settings, new_key, role_keys
from tests.support.servers import ThreadServer, wait_until
from undolog.config import KeyConfig, OrgConfig, ToolConfig, hash_api_key
from undolog.demo.catalog import DEMO_TOOLS
from undolog.engine.keys import Keys, Role
from undolog.proxy.roles import PERMISSIONS, route_roles
from undolog.store import open_store

pytestmark = pytest.mark.security

TOOL_CALL = "/mcp/tool_call"


def call(c: httpx.Client, tool: str, session: str, step: int = 1, **args: Any) -> httpx.Response:
    body = {"session_id": session, "tool_name": tool, "step_index": step, "args": args}
    return c.post(TOOL_CALL, json=body)


def pending_drop(c: httpx.Client, session: str | None = None, step: int = 1) -> dict[str, Any]:
    response = call(c, "delete_database", session or str(uuid.uuid4()), step, db_name="prod")
    assert response.status_code == 202, response.text
    body: dict[str, Any] = response.json()
    return body


def code(response: httpx.Response) -> str:
    value: str = response.json()["code"]
    return value


def approval(c: httpx.Client, approval_id: str) -> dict[str, Any]:
    body: dict[str, Any] = c.get(f"/approvals/{approval_id}").json()
    return body


# --- the gate --------------------------------------------------------------------------------


@pytest.mark.parametrize("action", ["approve", "reject"])
def test_an_agent_cannot_decide_its_own_pending_call(proxy: ProxyHarness, action: str) -> None:
    session = str(uuid.uuid4())
    with proxy.client(proxy.agent_key) as agent:
        pending = pending_drop(agent, session)
        refused = agent.post(f"/approvals/{pending['approval_id']}/{action}")
        assert (refused.status_code, code(refused)) == (403, "forbidden")
        assert approval(agent, pending["approval_id"])["status"] == "pending"
        # The gate still holds: the retry waits, and nothing ran upstream.
        retry = call(agent, "delete_database", session, db_name="prod")
        assert retry.status_code == 202, retry.text
    assert proxy.counters("delete_database") == {}


def test_the_decider_is_the_approvers_key_name_and_a_body_decided_by_is_refused(
    proxy: ProxyHarness,
) -> None:
    with proxy.client(proxy.agent_key) as agent, proxy.client(proxy.approver_key) as approver:
        pending = pending_drop(agent)
        path = f"/approvals/{pending['approval_id']}/approve"
        spoofed = approver.post(path, json={"decided_by": "alice@security-team"})
        assert (spoofed.status_code, code(spoofed)) == (400, "invalid_request")
        assert approval(approver, pending["approval_id"])["status"] == "pending"
        approved = approver.post(path, json={"reason": "ticket OPS-1"})
        assert approved.status_code == 200, approved.text
        record = approval(agent, pending["approval_id"])
    assert (record["status"], record["decided_by"], record["reason"]) == (
        "approved", "key:approver", "ticket OPS-1",
    )  # fmt: skip


def test_an_agent_cannot_lower_a_tools_tier_and_the_next_call_still_waits(
    proxy: ProxyHarness,
) -> None:
    with proxy.client(proxy.agent_key) as agent:
        lowered = agent.put("/tools/delete_database", json={"tier": "safe"})
        assert (lowered.status_code, code(lowered)) == (403, "forbidden")
        # Refused before its body was read: the server does not keep the connection, and
        # says so, so the client opens a new one for its next request (it got a
        # RemoteProtocolError when the body arrived after the answer).
        assert lowered.headers.get("connection") == "close"
        added = agent.put("/tools/new_tool", json={"tier": "safe"})
        assert (added.status_code, code(added)) == (403, "forbidden")
        pending_drop(agent)
        tools = {t["name"]: t["tier"] for t in agent.get("/tools").json()}
    assert tools["delete_database"] == "irreversible"
    assert "new_tool" not in tools
    assert proxy.counters("delete_database") == {}


def test_an_agent_cannot_resolve_retry_or_see_the_approval_queue(proxy: ProxyHarness) -> None:
    some_id = str(uuid.uuid4())
    with proxy.client(proxy.agent_key) as agent:
        for path in (f"/effects/{some_id}/resolve", f"/undo/{some_id}/retry",
                     f"/undo/{some_id}/resolve"):  # fmt: skip
            refused = agent.post(path, json={"outcome": "failed", "note": "x"})
            assert (refused.status_code, code(refused)) == (403, "forbidden"), path
        listing = agent.get("/approvals")
        assert (listing.status_code, code(listing)) == (403, "forbidden")


def test_an_approver_reads_and_decides_but_makes_no_tool_calls(proxy: ProxyHarness) -> None:
    session = str(uuid.uuid4())
    with proxy.client(proxy.approver_key) as approver:
        refused = call(approver, "echo", session)
        assert (refused.status_code, code(refused)) == (403, "forbidden")
        changed = approver.put("/tools/echo", json={"tier": "safe"})
        assert (changed.status_code, code(changed)) == (403, "forbidden")
        for path in ("/sessions", "/tools", "/approvals", "/overview"):
            assert approver.get(path).status_code == 200, path


def test_an_approver_rolls_back_and_undoes_and_is_recorded_as_who_asked(
    proxy: ProxyHarness,
) -> None:
    undone, rolled = str(uuid.uuid4()), str(uuid.uuid4())
    with proxy.client(proxy.agent_key) as agent, proxy.client(proxy.approver_key) as approver:
        for session in (undone, rolled):
            sent = call(agent, "send_email", session, to="ada@example.com", subject="hi")
            assert sent.status_code == 200, sent.text
        entry = approver.get(f"/sessions/{undone}").json()["undo_stack"][0]["entry_id"]
        one = approver.post(f"/sessions/{undone}/rollback", json={"entries": [entry]})
        assert (one.status_code, one.json()["outcome"]) == (200, "compensated"), one.text
        whole = approver.post(f"/sessions/{rolled}/rollback")
        assert (whole.status_code, whole.json()["outcome"]) == (200, "compensated"), whole.text
        # Retry and resolve of a compensation stay an operator's (admin) repairs.
        retry = approver.post(f"/undo/{entry}/retry")
        assert (retry.status_code, code(retry)) == (403, "forbidden")

        def asked_by(session: str, kind: str) -> list[Any]:
            events = approver.get("/events/recent", params={"session_id": session}).json()
            return [e["payload"].get("by") for e in events if e["type"] == kind]

        assert asked_by(undone, "compensation_started") == ["key:approver"]
        assert asked_by(rolled, "session_compensating") == ["key:approver"]
        assert asked_by(rolled, "compensation_started") == ["key:approver"]
    assert proxy.counters("undo_send_email") != {}


def test_an_agent_runs_its_session_end_to_end_sdk_reads_included(proxy: ProxyHarness) -> None:
    session = str(uuid.uuid4())
    with proxy.client(proxy.agent_key) as agent:
        done = call(agent, "echo", session, message="hi")
        assert done.status_code == 200, done.text
        sdk = agent.post(
            TOOL_CALL,
            json={"session_id": session, "tool_name": "send_email", "step_index": 2,
                  "args": {"to": "a@b.c"}, "mode": "sdk"},
        )  # fmt: skip
        assert sdk.status_code == 200, sdk.text
        effect_id = sdk.json()["effect_id"]
        committed = agent.post(f"/effects/{effect_id}/commit", json={"result": {"ok": True}})
        assert committed.status_code == 200, committed.text
        assert agent.get(f"/effects/{effect_id}").status_code == 200
        assert agent.get(f"/sessions/{session}").status_code == 200
        rolled = agent.post(f"/sessions/{session}/rollback")
        assert rolled.status_code != 403, rolled.text


# --- tiers the config sets -------------------------------------------------------------------


def test_a_config_tools_tier_cannot_be_changed_through_the_api(proxy_factory: Any) -> None:
    org_id = f"org-{uuid.uuid4().hex[:12]}"
    tools = (ToolConfig(org_id=org_id, name="wipe", tier="irreversible"),)
    harness: ProxyHarness = proxy_factory(tools=tools, org_id=org_id)
    with harness.client() as admin:
        changed = admin.put("/tools/wipe", json={"tier": "safe"})
        assert (changed.status_code, code(changed)) == (403, "forbidden")
        assert "config" in changed.json()["message"]
        waiting = call(admin, "wipe", str(uuid.uuid4()))
        assert waiting.status_code == 202, waiting.text
        tiers = {t["name"]: t["tier"] for t in admin.get("/tools").json()}
    assert tiers["wipe"] == "irreversible"


# --- the permission table --------------------------------------------------------------------


def test_every_route_of_the_app_is_in_the_permission_table(proxy: ProxyHarness) -> None:
    public = {"/openapi.json", "/docs", "/docs/oauth2-redirect", "/ui/login", "/ui/logout",
              "/ui/session"}  # fmt: skip
    api = proxy.server.app.fastapi if proxy.server else None
    assert api is not None
    missing = []
    for route in api.routes:
        path = getattr(route, "path", "")
        if path in public or path.startswith("/ui") or not getattr(route, "methods", None):
            continue
        for method in route.methods - {"HEAD", "OPTIONS"}:
            if (method, path) not in PERMISSIONS:
                missing.append((method, path))
    assert missing == []
    assert route_roles("POST", "/some/new/route") == frozenset({Role.ADMIN})
    assert all(Role.ADMIN in roles for roles in PERMISSIONS.values())


# --- the config is the source of truth for its keys ------------------------------------------


@pytest.fixture
def restartable(store_url: str, demo_upstream: ThreadServer) -> Iterator[Any]:
    """Start a proxy on the store with these orgs; each start stops the previous proxy."""
    from undolog.proxy import create_app

    running: list[ThreadServer] = []

    def start(*orgs: OrgConfig) -> str:
        for server in running:
            server.stop()
        running.clear()
        settings = make_settings(store_url, demo_upstream.url, orgs)
        running.append(ThreadServer(create_app(settings)).start())
        return running[0].url

    try:
        yield start
    finally:
        for server in running:
            server.stop()


def test_a_key_removed_from_the_config_stops_working_after_a_restart(
    restartable: Any,
) -> None:
    org_id, admin, dropped, legacy = f"org-{uuid.uuid4().hex[:12]}", new_key(), new_key(), new_key()
    url = restartable(
        OrgConfig(org_id=org_id, keys=role_keys(admin, agent=dropped),
                  api_key_hashes=(hash_api_key(legacy),))
    )  # fmt: skip
    for key in (admin, dropped, legacy):
        assert httpx.get(f"{url}/sessions", headers={"X-Api-Key": key}).status_code == 200
    url = restartable(OrgConfig(org_id=org_id, keys=role_keys(admin)))
    assert httpx.get(f"{url}/sessions", headers={"X-Api-Key": admin}).status_code == 200
    for key in (dropped, legacy):
        gone = httpx.get(f"{url}/sessions", headers={"X-Api-Key": key})
        assert (gone.status_code, code(gone)) == (403, "auth_failed")


def test_a_key_moved_to_another_org_no_longer_reads_the_old_one(restartable: Any) -> None:
    old_org, new_org = f"org-{uuid.uuid4().hex[:12]}", f"org-{uuid.uuid4().hex[:12]}"
    moving, admin_old, admin_new = new_key(), new_key(), new_key()
    session = str(uuid.uuid4())
    url = restartable(
        OrgConfig(org_id=old_org, keys=role_keys(admin_old, agent=moving)),
        OrgConfig(org_id=new_org, keys=role_keys(admin_new)),
    )
    with httpx.Client(base_url=url, headers={"X-Api-Key": admin_old}) as c:
        c.put("/tools/echo", json=DEMO_TOOLS["echo"]).raise_for_status()
    with httpx.Client(base_url=url, headers={"X-Api-Key": moving}) as c:
        assert call(c, "echo", session).status_code == 200
        assert c.get(f"/sessions/{session}").status_code == 200
    moved = KeyConfig(name="moved", role="agent", key_hash=hash_api_key(moving))
    url = restartable(
        OrgConfig(org_id=old_org, keys=role_keys(admin_old)),
        OrgConfig(org_id=new_org, keys=(*role_keys(admin_new), moved)),
    )
    with httpx.Client(base_url=url, headers={"X-Api-Key": moving}) as c:
        assert c.get(f"/sessions/{session}").status_code == 404
        assert c.get("/sessions").json() == []
        claimed = c.get("/sessions", headers={"X-Org-Id": old_org})
        assert (claimed.status_code, code(claimed)) == (403, "auth_failed")
    with httpx.Client(base_url=url, headers={"X-Api-Key": admin_old}) as c:
        assert c.get(f"/sessions/{session}").status_code == 200


def test_a_revoked_key_stops_within_the_cache_time_and_use_is_recorded(
    proxy: ProxyHarness,
) -> None:
    async def keys_of() -> dict[str, Any]:
        store = await open_store(proxy.database_url)
        try:
            return {k.name: k for k in await Keys(store).list(proxy.org_id)}
        finally:
            await store.close()

    async def revoke(key_id: str) -> None:
        store = await open_store(proxy.database_url)
        try:
            await Keys(store).revoke(key_id)
        finally:
            await store.close()

    with proxy.client(proxy.agent_key) as agent:
        assert agent.get("/sessions").status_code == 200
        wait_until(
            lambda: asyncio.run(keys_of())["agent"].last_used_us is not None,
            what="the agent key's last use to be recorded",
        )
        asyncio.run(revoke(asyncio.run(keys_of())["agent"].key_id))
        wait_until(
            lambda: agent.get("/sessions").status_code == 403,
            timeout=15.0,
            what="the revoked key to stop working (cache TTL 5 s)",
        )
        assert code(agent.get("/sessions")) == "auth_failed"
    assert asyncio.run(keys_of())["agent"].revoked_us is not None
