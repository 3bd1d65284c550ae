"""Approvals and events across two proxy processes sharing one PostgreSQL database.

Two `python -m undolog serve` children serve one org in front of one demo upstream. Two people
deciding the same approval at the same moment, one on each process (threads released by a
barrier), leave exactly one decision and at most one run of the tool; two sweepers never
sweep one approval twice; a client streaming from one process sees what happens on the other
(LISTEN/NOTIFY).
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.proxy.conftest import spawn_proxy, write_org_config
from tests.support.servers import ProcessServer, ThreadServer, wait_until
from tests.support.sse import EventStream
from undolog.demo.catalog import DEMO_TOOLS
from undolog.store import EventRecord, open_store

pytestmark = pytest.mark.slow

TOOL_CALL = "/mcp/tool_call"
DEADLINE = 30.0


@dataclass
class Pair:
    """Two proxy processes on one PostgreSQL database, serving one org."""

    a: ProcessServer
    b: ProcessServer
    database_url: str
    upstream_url: str
    org_id: str
    api_key: str
    clients: list[httpx.Client] = field(default_factory=list)

    def client(self, server: ProcessServer) -> httpx.Client:
        c = httpx.Client(base_url=server.url, headers={"X-Api-Key": self.api_key}, timeout=60)
        self.clients.append(c)
        return c

    def async_client(self, server: ProcessServer) -> httpx.AsyncClient:
        return httpx.AsyncClient(
            base_url=server.url, headers={"X-Api-Key": self.api_key}, timeout=60
        )

    def runs(self, tool: str = "delete_database") -> dict[str, int]:
        counters: dict[str, int] = httpx.get(f"{self.upstream_url}/counters/{tool}").json()
        return counters

    def upstream_calls(self) -> list[dict[str, Any]]:
        """The upstream's log of calls (for a failure message)."""
        calls: list[dict[str, Any]] = httpx.get(f"{self.upstream_url}/calls").json()
        return calls

    async def events(self) -> list[EventRecord]:
        store = await open_store(self.database_url)
        try:
            async with store.reader() as q:
                return await q.list_events(self.org_id)
        finally:
            await store.close()


@pytest.fixture
def start_pair(
    pg_url: str, demo_upstream: ThreadServer, tmp_path: Path
) -> Iterator[Callable[..., Pair]]:
    started: list[ProcessServer] = []
    pairs: list[Pair] = []

    def start(sweep_seconds: float = 1.0, **org_options: Any) -> Pair:
        org_id, key = f"org-{uuid.uuid4().hex[:12]}", f"ul_test_{uuid.uuid4().hex}"
        config = write_org_config(tmp_path / "undolog.toml", org_id, key, **org_options)
        env = {"UNDOLOG_APPROVAL_SWEEP_SECONDS": str(sweep_seconds)}

        def spawn(name: str) -> ProcessServer:
            server = spawn_proxy(pg_url, demo_upstream.url, config,
                                 log_path=tmp_path / f"proxy-{name}.log", **env)  # fmt: skip
            started.append(server)
            return server

        with ThreadPoolExecutor(2) as pool:
            a, b = pool.map(spawn, ["a", "b"])
        pair = Pair(a, b, pg_url, demo_upstream.url, org_id, key)
        pairs.append(pair)
        with pair.client(a) as c:
            for name, spec in DEMO_TOOLS.items():
                c.put(f"/tools/{name}", json=spec).raise_for_status()
        return pair

    yield start
    for pair in pairs:
        for c in pair.clients:
            c.close()
    for server in reversed(started):
        server.stop()


def drop_db(session: str, step: int = 1) -> dict[str, Any]:
    return {"session_id": session, "tool_name": "delete_database", "step_index": step,
            "args": {"db_name": f"db-{step}"}}  # fmt: skip


def await_approval(c: httpx.Client, body: dict[str, Any]) -> dict[str, Any]:
    response = c.post(TOOL_CALL, json=body)
    assert response.status_code == 202, response.text
    pending: dict[str, Any] = response.json()
    return pending


def race(calls: list[Callable[[], httpx.Response]]) -> list[httpx.Response]:
    """Run the calls in threads released together by a barrier."""
    barrier = threading.Barrier(len(calls))

    def run(call: Callable[[], httpx.Response]) -> httpx.Response:
        barrier.wait(timeout=DEADLINE)
        return call()

    with ThreadPoolExecutor(len(calls)) as pool:
        return list(pool.map(run, calls))


def outcome(response: httpx.Response) -> str:
    body = response.json()
    return f"{response.status_code} {body.get('code') or body.get('status')}"


# --- two people, two processes -------------------------------------------------------------


def test_two_approvals_at_once_on_two_processes_run_the_tool_once(
    start_pair: Callable[..., Pair],
) -> None:
    pair = start_pair()
    on_a, on_b = pair.client(pair.a), pair.client(pair.b)
    on_a.get("/approvals"), on_b.get("/approvals")  # warm connections: the race is the call
    for round_ in range(6):
        session = str(uuid.uuid4())
        pending = await_approval(on_a if round_ % 2 else on_b, drop_db(session))
        path = f"/approvals/{pending['approval_id']}/approve"
        answers = race([partial(on_a.post, path), partial(on_b.post, path)])
        assert sorted(outcome(r) for r in answers) == [
            "200 approved", "409 approval_already_resolved",
        ], [r.text for r in answers]  # fmt: skip
        (won,) = [r.json() for r in answers if r.status_code == 200]
        assert won["execution"] == "committed"
        retry = on_b.post(TOOL_CALL, json=drop_db(session))
        assert retry.json()["status"] == "replayed"
        assert pair.runs().get(pending["effect_id"]) == 1


async def test_an_approval_and_a_rejection_at_once_on_two_processes_leave_one_decision(
    start_pair: Callable[..., Pair],
) -> None:
    pair = start_pair()
    on_a, on_b = pair.client(pair.a), pair.client(pair.b)
    on_a.get("/approvals"), on_b.get("/approvals")
    winners = []
    for round_ in range(8):
        session = str(uuid.uuid4())
        pending = await_approval(on_a, drop_db(session))
        approval_id = pending["approval_id"]
        approver, rejecter = (on_a, on_b) if round_ % 2 else (on_b, on_a)
        answers = race([partial(approver.post, f"/approvals/{approval_id}/approve"),
                        partial(rejecter.post, f"/approvals/{approval_id}/reject")])  # fmt: skip
        outcomes = sorted(outcome(r) for r in answers)
        resolved = "409 approval_already_resolved"
        assert outcomes in (["200 approved", resolved], ["200 rejected", resolved]), outcomes
        winner = "approved" if "200 approved" in outcomes else "rejected"
        winners.append(winner)
        (record,) = [a for a in on_a.get("/approvals", params={"state": winner}).json()
                     if a["id"] == approval_id]  # fmt: skip
        session_state = on_b.get(f"/sessions/{session}").json()["state"]
        ran = pair.runs().get(pending["effect_id"], 0)
        assert (record["status"], session_state, ran) == (
            (winner, "active", 1) if winner == "approved" else (winner, "halted", 0)
        )
    decided = [e for e in await pair.events()
               if e.type in ("approval_approved", "approval_rejected")]  # fmt: skip
    assert len(decided) == 8


# --- two sweepers --------------------------------------------------------------------------


@pytest.mark.parametrize("auto_approve", [False, True], ids=["timed-out", "auto-approved"])
async def test_two_processes_sweeping_handle_each_expired_approval_once(
    start_pair: Callable[..., Pair], auto_approve: bool
) -> None:
    pair = start_pair(
        sweep_seconds=0.05, approval_timeout_seconds=1, auto_approve_on_timeout=auto_approve
    )
    on_a, on_b = pair.client(pair.a), pair.client(pair.b)
    session = str(uuid.uuid4())
    asked = [await_approval(on_a if step % 2 else on_b, drop_db(session, step))
             for step in range(1, 9)]  # fmt: skip
    final = "auto_approved" if auto_approve else "timed_out"

    def all_swept() -> bool:
        listed = on_a.get("/approvals", params={"state": final, "limit": 100}).json()
        return len(listed) == len(asked)

    wait_until(all_swept, timeout=DEADLINE, what=f"every approval to be {final}")
    if auto_approve:

        def all_ran() -> bool:
            effects = on_b.get(f"/sessions/{session}").json()["effects"]
            return all(e["state"] == "committed" for e in effects)

        wait_until(all_ran, timeout=DEADLINE, what="every auto-approved call to be committed")
    events = await pair.events()
    swept_type = "approval_approved" if auto_approve else "approval_timed_out"
    swept = sorted(e.effect_id or "" for e in events if e.type == swept_type)
    assert swept == sorted(p["effect_id"] for p in asked)
    runs = pair.runs()
    if auto_approve:
        effects = {e["effect_id"]: e for e in on_b.get(f"/sessions/{session}").json()["effects"]}
        unseen = {p["effect_id"]: effects.get(p["effect_id"]) for p in asked
                  if p["effect_id"] not in runs}  # fmt: skip
        assert runs == {p["effect_id"]: 1 for p in asked}, (unseen, pair.upstream_calls())
        committed = [e for e in events if e.type == "effect_committed"]
        assert len(committed) == len(asked)
    else:
        assert runs == {}


def test_a_pending_approval_is_decided_on_the_other_process(
    start_pair: Callable[..., Pair],
) -> None:
    pair = start_pair()
    session = str(uuid.uuid4())
    pending = await_approval(pair.client(pair.a), drop_db(session))
    pair.a.kill()
    response = pair.client(pair.b).post(f"/approvals/{pending['approval_id']}/approve")
    assert response.status_code == 200, response.text
    assert response.json()["execution"] == "committed"
    assert pair.runs() == {pending["effect_id"]: 1}


# --- events across processes ---------------------------------------------------------------


async def test_a_client_of_one_process_sees_events_caused_through_the_other(
    start_pair: Callable[..., Pair],
) -> None:
    pair = start_pair()
    session = str(uuid.uuid4())
    body = {"session_id": session, "tool_name": "echo", "step_index": 1, "args": {"t": "b"}}
    async with (
        pair.async_client(pair.a) as on_a,
        pair.async_client(pair.b) as on_b,
        EventStream(on_a) as stream,
    ):
        executed = (await on_b.post(TOOL_CALL, json=body)).json()
        first = await stream.take(2, within=DEADLINE)
        pending = (await on_a.post(TOOL_CALL, json=drop_db(session, 2))).json()
        await on_b.post(f"/approvals/{pending['approval_id']}/reject")
        rest = await stream.until("approval_rejected", within=DEADLINE)
    assert [(e.event, e.json["effect_id"]) for e in first] == [
        ("effect_intercepted", executed["effect_id"]),
        ("effect_committed", executed["effect_id"]),
    ]
    assert [e.event for e in rest] == ["approval_required", "approval_rejected"]
    assert all(e.json["org_id"] == pair.org_id for e in first + rest)
