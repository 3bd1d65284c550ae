"""A store that cannot write (disk full, PostgreSQL read-only) still serves replays.

A replay is a pure read: its `effect_replayed` event is written best effort, so a retry of a
committed call is answered from the log even when no write can succeed. The store is made
read-only for real: PostgreSQL with `ALTER DATABASE ... SET default_transaction_read_only`
(the proxy's pooled connections are renewed so that they pick it up), SQLite with
`PRAGMA query_only` on the proxy's connections. New calls then fail with a clear code.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import orjson
import pytest

from tests.conftest import _pg_admin_url
from tests.proxy.conftest import METRICS_AUTH, ProxyHarness
from tests.support.servers import wait_until
from undolog.services.held import SPOOL_FILE
from undolog.store import open_store

TOOL_CALL = "/mcp/tool_call"


def on_proxy_loop(proxy: ProxyHarness, make: Callable[[], Awaitable[Any]]) -> Any:
    """Run a coroutine on the in-process proxy's event loop (where its store lives)."""
    task = proxy.runtime.leases._task
    assert task is not None
    future = asyncio.run_coroutine_threadsafe(_call(make), task.get_loop())
    return future.result(timeout=30)


async def _call(make: Callable[[], Awaitable[Any]]) -> Any:
    return await make()


async def _pg_read_only(database: str, on: bool) -> None:
    admin = await asyncpg.connect(_pg_admin_url())
    try:
        value = "on" if on else "off"
        await admin.execute(
            f'ALTER DATABASE "{database}" SET default_transaction_read_only = {value}'
        )
    finally:
        await admin.close()


def set_read_only(proxy: ProxyHarness, on: bool) -> None:
    store: Any = proxy.runtime.store
    if store.dialect == "postgres":
        asyncio.run(_pg_read_only(proxy.database_url.rsplit("/", 1)[1].split("?")[0], on))
        on_proxy_loop(proxy, store._pool.expire_connections)
        return

    async def pragma() -> None:
        for conn in {id(c): c for c in (store._writer, store._reader)}.values():
            await conn.execute(f"PRAGMA query_only = {'ON' if on else 'OFF'}")

    on_proxy_loop(proxy, pragma)


@pytest.fixture
def read_only(proxy: ProxyHarness) -> Iterator[Callable[[], None]]:
    """Call it to make the proxy's store read-only; it is made writable again at the end."""
    made: list[bool] = []

    def make() -> None:
        made.append(True)
        set_read_only(proxy, True)

    try:
        yield make
    finally:
        if made:
            set_read_only(proxy, False)


def outcome(response: httpx.Response) -> str:
    body = response.json()
    return f"{response.status_code} {body.get('status') or body.get('code')}"


def test_replays_are_served_while_the_store_is_read_only(
    proxy: ProxyHarness, read_only: Callable[[], None]
) -> None:
    session = str(uuid.uuid4())
    calls = [
        {"session_id": session, "tool_name": "echo", "step_index": n, "args": {"n": n}}
        for n in range(1, 4)
    ]
    with proxy.client() as c:
        executed = [c.post(TOOL_CALL, json=body) for body in calls]
        assert [outcome(r) for r in executed] == ["200 executed"] * 3
        read_only()
        # The first write after the switch fails: a new call cannot be recorded.
        refused = c.post(TOOL_CALL, json={**calls[0], "step_index": 9})
        assert outcome(refused) in {"502 intercept_failed", "503 database_error"}, refused.text
        replays = [c.post(TOOL_CALL, json=calls[n % 3]) for n in range(100)]
    assert [outcome(r) for r in replays] == ["200 replayed"] * 100, replays[0].text
    assert [r.json()["result"] for r in replays[:3]] == [r.json()["result"] for r in executed]
    assert proxy.counters("echo") == {r.json()["effect_id"]: 1 for r in executed}


def test_replays_write_their_event_when_the_store_can(proxy: ProxyHarness) -> None:
    session = str(uuid.uuid4())
    body = {"session_id": session, "tool_name": "echo", "step_index": 1, "args": {}}
    with proxy.client() as c:
        assert outcome(c.post(TOOL_CALL, json=body)) == "200 executed"
        assert outcome(c.post(TOOL_CALL, json=body)) == "200 replayed"
        assert c.get("/overview").json()["replays"] == 1


# -- a result the proxy holds is kept until committed --------------------------------------------


def spool_lines(proxy: ProxyHarness) -> list[dict[str, Any]]:
    path = Path(proxy.settings.spool_dir) / SPOOL_FILE
    if not path.exists():
        return []
    return [orjson.loads(line) for line in path.read_bytes().splitlines()]


def held(client: httpx.Client, outcome_label: str) -> float:
    name = f'undolog_proxy_held_results_total{{outcome="{outcome_label}"}}'
    for line in client.get("/metrics", headers=METRICS_AUTH).text.splitlines():
        if line.startswith(name + " "):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


@pytest.fixture
def holding_proxy(proxy_factory: Any, tmp_path: Path) -> ProxyHarness:
    harness: ProxyHarness = proxy_factory(
        lease_seconds=1.5,
        lease_sweep_seconds=0.2,
        commit_retry_attempts=2,
        commit_retry_backoff_ms=10,
        spool_dir=str(tmp_path / "spool"),
    )
    return harness


def _cut_mid_call(proxy: ProxyHarness, body: dict[str, Any]) -> httpx.Response:
    """Send `body` and make the store read-only while the tool runs; the answer."""
    with ThreadPoolExecutor(1) as pool, proxy.client() as c:
        pending = pool.submit(c.post, TOOL_CALL, json=body)
        wait_until(lambda: bool(proxy.counters("slow")), what="the call to reach the upstream")
        set_read_only(proxy, True)
        return pending.result(timeout=60)


def test_a_result_whose_commit_fails_is_answered_spooled_and_committed_later(
    holding_proxy: ProxyHarness,
) -> None:
    proxy = holding_proxy
    body = {"session_id": str(uuid.uuid4()), "tool_name": "slow", "step_index": 1,
            "args": {"seconds": 0.5}}  # fmt: skip
    try:
        answer = _cut_mid_call(proxy, body)
        assert outcome(answer) == "200 executed", answer.text
        assert answer.headers["X-UndoLog-Commit"] == "pending"
        effect_id = answer.json()["effect_id"]
        [line] = spool_lines(proxy)
        assert (line["status"], line["effect_id"]) == ("held", effect_id)
        assert line["result"] == {"success": True, "output": {"slept": 0.5}, "error": None}
    finally:
        set_read_only(proxy, False)
    with proxy.client() as c:

        def committed() -> bool:
            return bool(c.get(f"/effects/{effect_id}").json()["state"] == "committed")

        wait_until(committed, what="the held result to commit")
        assert held(c, "held") == 1.0
        wait_until(lambda: held(c, "committed") == 1.0, what="the commit to be counted")
        replay = c.post(TOOL_CALL, json=body)
    assert outcome(replay) == "200 replayed"
    assert replay.json()["result"] == answer.json()["result"]
    assert [(x["status"], x["effect_id"]) for x in spool_lines(proxy)] == [
        ("held", effect_id),
        ("committed", effect_id),
    ]
    assert proxy.counters("slow") == {effect_id: 1}


def test_a_held_result_that_outlives_the_lease_is_committed_without_an_operator(
    holding_proxy: ProxyHarness,
) -> None:
    """The store stays away longer than the lease: the sweeper puts the effect in doubt once
    the store is back, and the proxy, which wrote the result down, settles it with that
    result; nobody resolves it by hand."""
    proxy = holding_proxy
    body = {"session_id": str(uuid.uuid4()), "tool_name": "slow", "step_index": 1,
            "args": {"seconds": 0.5}}  # fmt: skip
    with proxy.client() as c:
        try:
            answer = _cut_mid_call(proxy, body)
            assert outcome(answer) == "200 executed", answer.text
            effect_id = answer.json()["effect_id"]
            lease_over = time.monotonic() + 2 * proxy.settings.lease_seconds
            wait_until(lambda: time.monotonic() > lease_over, what="the lease to run out")
        finally:
            set_read_only(proxy, False)

        def committed() -> bool:
            return bool(c.get(f"/effects/{effect_id}").json()["state"] == "committed")

        wait_until(committed, what="the held result to be settled by the proxy")
        assert held(c, "given_up") == 0.0
        replay = c.post(TOOL_CALL, json=body)
    assert outcome(replay) == "200 replayed"
    assert replay.json()["result"] == answer.json()["result"]
    assert proxy.counters("slow") == {effect_id: 1}


def test_a_result_that_can_be_neither_committed_nor_spooled_is_never_answered_200(
    holding_proxy: ProxyHarness,
) -> None:
    """The commit fails and the spool cannot be written: the result would live only in
    memory, so the agent is told the call is in doubt (with the reason), never `200`; the
    proxy still commits it once the store is back, and a retry then replays it."""
    proxy = holding_proxy
    spool = Path(proxy.settings.spool_dir) / SPOOL_FILE
    spool.mkdir(parents=True)  # a directory where the spool file goes: no line can be written
    body = {"session_id": str(uuid.uuid4()), "tool_name": "slow", "step_index": 1,
            "args": {"seconds": 0.5}}  # fmt: skip
    with proxy.client() as c:
        try:
            answer = _cut_mid_call(proxy, body)
            assert outcome(answer) == "409 effect_in_doubt", answer.text
            assert "spool" in answer.json()["message"]
            effect_id = answer.json()["effect_id"]
            ready = c.get("/ready")
            assert ready.status_code == 503, ready.text
            assert ready.json()["code"] == "spool_unwritable"
            assert str(spool) not in ready.text  # paths stay in the log
        finally:
            set_read_only(proxy, False)

        def committed() -> bool:
            return bool(c.get(f"/effects/{effect_id}").json()["state"] == "committed")

        wait_until(committed, what="the result kept in memory to commit")
        replay = c.post(TOOL_CALL, json=body)
    assert outcome(replay) == "200 replayed"
    assert proxy.counters("slow") == {effect_id: 1}


def test_a_restarted_proxy_commits_what_its_spool_holds(
    holding_proxy: ProxyHarness, proxy_factory: Any
) -> None:
    """The proxy stops while it holds a result (the store still read-only); a proxy started
    later on the same spool commits it, and an effect already settled is left alone."""
    first = holding_proxy
    body = {"session_id": str(uuid.uuid4()), "tool_name": "slow", "step_index": 1,
            "args": {"seconds": 0.5}}  # fmt: skip
    try:
        answer = _cut_mid_call(first, body)
        assert outcome(answer) == "200 executed", answer.text
        effect_id = answer.json()["effect_id"]
        assert first.server is not None
        first.server.stop()  # its held commit is cancelled: the result is only in the spool
    finally:
        set_read_only_after_stop(first)
    assert [x["status"] for x in spool_lines(first)] == ["held"]
    later = proxy_factory(spool_dir=first.settings.spool_dir, lease_seconds=1.5)

    def committed() -> bool:  # the first proxy's org, read on the shared store
        return effect_state(later, first.org_id, effect_id) == "committed"

    wait_until(committed, what="the restarted proxy to commit the spooled result")
    assert [x["status"] for x in spool_lines(first)][-1] == "committed"
    with later.client() as c:
        assert held(c, "recovered") == 1.0
    assert first.counters("slow") == {effect_id: 1}


def set_read_only_after_stop(proxy: ProxyHarness) -> None:
    """Make the store writable again once the proxy that held its connections is gone."""
    store: Any = proxy.runtime.store
    if store.dialect == "postgres":
        asyncio.run(_pg_read_only(proxy.database_url.rsplit("/", 1)[1].split("?")[0], False))
    # SQLite's query_only was a pragma of the stopped proxy's own connections.


def effect_state(proxy: ProxyHarness, org_id: str, effect_id: str) -> str:
    async def read() -> str:
        store = await open_store(proxy.database_url)
        try:
            async with store.reader() as q:
                effect = await q.get_effect(org_id, effect_id)
            return "" if effect is None else str(effect.state)
        finally:
            await store.close()

    return asyncio.run(read())


def test_a_spooled_result_this_store_does_not_hold_stays_in_the_spool(
    proxy_factory: Any, tmp_path: Path
) -> None:
    """A spool moved to a proxy on another database: its results are not this store's to
    settle, and they are not dropped either; they stay for the operator or the right proxy."""
    spool = tmp_path / "spool"
    spool.mkdir()
    line = {
        "status": "held", "org_id": "org-elsewhere", "effect_id": str(uuid.uuid4()),
        "tool_name": "slow", "attempt": 1, "undoable": True, "result": {"success": True},
    }  # fmt: skip
    (spool / SPOOL_FILE).write_bytes(orjson.dumps(line) + b"\n")
    proxy = proxy_factory(spool_dir=str(spool), commit_retry_backoff_ms=10)
    held = proxy.runtime.held
    wait_until(lambda: not held._tasks, what="the recovery to try the spooled result")
    assert spool_lines(proxy) == [line]
