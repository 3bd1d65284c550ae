"""`GET /events` through a real proxy, on both stores: the live event stream (SSE).

The wire format of the REST reference, resuming from `Last-Event-ID` (header or query
parameter) without gaps or duplicates, then live; resuming across a kill -9 of the proxy;
tenancy; the bounded queue of a slow subscriber and its metrics; the `: ping` heartbeat.
Events are read by a background task (`tests.support.sse.EventStream`) and waited for with
deadlines.
"""

from __future__ import annotations

import datetime as dt
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.proxy.conftest import METRICS_AUTH, ProxyHarness, spawn_proxy, write_org_config
from tests.support.servers import ProcessServer, ThreadServer, await_until
from tests.support.sse import EventStream, SseEvent
from undolog.demo.catalog import DEMO_TOOLS
from undolog.store import open_store

TOOL_CALL = "/mcp/tool_call"
REFERENCE_TYPES = {
    "effect_intercepted", "effect_committed", "effect_replayed", "effect_failed",
    "approval_required", "approval_approved", "approval_rejected",
}  # fmt: skip
DATA_KEYS = {"type", "timestamp", "org_id", "session_id", "effect_id", "payload"}


def new_session() -> str:
    return str(uuid.uuid4())


async def echo(c: httpx.AsyncClient, session: str, step: int, text: str = "hi") -> str:
    """A COMPENSABLE call run by the proxy: two events (intercepted, committed)."""
    body = {"session_id": session, "tool_name": "echo", "step_index": step, "args": {"t": text}}
    response = await c.post(TOOL_CALL, json=body)
    assert response.status_code == 200, response.text
    effect_id: str = response.json()["effect_id"]
    return effect_id


async def drop_db(c: httpx.AsyncClient, session: str, step: int = 1) -> httpx.Response:
    body = {"session_id": session, "tool_name": "delete_database", "step_index": step,
            "args": {"db_name": f"db-{step}"}}  # fmt: skip
    return await c.post(TOOL_CALL, json=body)


async def everything(client: httpx.AsyncClient, count: int) -> list[SseEvent]:
    """The org's first `count` events, replayed from the start."""
    async with EventStream(client, headers={"Last-Event-ID": "0"}) as stream:
        return await stream.take(count)


def metric(url: str, name: str, **labels: str) -> float:
    text = httpx.get(f"{url}/metrics", headers=METRICS_AUTH, timeout=10).text
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and dict(sample.labels) == labels:
                return float(sample.value)
    return 0.0


# --- format --------------------------------------------------------------------------------


async def test_each_lifecycle_step_is_an_event_in_the_reference_format(
    proxy: ProxyHarness,
) -> None:
    session = new_session()
    async with proxy.async_client() as c, EventStream(c) as stream:
        assert stream.response is not None
        assert stream.response.headers["content-type"].startswith("text/event-stream")
        assert stream.response.headers["cache-control"] == "no-cache"
        effect_id = await echo(c, session, 1)
        await echo(c, session, 1)  # a retry: replayed
        pending = (await drop_db(c, session, 2)).json()
        await c.post(f"/approvals/{pending['approval_id']}/approve")
        rejected = (await drop_db(c, session, 3)).json()
        await c.post(f"/approvals/{rejected['approval_id']}/reject", json={"reason": "no"})
        events = await stream.until("approval_rejected")
    assert [e.event for e in events] == [
        "effect_intercepted", "effect_committed", "effect_replayed",
        "approval_required", "approval_approved", "effect_intercepted", "effect_committed",
        "approval_required", "approval_rejected",
    ]  # fmt: skip
    ids = [e.number for e in events]
    assert ids == sorted(ids) and len(set(ids)) == len(ids)
    for event in events:
        assert event.event in REFERENCE_TYPES
        assert [line.split(":", 1)[0] for line in event.lines] == ["event", "id", "data"]
        data = event.json
        assert set(data) == DATA_KEYS
        assert data["type"] == event.event
        assert data["org_id"] == proxy.org_id
        assert data["session_id"] == session
        assert data["timestamp"].endswith("Z")
        dt.datetime.fromisoformat(data["timestamp"].replace("Z", "+00:00"))
        assert isinstance(data["payload"], dict)
    assert events[0].json["effect_id"] == effect_id
    assert events[1].json["payload"]["stage"] == "committed"
    assert events[4].json["payload"]["approval_id"] == pending["approval_id"]
    assert events[8].json["payload"]["reason"] == "no"


async def test_a_call_in_doubt_is_an_effect_failed_event(proxy: ProxyHarness) -> None:
    session = new_session()
    body = {"session_id": session, "tool_name": "broken", "step_index": 1, "args": {}}
    async with proxy.async_client() as c, EventStream(c) as stream:
        assert (await c.post(TOOL_CALL, json=body)).status_code == 409
        events = await stream.until("effect_failed")
    assert [e.event for e in events] == ["effect_intercepted", "effect_failed"]
    assert events[1].json["payload"]["stage"] == "in_doubt"
    assert events[1].json["payload"]["error"]


async def test_the_stream_sends_a_ping_comment_between_events(
    proxy: ProxyHarness, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("undolog.proxy.events.PING_SECONDS", 0.2)
    async with proxy.async_client() as c, EventStream(c) as stream:
        assert await stream.comment() == ": ping"
    assert ": ping" in stream.raw_lines


def test_the_ping_interval_is_25_seconds() -> None:
    from undolog.proxy import events

    assert events.PING_SECONDS == 25


# --- resume --------------------------------------------------------------------------------


@pytest.mark.parametrize("how", ["header", "query"])
async def test_a_client_resumes_after_its_last_event_id_then_gets_live_events(
    proxy: ProxyHarness, how: str
) -> None:
    session = new_session()
    async with proxy.async_client() as c:
        for step in range(1, 6):
            await echo(c, session, step)
        history = await everything(c, 10)
        cut = history[3].id
        assert cut is not None
        by_header = how == "header"
        headers = {"Last-Event-ID": cut} if by_header else {}
        params = {} if by_header else {"last_event_id": cut}
        async with EventStream(c, headers=headers, params=params) as stream:
            replayed = await stream.take(6)
            await echo(c, session, 6)
            live = await stream.take(2)
    assert [e.id for e in replayed] == [e.id for e in history[4:]]
    assert [e.data for e in replayed] == [e.data for e in history[4:]]
    assert [e.event for e in live] == ["effect_intercepted", "effect_committed"]
    assert live[0].number > replayed[-1].number
    assert stream.pending() == []


async def test_a_client_without_a_last_event_id_gets_only_new_events(
    proxy: ProxyHarness,
) -> None:
    session = new_session()
    async with proxy.async_client() as c:
        await echo(c, session, 1)
        earlier = await everything(c, 2)
        broker = proxy.runtime.broker
        await await_until(lambda: broker.hwm >= earlier[-1].number, what="the broker")
        async with EventStream(c) as stream:
            second = await echo(c, session, 2)
            events = await stream.take(2)
    assert [(e.event, e.json["effect_id"]) for e in events] == [
        ("effect_intercepted", second), ("effect_committed", second),
    ]  # fmt: skip


async def test_a_last_event_id_that_is_not_a_number_is_a_400(proxy: ProxyHarness) -> None:
    async with (
        proxy.async_client() as c,
        EventStream(c, headers={"Last-Event-ID": "abc"}) as stream,
    ):
        assert stream.status_code == 400


@pytest.mark.parametrize("store_url", ["postgres"], indirect=True)
async def test_a_proxy_behind_the_last_event_id_sends_no_duplicates(
    proxy_factory: Any,
) -> None:
    """A client resumes on proxy B from an id it saw on proxy A, before B has read that far.

    B is held back by a hole in the ids (a transaction still open, as on PostgreSQL a slow
    writer holds one): A is told to skip holes at once, B to wait for them.
    """
    a: ProxyHarness = proxy_factory()
    b: ProxyHarness = proxy_factory()
    a.runtime.broker.gap_grace_seconds = 0.0
    b.runtime.broker.gap_grace_seconds = 60.0
    session = new_session()
    writer = await open_store(a.database_url)
    holder = writer.transaction()
    held = await holder.__aenter__()
    open_ = True
    try:
        await held.insert_event(b.org_id, "effect_committed", None, None, "{}",
                                time.time_ns() // 1000)  # fmt: skip
        async with a.async_client() as on_a, b.async_client(a.api_key) as on_b:
            async with EventStream(on_a) as seen_on_a:
                for step in (1, 2):
                    await echo(on_a, session, step)
                last = (await seen_on_a.take(4))[-1]
            async with EventStream(on_b, headers={"Last-Event-ID": str(last.id)}) as stream:
                assert b.runtime.broker.hwm < last.number  # B stopped at the hole
                await holder.__aexit__(None, None, None)  # the hole fills: B reads on
                open_ = False
                third = await echo(on_b, session, 3)
                events = await stream.take(2)
    finally:
        if open_:
            await holder.__aexit__(None, None, None)
        await writer.close()
    assert [e.json["effect_id"] for e in events] == [third, third]
    assert all(e.number > last.number for e in events)


# --- resume across a restart ---------------------------------------------------------------


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[Any]:
    """`python -m undolog serve` children on one config and store; stopped at the end."""
    started: list[ProcessServer] = []

    def spawn(store_url: str, upstream: ThreadServer, config: Path) -> ProcessServer:
        server = spawn_proxy(store_url, upstream.url, config, log_path=tmp_path / "proxy.log")
        started.append(server)
        return server

    yield spawn
    for server in reversed(started):
        server.stop()


@pytest.mark.slow
async def test_a_client_resumes_across_a_kill_9_of_the_proxy_without_missing_anything(
    store_url: str, demo_upstream: ThreadServer, fleet: Any, tmp_path: Path
) -> None:
    org_id, key = f"org-{uuid.uuid4().hex[:12]}", f"ul_test_{uuid.uuid4().hex}"
    config = write_org_config(tmp_path / "undolog.toml", org_id, key)
    headers = {"X-Api-Key": key}
    session = new_session()
    steps: dict[str, int] = {}
    first: ProcessServer = fleet(store_url, demo_upstream, config)
    async with httpx.AsyncClient(base_url=first.url, headers=headers, timeout=30) as c:
        for name, spec in DEMO_TOOLS.items():
            (await c.put(f"/tools/{name}", json=spec)).raise_for_status()
        async with EventStream(c) as stream:
            for step in (1, 2):
                steps[await echo(c, session, step)] = step
            before = await stream.take(4)
            first.kill()
            await stream.closed.wait()

    second: ProcessServer = fleet(store_url, demo_upstream, config)
    async with httpx.AsyncClient(base_url=second.url, headers=headers, timeout=30) as c:
        for step in (3, 4):  # while the client is away
            steps[await echo(c, session, step)] = step
        async with EventStream(c, headers={"Last-Event-ID": str(before[-1].id)}) as stream:
            missed = await stream.take(4)
            steps[await echo(c, session, 5)] = 5
            live = await stream.take(2)
        history = await everything(c, 10)
    seen = before + missed + live
    assert [e.id for e in seen] == [e.id for e in history]
    assert [steps[e.json["effect_id"]] for e in seen] == [1, 1, 2, 2, 3, 3, 4, 4, 5, 5]


# --- tenancy and auth ----------------------------------------------------------------------


async def test_an_org_never_sees_another_orgs_events(
    proxy: ProxyHarness, proxy_factory: Any
) -> None:
    other: ProxyHarness = proxy_factory()  # a second org in the same store
    session, foreign = new_session(), new_session()
    async with proxy.async_client() as mine, proxy.async_client(other.api_key) as theirs:
        async with EventStream(mine) as stream:
            await echo(theirs, foreign, 1)
            await drop_db(theirs, foreign, 2)
            await echo(mine, session, 1)
            live = await stream.take(2)
        replay = await everything(mine, 2)
        async with EventStream(mine, headers={"Last-Event-ID": "0"}) as again:
            await again.take(2)
            await echo(theirs, foreign, 3)
            await echo(mine, session, 2)
            later = await again.take(2)
    for event in live + replay + later:
        assert event.json["org_id"] == proxy.org_id
        assert event.json["session_id"] == session


async def test_events_need_an_api_key(proxy: ProxyHarness) -> None:
    async with httpx.AsyncClient(base_url=proxy.url, timeout=10) as anonymous:
        async with EventStream(anonymous) as stream:
            assert stream.status_code == 401
        async with EventStream(anonymous, headers={"X-Api-Key": "ul_wrong"}) as stream:
            assert stream.status_code == 403


async def test_a_claimed_org_that_is_not_the_keys_is_refused(proxy: ProxyHarness) -> None:
    async with proxy.async_client() as c:
        async with EventStream(c, headers={"X-Org-Id": "org-someone-else"}) as stream:
            assert stream.status_code == 403
        async with EventStream(c, headers={"X-Org-Id": proxy.org_id}) as stream:
            assert stream.status_code == 200


# --- subscribers, queues and metrics -------------------------------------------------------


async def test_the_subscriber_gauge_counts_open_streams(proxy: ProxyHarness) -> None:
    gauge = "undolog_proxy_sse_subscribers"

    def subscribers() -> float:
        return metric(proxy.url, gauge, org=proxy.org_id)

    async with proxy.async_client() as c:
        async with EventStream(c), EventStream(c) as second:
            await await_until(lambda: subscribers() == 2, what="two subscribers")
            await second.close()
            await await_until(lambda: subscribers() == 1, what="one subscriber")
        await await_until(lambda: subscribers() == 0, what="no subscriber")


async def test_a_slow_subscriber_loses_events_and_they_are_counted(
    proxy: ProxyHarness,
) -> None:
    broker = proxy.runtime.broker
    session = new_session()
    async with proxy.async_client() as c:
        broker.queue_size = 2
        async with EventStream(c) as slow:
            broker.queue_size = 1000
            async with EventStream(c) as fast:
                await await_until(
                    lambda: (
                        metric(proxy.url, "undolog_proxy_sse_subscribers", org=proxy.org_id) == 2
                    ),
                    what="both subscribers",
                )
                # Twenty events in one transaction reach the broker in one batch: more than
                # the slow subscriber's queue holds before its stream can take any.
                store = await open_store(proxy.database_url)
                try:
                    async with store.transaction() as q:
                        now = time.time_ns() // 1000
                        for n in range(20):
                            payload = f'{{"n":{n}}}'
                            await q.insert_event(
                                proxy.org_id, "effect_committed", session, None, payload, now
                            )
                finally:
                    await store.close()
                everything_fast = await fast.take(20)
                kept = await slow.take(2)
                await echo(c, session, 1)  # the slow one keeps going with what comes next
                after = await slow.until("effect_committed")
    dropped = metric(proxy.url, "undolog_proxy_sse_events_dropped_total", org=proxy.org_id)
    assert [e.json["payload"]["n"] for e in everything_fast] == list(range(20))
    assert [e.json["payload"]["n"] for e in kept] == [0, 1]
    assert [e.event for e in after] == ["effect_intercepted", "effect_committed"]
    assert dropped == 18


async def test_an_org_with_too_many_streams_is_refused_a_new_one(proxy: ProxyHarness) -> None:
    proxy.runtime.broker.max_per_org = 1
    async with proxy.async_client() as c:
        async with EventStream(c), EventStream(c) as refused:
            assert refused.status_code == 429
            assert refused.response is not None
            assert refused.response.json()["code"] == "too_many_subscribers"
        await await_until(
            lambda: metric(proxy.url, "undolog_proxy_sse_subscribers", org=proxy.org_id) == 0,
            what="the first stream to close",
        )
        async with EventStream(c) as accepted:
            assert accepted.status_code == 200


# --- timeouts on the stream ----------------------------------------------------------------


@pytest.mark.parametrize("auto_approve", [False, True], ids=["timed-out", "auto-approved"])
async def test_an_approval_that_times_out_shows_on_the_stream_under_each_policy(
    proxy_factory: Any, auto_approve: bool
) -> None:
    proxy: ProxyHarness = proxy_factory(
        org_options={"approval_timeout_seconds": 1, "auto_approve_on_timeout": auto_approve},
        approval_sweep_seconds=0.1,
    )
    session = new_session()
    async with proxy.async_client() as c, EventStream(c) as stream:
        pending = (await drop_db(c, session)).json()
        if auto_approve:
            events = await stream.until("effect_committed")
            names = ["approval_required", "approval_approved", "effect_intercepted",
                     "effect_committed"]  # fmt: skip
        else:
            events = await stream.until("approval_timed_out")
            names = ["approval_required", "approval_timed_out"]
    assert [e.event for e in events] == names
    assert events[1].json["payload"]["approval_id"] == pending["approval_id"]
    if auto_approve:
        assert events[1].json["payload"]["status"] == "auto_approved"
