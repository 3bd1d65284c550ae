"""Three proxy processes on one PostgreSQL behind a round-robin balancer, no sticky sessions.

Three `python -m undolog serve` children share one database and one demo upstream; the
balancer (`tests/support/roundrobin.py`) sends every request to the next process, so the
calls of one session, an approval and its decision, a rollback and its retries, a stream
and its resumption each land on different processes. What must hold is what holds for one:
the duplicate storm runs the tool once, an approval decided on another process runs the
call once and its caller gets the result, every compensation runs once, a resumed stream
misses nothing and repeats nothing, and an expired approval is swept once.
"""

from __future__ import annotations

import asyncio
import uuid
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from tests.conftest import fresh_pg_database
from tests.proxy.conftest import org_toml, spawn_proxy
from tests.proxy.test_concurrency import CALLS, assert_one_execution, outcome, slow_call
from tests.support.roundrobin import BACKEND_HEADER, RoundRobin
from tests.support.servers import ProcessServer, ThreadServer, wait_until
from tests.support.sse import EventStream
from undolog.demo.catalog import DEMO_TOOLS
from undolog.demo.tools import create_demo_tools_app
from undolog.store import EventRecord, open_store

pytestmark = [pytest.mark.postgres, pytest.mark.slow]

PROCESSES = 3
DEADLINE = 30.0
TOOL_CALL = "/mcp/tool_call"
HASTY_SECONDS = 1  # the approval timeout of the second org, for the sweep


@dataclass
class Cluster:
    balancer: RoundRobin
    url: str  # the balancer's
    database_url: str
    upstream_url: str
    org_id: str
    key: str
    hasty_org_id: str  # an org whose approvals expire after HASTY_SECONDS
    hasty_key: str

    def client(self, key: str | None = None) -> httpx.Client:
        return httpx.Client(base_url=self.url, headers={"X-Api-Key": key or self.key}, timeout=60)

    def async_client(self) -> httpx.AsyncClient:
        return httpx.AsyncClient(
            base_url=self.url,
            headers={"X-Api-Key": self.key},
            timeout=60,
            limits=httpx.Limits(max_connections=CALLS),
        )

    def counters(self, tool: str) -> dict[str, int]:
        answer: dict[str, int] = httpx.get(f"{self.upstream_url}/counters/{tool}").json()
        return answer

    async def events(self, org_id: str | None = None) -> list[EventRecord]:
        store = await open_store(self.database_url)
        try:
            async with store.reader() as q:
                return await q.list_events(org_id or self.org_id, limit=1000)
        finally:
            await store.close()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    tmp = tmp_path_factory.mktemp("cluster")
    org, hasty = (f"org-{uuid.uuid4().hex[:12]}" for _ in range(2))
    key, hasty_key = (f"ul_test_{uuid.uuid4().hex}" for _ in range(2))
    config = tmp / "undolog.toml"
    config.write_text(
        org_toml(org, key) + org_toml(hasty, hasty_key, approval_timeout_seconds=HASTY_SECONDS),
        encoding="utf-8",
    )
    started: list[ProcessServer] = []
    # A database of its own: these proxies sweep every org's approvals.
    with fresh_pg_database("many") as database_url:
        upstream = ThreadServer(create_demo_tools_app(inspect=True)).start()
        try:

            def spawn(n: int) -> ProcessServer:
                server = spawn_proxy(
                    database_url, upstream.url, config, log_path=tmp / f"proxy-{n}.log",
                    UNDOLOG_APPROVAL_SWEEP_SECONDS="0.2",
                )  # fmt: skip
                started.append(server)
                return server

            with ThreadPoolExecutor(PROCESSES) as pool:
                servers = list(pool.map(spawn, range(PROCESSES)))
            balancer = RoundRobin([s.url for s in servers])
            front = ThreadServer(balancer).start()
            try:
                found = Cluster(balancer, front.url, database_url, upstream.url, org, key,
                                hasty, hasty_key)  # fmt: skip
                for api_key in (key, hasty_key):
                    with found.client(api_key) as c:
                        for name, spec in DEMO_TOOLS.items():
                            c.put(f"/tools/{name}", json=spec).raise_for_status()
                yield found
            finally:
                front.stop()
        finally:
            for server in started:
                server.stop()
            upstream.stop()


def backend(response: httpx.Response) -> int:
    return int(response.headers[BACKEND_HEADER])


def drop_db(session: str, step: int = 1) -> dict[str, Any]:
    return {"session_id": session, "tool_name": "delete_database", "step_index": step,
            "args": {"db_name": f"db-{step}"}}  # fmt: skip


# --- the duplicate storm ------------------------------------------------------------------------


async def test_a_storm_of_identical_calls_over_three_processes_runs_the_tool_once(
    cluster: Cluster,
) -> None:
    session = str(uuid.uuid4())
    async with cluster.async_client() as client:
        before = Counter(cluster.balancer.served)
        responses = await asyncio.gather(
            *(client.post(TOOL_CALL, json=slow_call(session)) for _ in range(CALLS))
        )
        assert {backend(r) for r in responses} == set(range(PROCESSES))
        assert all(cluster.balancer.served[i] > before[i] for i in range(PROCESSES))
        first = assert_one_execution(responses)
        assert cluster.counters("slow").get(first["effect_id"]) == 1
        replays = [await client.post(TOOL_CALL, json=slow_call(session)) for _ in range(3)]
    assert {backend(r) for r in replays} == set(range(PROCESSES))
    assert [(outcome(r), r.json()["effect_id"]) for r in replays] == [
        ("200 replayed", first["effect_id"])
    ] * 3
    assert cluster.counters("slow").get(first["effect_id"]) == 1


# --- approvals ----------------------------------------------------------------------------------


def test_an_approval_asked_on_one_process_and_given_on_another_runs_once_for_its_caller(
    cluster: Cluster,
) -> None:
    session = str(uuid.uuid4())
    with cluster.client() as c:
        asked = c.post(TOOL_CALL, json=drop_db(session))
        assert asked.status_code == 202, asked.text
        pending = asked.json()
        approval = f"/approvals/{pending['approval_id']}"
        looked = c.get(approval)  # the caller checks on it, elsewhere
        assert looked.json()["status"] == "pending"
        approved = c.post(f"{approval}/approve")
        assert approved.status_code == 200, approved.text
        assert approved.json()["execution"] == "committed"
        result = c.post(TOOL_CALL, json=drop_db(session))  # the caller's retry
    assert {backend(r) for r in (asked, looked, approved)} == set(range(PROCESSES))
    assert backend(result) != backend(approved)
    assert result.status_code == 200, result.text
    assert result.json()["status"] == "replayed"
    assert result.json()["effect_id"] == pending["effect_id"]
    assert result.json()["result"]["success"] is True
    assert cluster.counters("delete_database").get(pending["effect_id"]) == 1


# --- rollback -----------------------------------------------------------------------------------

WRITES: list[tuple[str, dict[str, Any]]] = [
    ("send_email", {"to": "ada@example.com", "subject": "Your refund"}),
    ("transfer_funds", {"from_account": "ops", "to_account": "ada", "amount": 120}),
    ("create_record", {"table": "refunds", "data": {"id": 7}}),
]
UNDO = {"send_email": "undo_send_email", "transfer_funds": "reverse_transfer",
        "create_record": "delete_record"}  # fmt: skip


def test_rollbacks_sent_to_three_processes_at_once_run_each_compensation_once(
    cluster: Cluster,
) -> None:
    session = str(uuid.uuid4())
    with cluster.client() as c:
        written = []
        for step, (tool, args) in enumerate(WRITES, 1):
            body = {"session_id": session, "tool_name": tool, "step_index": step, "args": args}
            response = c.post(TOOL_CALL, json=body)
            assert response.json()["status"] == "executed", response.text
            written.append(backend(response))
        assert set(written) == set(range(PROCESSES))  # each write on another process

    def roll(_: int) -> httpx.Response:
        with cluster.client() as c:
            return c.post(f"/sessions/{session}/rollback")

    with ThreadPoolExecutor(PROCESSES) as pool:
        answers = list(pool.map(roll, range(PROCESSES)))
    assert {backend(r) for r in answers} == set(range(PROCESSES))
    outcomes = {f"{r.status_code} {r.json().get('outcome') or r.json().get('code')}"
                for r in answers}  # fmt: skip
    assert outcomes <= {"200 compensated", "409 in_progress"}, [r.text for r in answers]

    def compensated() -> bool:
        with cluster.client() as c:
            again = c.post(f"/sessions/{session}/rollback")  # settles, on yet another process
            state = c.get(f"/sessions/{session}").json()["state"]
        return again.status_code == 200 and state == "compensated"

    wait_until(compensated, timeout=DEADLINE, what="the session to be compensated")
    with cluster.client() as c:
        stack = c.get(f"/sessions/{session}").json()["undo_stack"]
    assert len(stack) == len(WRITES)
    for entry in stack:
        assert entry["state"] == "compensated", entry
        assert cluster.counters(entry["fn_name"]).get(entry["entry_id"]) == 1, entry


# --- events -------------------------------------------------------------------------------------


async def test_a_stream_resumed_on_another_process_misses_nothing_and_repeats_nothing(
    cluster: Cluster,
) -> None:
    session = str(uuid.uuid4())

    def echo(step: int) -> dict[str, Any]:
        return {"session_id": session, "tool_name": "echo", "step_index": step,
                "args": {"n": step}}  # fmt: skip

    async with cluster.async_client() as client:
        async with EventStream(client) as first:
            assert first.response is not None
            first_backend = int(first.response.headers[BACKEND_HEADER])
            for step in (1, 2):
                assert (await client.post(TOOL_CALL, json=echo(step))).status_code == 200
            seen = await first.take(4, within=DEADLINE)  # intercepted + committed, twice
        last = seen[-1].number
        # While nobody listens, calls land on every process.
        for step in range(3, 3 + PROCESSES):
            assert (await client.post(TOOL_CALL, json=echo(step))).status_code == 200
        while cluster.balancer.upcoming == first_backend:  # resume on another process
            await client.get("/health")
        resumed_on = cluster.balancer.upcoming
        async with EventStream(client, headers={"Last-Event-ID": str(last)}) as second:
            assert second.response is not None
            assert int(second.response.headers[BACKEND_HEADER]) == resumed_on != first_backend
            rest = await second.take(2 * PROCESSES, within=DEADLINE)
    stored = [e for e in await cluster.events() if e.session_id == session]
    expected = [(e.event_id, e.type) for e in stored if e.event_id > last]
    assert [(e.number, e.event) for e in rest] == expected[: len(rest)]
    assert len(expected) == len(rest)
    assert [e.number for e in seen + rest] == [e.event_id for e in stored]


# --- sweeps -------------------------------------------------------------------------------------


async def test_expired_approvals_asked_on_three_processes_are_swept_once_each(
    cluster: Cluster,
) -> None:
    session = str(uuid.uuid4())
    with cluster.client(cluster.hasty_key) as c:
        asked = [c.post(TOOL_CALL, json=drop_db(session, step)) for step in range(1, 7)]
        assert {backend(r) for r in asked} == set(range(PROCESSES))
        assert all(r.status_code == 202 for r in asked), [r.text for r in asked]
        effects = sorted(r.json()["effect_id"] for r in asked)

        def all_timed_out() -> bool:
            listed = c.get("/approvals", params={"state": "timed_out", "limit": 100}).json()
            return sorted(a["effect_id"] for a in listed) == effects

        wait_until(all_timed_out, timeout=DEADLINE, what="every approval to time out")
    swept = [e.effect_id for e in await cluster.events(cluster.hasty_org_id)
             if e.type == "approval_timed_out"]  # fmt: skip
    assert sorted(e or "" for e in swept) == effects  # each once, by whichever process
    assert not set(cluster.counters("delete_database")) & set(effects)
