"""The store goes down under a webhook delivery and under a long wait (PostgreSQL).

PostgreSQL is cut off by a TCP forwarder between the proxy and it (tests/support/forwarder.py:
every open connection dropped, new ones closed as soon as accepted), never by stopping the
shared server. Every wait is on an event or a poll with a deadline.

- A webhook delivery whose receiver answers while the store is down cannot be marked
  delivered: the row stays claimed, then due, and once the store is back the receiver gets the
  event again (the same event id, which receivers deduplicate on) and the row is `delivered`.
  Nothing is lost.
- `GET /approvals/{id}?wait=N` while the store is down answers `503 database_error` with a
  fixed message (no database text), within the wait: the client's read timeout is N plus a
  margin, so a hang fails the test as a timeout.
"""

from __future__ import annotations

import asyncio
import threading
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import asyncpg
import httpx
import pytest

from tests.proxy.conftest import ProxyHarness, make_settings, new_key, role_keys
from tests.proxy.test_ready import pg_forwarder
from tests.proxy.test_webhooks import DEADLINE, FAST, ask_approval
from tests.support.forwarder import Forwarder
from tests.support.receiver import Receiver
from tests.support.servers import ThreadServer, await_until, wait_until
from undolog.config import OrgConfig
from undolog.proxy import create_app
from undolog.webhook_config import WebhookConfig
from undolog_sdk import call_signature

__all__ = ["pg_forwarder"]  # the fixture, used here

pytestmark = pytest.mark.postgres

# Words of the database's own error texts (tests/proxy/test_ready.py): none may reach a client.
DATABASE_WORDS = ("locking protocol", "connection", "asyncpg", "sqlite", "refused", "errno",
                  "postgres", "socket", "closed")  # fmt: skip
WAIT = 3  # seconds of `?wait=`
MARGIN = 10.0  # seconds past the wait a client reads before it calls the answer a hang


@pytest.fixture
def proxy_via(
    pg_forwarder: tuple[Forwarder, str], demo_upstream: ThreadServer, receiver: Receiver
) -> Iterator[tuple[ProxyHarness, Forwarder]]:
    """A proxy on PostgreSQL through the forwarder, with a webhook to `receiver`."""
    forwarder, url = pg_forwarder
    org_id, admin, agent, approver = f"org-{uuid.uuid4().hex[:12]}", new_key(), new_key(), new_key()
    hook = WebhookConfig("ops", receiver.url, "whsec_" + "s" * 32, "json")
    org = OrgConfig(org_id=org_id, keys=role_keys(admin, agent, approver), webhooks=(hook,))
    # A webhook attempt may take 3 s; a claim holds its row 2 * 3 + 5 s.
    settings = make_settings(url, demo_upstream.url, (org,), **(FAST | {
        "webhook_timeout_seconds": 3.0}))  # fmt: skip
    server = ThreadServer(create_app(settings), settings=settings).start()
    harness = ProxyHarness(
        server.url, demo_upstream.url, url, org_id, admin, settings, server=server,
        agent_key=agent, approver_key=approver,
    )  # fmt: skip
    try:
        harness.register_demo_tools()
        yield harness, forwarder
    finally:
        forwarder.restore()  # so the store can close cleanly
        server.stop()


def rows(proxy: ProxyHarness) -> list[dict[str, Any]]:
    with proxy.client() as c:
        response = c.get("/webhooks/deliveries")
    if response.status_code != 200:
        return []
    found: list[dict[str, Any]] = response.json()
    return found


def test_a_delivery_answered_while_the_store_is_down_is_delivered_once_it_is_back(
    proxy_via: tuple[ProxyHarness, Forwarder], receiver: Receiver
) -> None:
    proxy, forwarder = proxy_via
    receiver.hold = threading.Event()
    receiver.start()
    pending = ask_approval(proxy)
    wait_until(lambda: bool(receiver.at()), timeout=DEADLINE, what="the first POST")
    forwarder.cut()  # the receiver holds the POST: the store goes down mid-delivery
    refused_before = forwarder.refused
    receiver.hold.set()  # 200, but the sender cannot record it
    wait_until(lambda: forwarder.refused > refused_before, timeout=DEADLINE,
               what="the proxy to find the store down")  # fmt: skip
    still_down = rows(proxy)  # the admin list needs the store too
    forwarder.restore()
    wait_until(lambda: [r["state"] for r in rows(proxy)] == ["delivered"], timeout=DEADLINE,
               what="the row delivered once the store is back")  # fmt: skip

    sent = receiver.events("approval_required")
    assert {e["approval"]["approval_id"] for e in sent} == {pending["approval_id"]}
    assert len({e["id"] for e in sent}) == 1  # the same event, at least once, never another
    assert len(sent) >= 2  # answered during the outage, so sent again after it
    [row] = rows(proxy)
    assert row["attempts"] == len(sent)
    assert still_down == []


def test_a_long_wait_while_the_store_is_down_is_a_clean_503_within_the_wait(
    proxy_via: tuple[ProxyHarness, Forwarder], receiver: Receiver
) -> None:
    proxy, forwarder = proxy_via
    receiver.start()
    approval_id = ask_approval(proxy)["approval_id"]
    timeout = httpx.Timeout(10.0, read=WAIT + MARGIN)

    async def scenario() -> tuple[httpx.Response, httpx.Response]:
        headers = {"X-Api-Key": proxy.approver_key}
        async with httpx.AsyncClient(base_url=proxy.url, headers=headers, timeout=timeout) as c:
            # Down during the wait: the wait is under way, then the store goes.
            waiting = asyncio.create_task(c.get(f"/approvals/{approval_id}?wait={WAIT}"))
            waits = proxy.runtime.waits
            await await_until(lambda: waits._total == 1, within=DEADLINE,
                              what="the wait to be under way")  # fmt: skip
            await asyncio.to_thread(forwarder.cut)
            during = await waiting
            # Down before the wait: answered at once, the same way.
            before = await c.get(f"/approvals/{approval_id}?wait={WAIT}")
            return during, before

    during, before = asyncio.run(scenario())
    forwarder.restore()
    with proxy.client(proxy.approver_key) as c:
        wait_until(lambda: c.get(f"/approvals/{approval_id}").status_code == 200,
                   timeout=DEADLINE, what="the store back")  # fmt: skip
        back = c.get(f"/approvals/{approval_id}").json()

    for answer in (during, before):
        assert answer.status_code == 503, answer.text
        body = answer.json()
        assert set(body) == {"request_id", "code", "message", "timestamp", "retry_after"}, body
        assert body["code"] == "database_error"
        assert body["message"] == (
            f"The store is unavailable right now; retry shortly (request id {body['request_id']})."
        )
        assert not any(word in body["message"].lower() for word in DATABASE_WORDS)
        assert answer.headers["retry-after"] == "1"
    assert back["status"] == "pending"


def test_a_tool_call_while_the_store_is_down_names_no_database_text(
    proxy_via: tuple[ProxyHarness, Forwarder], receiver: Receiver
) -> None:
    """The engine's own failure on a call (`502 intercept_failed`, or `503 database_error`
    when the tool's lookup meets the outage first) is told in fixed words; the driver's text
    goes to the log only."""
    proxy, forwarder = proxy_via
    receiver.start()
    session_id = str(uuid.uuid4())
    with proxy.client(proxy.agent_key) as c:
        first = {"session_id": session_id, "tool_name": "echo", "step_index": 1, "args": {}}
        assert c.post("/mcp/tool_call", json=first).status_code == 200  # the tool is cached
        forwarder.cut()
        answers = [
            c.post("/mcp/tool_call", json=first | {"step_index": step, "args": {"n": step}})
            for step in (2, 3)
        ]
    forwarder.restore()

    for answer in answers:
        body = answer.json()
        assert (answer.status_code, body["code"]) in {
            (502, "intercept_failed"), (503, "database_error")
        }, answer.text  # fmt: skip
        assert not any(word in body["message"].lower() for word in DATABASE_WORDS), body


def _effects_of(database_url: str, org_id: str, session_id: str) -> list[dict[str, Any]]:
    """The session's effects, read straight from PostgreSQL (not through the forwarder)."""

    async def read() -> list[dict[str, Any]]:
        conn = await asyncpg.connect(database_url)
        try:
            rows = await conn.fetch(
                "SELECT effect_id, state, attempts, error FROM effects "
                "WHERE org_id = $1 AND session_id = $2",
                org_id,
                session_id,
            )
        finally:
            await conn.close()
        return [dict(row) for row in rows]

    return asyncio.run(read())


def test_an_intent_whose_answer_was_lost_is_failed_once_the_store_is_back_not_in_doubt(
    proxy_via: tuple[ProxyHarness, Forwarder], pg_url: str
) -> None:
    """The intent commits but the connection drops before its answer comes back: the proxy
    never sent the call upstream, so once the store answers again it records the call as not
    run (`failed`, with the reason), and the agent's retry runs it, once. Nothing is left in
    doubt for an operator."""
    proxy, forwarder = proxy_via
    session_id = str(uuid.uuid4())
    body = {"session_id": session_id, "tool_name": "slow", "step_index": 1,
            "args": {"seconds": 0}}  # fmt: skip
    signature = call_signature(session_id, 1, "slow", body["args"])
    with proxy.client() as c, ThreadPoolExecutor(1) as pool:
        forwarder.mute_after(signature.encode())  # the intent's own statement, then silence
        pending = pool.submit(c.post, "/mcp/tool_call", json=body)
        wait_until(
            lambda: (
                [e["state"] for e in _effects_of(pg_url, proxy.org_id, session_id)] == ["executing"]
            ),
            what="the intent to commit",
        )
        forwarder.cut()
        answer = pending.result(timeout=60)
        forwarder.restore()
        assert answer.status_code in (502, 503), answer.text
        (effect,) = _effects_of(pg_url, proxy.org_id, session_id)
        wait_until(
            lambda: _effects_of(pg_url, proxy.org_id, session_id)[0]["state"] == "failed",
            what="the proxy to record the call as not run",
        )
        (failed,) = _effects_of(pg_url, proxy.org_id, session_id)
        assert "never" in failed["error"]
        retry = c.post("/mcp/tool_call", json=body)
    assert retry.status_code == 200, retry.text
    assert retry.json()["status"] == "executed"
    assert proxy.counters("slow") == {effect["effect_id"]: 1}


BATCH_CALLS = 16


def test_a_connection_lost_under_an_intent_batch_leaves_nothing_in_doubt_that_never_ran(
    proxy_via: tuple[ProxyHarness, Forwarder], pg_url: str
) -> None:
    """16 new calls at once, so that their intents go to PostgreSQL in shared statements
    (group commit); the connection goes silent right after one of those statements is sent
    (it may have committed: the proxy cannot know), then is cut. No call the proxy never sent
    upstream may be left in doubt: each is recorded as not run (`failed`) once the store is
    back, or committed if it did run; every retry then ends with a result, and every tool ran
    exactly once."""
    proxy, forwarder = proxy_via
    bodies = [
        {"session_id": str(uuid.uuid4()), "tool_name": "slow", "step_index": 1,
         "args": {"seconds": 0}}
        for _ in range(BATCH_CALLS)
    ]  # fmt: skip
    marked = bodies[BATCH_CALLS // 2]
    forwarder.mute_after(call_signature(marked["session_id"], 1, "slow", {"seconds": 0}).encode())
    limits = httpx.Limits(max_connections=BATCH_CALLS, max_keepalive_connections=BATCH_CALLS)
    with proxy.client(limits=limits) as c, ThreadPoolExecutor(BATCH_CALLS) as pool:
        pending = [pool.submit(c.post, "/mcp/tool_call", json=body) for body in bodies]
        wait_until(
            lambda: bool(_effects_of(pg_url, proxy.org_id, marked["session_id"])),
            what="the marked intent to commit",
        )
        forwarder.cut()
        answers = [p.result(timeout=60) for p in pending]
        forwarder.restore()

        def states() -> list[str]:
            return [e["state"] for b in bodies
                    for e in _effects_of(pg_url, proxy.org_id, b["session_id"])]  # fmt: skip

        wait_until(
            lambda: set(states()) <= {"committed", "failed"},
            what="every effect to be committed or recorded as not run",
        )
        settled = states()
        [marked_effect] = _effects_of(pg_url, proxy.org_id, marked["session_id"])
        retries = [c.post("/mcp/tool_call", json=body) for body in bodies]
    for answer in answers:  # a 200 said before the cut; otherwise a clean error
        assert answer.status_code in (200, 502, 503), answer.text
    assert "in_doubt" not in settled
    # The marked intent committed and its answer never came: it is the one surely not run.
    assert marked_effect["state"] == "failed" and "never" in marked_effect["error"]
    assert [r.status_code for r in retries] == [200] * BATCH_CALLS, [r.text for r in retries]
    counters = proxy.counters("slow")
    assert sorted(counters.values()) == [1] * BATCH_CALLS
    assert {r.json()["effect_id"] for r in retries} == set(counters)
