"""Rollback across kill -9 and across processes: every compensation runs exactly once.

Proxies run as child processes (`python -m undolog serve`) so a test can kill -9 one in the
middle of a rollback. The demo upstream runs in this process behind a gate that can hold one
compensation's request (before the tool runs, or after it ran but before the proxy hears the
answer), so the kill lands at a known point without any sleeping. Claim leases are short
(`LEASE_SECONDS`) so that the dead proxy's claim lapses within the test; the rerun polls
through `409 in_progress` with a deadline. The demo compensations honour the Idempotency-Key
(the entry id), and `GET /executions/{tool}` counts their real runs per key.
"""

from __future__ import annotations

import asyncio
import secrets
import threading
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.proxy.conftest import spawn_proxy, write_org_config
from tests.support.servers import ProcessServer, ThreadServer, wait_until
from undolog.demo.catalog import DEMO_TOOLS
from undolog.demo.tools import create_demo_tools_app

pytestmark = pytest.mark.slow

LEASE_SECONDS = 2
BACKOFF_MS = 3000
"""A retry backoff long enough for the test to kill the proxy while it waits. The claim's lease
covers the backoff too, so the successor waits out both (about five seconds)."""
DEADLINE = 60.0
EMAIL = {"to": "ada@example.com", "subject": "Your refund"}
TRANSFER = {"from_account": "ops", "to_account": "ada", "amount": 120}
RECORD = {"table": "refunds", "data": {"id": 7}}
WRITES = [("send_email", EMAIL), ("transfer_funds", TRANSFER), ("create_record", RECORD)]
UNDO_ORDER = ["delete_record", "reverse_transfer", "undo_send_email"]


class Gate:
    """ASGI middleware in front of the demo tools that can hold calls of one tool.

    `where="before"` holds the request before the tool runs; `where="after"` lets the tool
    run and holds its answer. Held calls go on once `release()` is called.
    """

    def __init__(self, app: Any, tool: str | None, where: str) -> None:
        self.app, self.where = app, where
        self.path = f"/tools/{tool}" if tool else None
        self.arrived = threading.Event()
        self.ran = threading.Event()
        self._open = threading.Event()

    def release(self) -> None:
        self._open.set()

    async def _wait_open(self) -> None:
        await asyncio.to_thread(self._open.wait, DEADLINE)

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["path"] != self.path or self._open.is_set():
            await self.app(scope, receive, send)
            return
        self.arrived.set()
        if self.where == "before":
            await self._wait_open()
            await self.app(scope, receive, send)
            return
        held: list[Any] = []

        async def hold(message: Any) -> None:
            held.append(message)

        await self.app(scope, receive, hold)
        self.ran.set()
        await self._wait_open()
        for message in held:
            await send(message)


@dataclass
class Upstream:
    server: ThreadServer
    gate: Gate

    @property
    def url(self) -> str:
        return self.server.url

    def get(self, path: str) -> Any:
        return httpx.get(self.url + path, timeout=DEADLINE).json()

    def calls(self, session: str) -> list[dict[str, Any]]:
        return [c for c in self.get("/calls") if c["session_id"] == session]

    def undo_calls(self, session: str) -> list[dict[str, Any]]:
        return [c for c in self.calls(session) if c["tool"] in UNDO_ORDER]


@pytest.fixture
def gated() -> Iterator[Callable[..., Upstream]]:
    """Demo upstreams whose calls of `tool` are held at `where` (no tool: nothing is held)."""
    started: list[Upstream] = []

    def make(tool: str | None = None, where: str = "before") -> Upstream:
        gate = Gate(create_demo_tools_app(inspect=True), tool, where)
        started.append(Upstream(ThreadServer(gate).start(), gate))
        return started[-1]

    try:
        yield make
    finally:
        for upstream in started:
            upstream.gate.release()
            upstream.server.stop()


@dataclass
class Proxies:
    """Proxy processes sharing one store and one org."""

    store_url: str
    upstream_url: str
    config: Path
    api_key: str
    logs: Path
    started: list[ProcessServer] = field(default_factory=list)

    def spawn(self, *names: str, **env: str) -> list[ProcessServer]:
        def start(name: str) -> ProcessServer:
            server = spawn_proxy(
                self.store_url,
                self.upstream_url,
                self.config,
                log_path=self.logs / f"proxy-{name}.log",
                **env,
            )
            self.started.append(server)
            return server

        with ThreadPoolExecutor(len(names)) as pool:
            return list(pool.map(start, names))

    def client(self, server: ProcessServer) -> httpx.Client:
        return httpx.Client(
            base_url=server.url, headers={"X-Api-Key": self.api_key}, timeout=DEADLINE
        )

    def setup_session(self, server: ProcessServer, **tools: dict[str, Any]) -> str:
        """Register the demo tools (with overrides) and make the three writes; the session."""
        session = str(uuid.uuid4())
        with self.client(server) as client:
            for name, spec in {**DEMO_TOOLS, **tools}.items():
                client.put(f"/tools/{name}", json=spec).raise_for_status()
            for step, (tool, args) in enumerate(WRITES, 1):
                body = {"session_id": session, "tool_name": tool, "step_index": step, "args": args}
                answer = client.post("/mcp/tool_call", json=body)
                assert answer.json()["status"] == "executed", answer.text
        return session

    def rollback(self, server: ProcessServer, session: str) -> httpx.Response:
        with self.client(server) as client:
            return client.post(f"/sessions/{session}/rollback")

    def rollback_until_settled(self, server: ProcessServer, session: str) -> httpx.Response:
        """Rerun the rollback until no live claim holds it (the dead proxy's lease lapsed)."""
        answers: list[httpx.Response] = []

        def settled() -> bool:
            answers.append(self.rollback(server, session))
            return answers[-1].status_code != 409

        wait_until(settled, timeout=DEADLINE, what="the dead proxy's claim to lapse")
        busy = answers[:-1]
        assert all(a.json()["code"] == "in_progress" for a in busy), [a.text for a in busy]
        return answers[-1]

    def view(self, server: ProcessServer, session: str) -> dict[str, Any]:
        with self.client(server) as client:
            response = client.get(f"/sessions/{session}")
        response.raise_for_status()
        data: dict[str, Any] = response.json()
        return data


@pytest.fixture
def proxies_on(tmp_path: Path) -> Iterator[Callable[[str, str], Proxies]]:
    made: list[Proxies] = []

    def make(store_url: str, upstream_url: str) -> Proxies:
        org_id, key = f"org-{secrets.token_hex(6)}", "ul_test_" + secrets.token_urlsafe(18)
        config = write_org_config(tmp_path / f"{org_id}.toml", org_id, key)
        made.append(Proxies(store_url, upstream_url, config, key, tmp_path))
        return made[-1]

    try:
        yield make
    finally:
        for proxies in made:
            for server in proxies.started:
                server.stop()


def assert_undone_exactly_once(upstream: Upstream, data: dict[str, Any], session: str) -> None:
    """Each compensation ran once under its entry id, newest first, and the state is restored."""
    entries = {u["fn_name"]: u["entry_id"] for u in data["undo_stack"]}
    for tool in UNDO_ORDER:
        assert upstream.get(f"/executions/{tool}") == {entries[tool]: 1}, tool
    ran_order = []
    for made in upstream.undo_calls(session):
        assert made["idempotency_key"] == entries[made["tool"]]
        if made["tool"] not in ran_order:
            ran_order.append(made["tool"])
    assert ran_order == UNDO_ORDER
    for tool, _ in WRITES:  # the forward calls ran once each too
        assert list(upstream.get(f"/executions/{tool}").values()) == [1], tool
    state = upstream.get("/state")
    assert state["balances"] == {"ops": 1000, "ada": 1000}
    assert [m["status"] for m in state["messages"].values()] == ["recalled"]
    assert [r["status"] for r in state["records"].values()] == ["deleted"]
    assert data["state"] == "compensated"
    assert {u["state"] for u in data["undo_stack"]} == {"compensated"}
    assert {e["state"] for e in data["effects"]} == {"compensated"}


@pytest.mark.parametrize("where", ["before", "after"])
def test_a_rollback_cut_off_by_kill_9_mid_compensation_finishes_on_rerun_exactly_once(
    store_url: str,
    gated: Callable[..., Upstream],
    proxies_on: Callable[[str, str], Proxies],
    where: str,
) -> None:
    # The middle compensation is held: before the upstream runs it, or after it ran but
    # before the proxy hears back. Either way the rerun calls it again under the same key.
    upstream = gated("reverse_transfer", where)
    proxies = proxies_on(store_url, upstream.url)
    lease = {"UNDOLOG_LEASE_SECONDS": str(LEASE_SECONDS)}
    [dying] = proxies.spawn("dying", **lease)
    session = proxies.setup_session(dying)

    with ThreadPoolExecutor(1) as pool:
        pending = pool.submit(proxies.rollback, dying, session)
        held = upstream.gate.ran if where == "after" else upstream.gate.arrived
        assert held.wait(DEADLINE), "the compensation never reached the upstream"
        dying.kill()
        with pytest.raises(httpx.TransportError):
            pending.result(timeout=DEADLINE)
    upstream.gate.release()
    assert [c["tool"] for c in upstream.undo_calls(session)][:1] == ["delete_record"]

    [successor] = proxies.spawn("successor", **lease)
    answer = proxies.rollback_until_settled(successor, session)

    assert answer.status_code == 200, answer.text
    assert answer.json()["outcome"] == "compensated"
    data = proxies.view(successor, session)
    assert_undone_exactly_once(upstream, data, session)
    [transfer_undo] = [u for u in data["undo_stack"] if u["fn_name"] == "reverse_transfer"]
    calls = upstream.get("/counters/reverse_transfer")
    # After: the rerun re-sent the key and the upstream answered with its first result. Before:
    # the held request may die with its connection, so the rerun's call is the only one.
    assert calls[transfer_undo["entry_id"]] in ((2,) if where == "after" else (1, 2))
    again = proxies.rollback(successor, session)
    assert (again.status_code, again.json()["outcome"]) == (200, "compensated")
    assert upstream.get("/counters/reverse_transfer") == calls  # nothing ran a third time


def test_a_compensation_cut_off_by_kill_9_that_is_not_idempotent_waits_for_an_operator(
    store_url: str,
    gated: Callable[..., Upstream],
    proxies_on: Callable[[str, str], Proxies],
) -> None:
    # reverse_transfer ran, but its proxy died before hearing back; it is not declared
    # idempotent here, so nobody may run it again: the entry needs an operator.
    upstream = gated("reverse_transfer", "after")
    proxies = proxies_on(store_url, upstream.url)
    lease = {"UNDOLOG_LEASE_SECONDS": str(LEASE_SECONDS)}
    [dying] = proxies.spawn("dying", **lease)
    plain = {"fn_name": "reverse_transfer", "max_retries": 3, "retry_backoff_ms": 200}
    session = proxies.setup_session(
        dying, transfer_funds={"tier": "compensable", "compensation": plain}
    )

    with ThreadPoolExecutor(1) as pool:
        pending = pool.submit(proxies.rollback, dying, session)
        assert upstream.gate.ran.wait(DEADLINE), "the compensation never ran"
        dying.kill()
        with pytest.raises(httpx.TransportError):
            pending.result(timeout=DEADLINE)
    upstream.gate.release()

    [successor] = proxies.spawn("successor", **lease)
    stopped = proxies.rollback_until_settled(successor, session)
    assert (stopped.status_code, stopped.json()["code"]) == (502, "compensation_failed")
    [entry] = [u for u in stopped.json()["undo_stack"] if u["fn_name"] == "reverse_transfer"]
    assert entry["state"] == "failed"
    assert "outcome unknown" in entry["last_error"]
    assert upstream.get("/executions/reverse_transfer") == {entry["entry_id"]: 1}  # not rerun

    with proxies.client(successor) as client:
        resolved = client.post(
            f"/undo/{entry['entry_id']}/resolve", json={"note": "the transfer was reversed"}
        )
        assert resolved.status_code == 200, resolved.text
    answer = proxies.rollback(successor, session)
    assert (answer.status_code, answer.json()["outcome"]) == (200, "compensated"), answer.text
    assert upstream.get("/executions/reverse_transfer") == {entry["entry_id"]: 1}
    entries = {u["fn_name"]: u["entry_id"] for u in answer.json()["undo_stack"]}
    assert upstream.get("/executions/undo_send_email") == {entries["undo_send_email"]: 1}


def test_a_rollback_killed_while_waiting_to_retry_resumes_the_same_entry_after_restart(
    store_url: str,
    gated: Callable[..., Upstream],
    proxies_on: Callable[[str, str], Proxies],
) -> None:
    # The transfer's reversal fails once, then the proxy waits a long backoff: killed there.
    upstream = gated()
    proxies = proxies_on(store_url, upstream.url)
    lease = {"UNDOLOG_LEASE_SECONDS": str(LEASE_SECONDS)}
    [dying] = proxies.spawn("dying", **lease)
    backoff = {"fn_name": "reverse_transfer", "args": {"fail_times": 1}, "max_retries": 3,
               "retry_backoff_ms": BACKOFF_MS}  # fmt: skip
    session = proxies.setup_session(
        dying, transfer_funds={"tier": "compensable", "compensation": backoff}
    )

    with ThreadPoolExecutor(1) as pool:
        pending = pool.submit(proxies.rollback, dying, session)
        wait_until(
            lambda: any(u["attempts"] == 1 for u in proxies.view(dying, session)["undo_stack"]
                        if u["fn_name"] == "reverse_transfer"),
            timeout=DEADLINE, what="the first failed attempt to be recorded",
        )  # fmt: skip
        dying.kill()
        with pytest.raises(httpx.TransportError):
            pending.result(timeout=DEADLINE)
    assert list(upstream.get("/counters/reverse_transfer").values()) == [1]  # killed mid-backoff

    [successor] = proxies.spawn("successor", **lease)
    answer = proxies.rollback_until_settled(successor, session)

    assert answer.status_code == 200, answer.text
    assert answer.json()["outcome"] == "compensated"
    data = proxies.view(successor, session)
    assert_undone_exactly_once(upstream, data, session)
    [transfer_undo] = [u for u in data["undo_stack"] if u["fn_name"] == "reverse_transfer"]
    assert transfer_undo["attempts"] == 2  # the failed try before the kill, the one after
    assert upstream.get("/counters/reverse_transfer") == {transfer_undo["entry_id"]: 2}


@pytest.mark.postgres
def test_two_proxies_rolling_back_one_session_at_once_run_each_compensation_once(
    pg_url: str,
    gated: Callable[..., Upstream],
    proxies_on: Callable[[str, str], Proxies],
) -> None:
    upstream = gated()
    proxies = proxies_on(pg_url, upstream.url)
    first, second = proxies.spawn("first", "second")
    sessions = [proxies.setup_session(first) for _ in range(4)]
    barrier = threading.Barrier(2)

    def race(server: ProcessServer, session: str) -> httpx.Response:
        barrier.wait(DEADLINE)
        return proxies.rollback(server, session)

    for session in sessions:
        with ThreadPoolExecutor(2) as pool:
            answers = list(pool.map(race, (first, second), (session, session)))
        outcomes = [f"{a.status_code} {a.json().get('outcome')}" for a in answers]
        assert set(outcomes) <= {"200 compensated", "409 in_progress"}, [a.text for a in answers]
        assert "200 compensated" in outcomes
        assert all(a.json().get("code") == "in_progress" for a in answers if a.status_code == 409)
        data = proxies.view(second, session)
        entries = {u["fn_name"]: u["entry_id"] for u in data["undo_stack"]}
        assert data["state"] == "compensated"
        calls = upstream.undo_calls(session)
        assert [c["tool"] for c in calls] == UNDO_ORDER  # each called once, newest first
        assert [c["idempotency_key"] for c in calls] == [entries[t] for t in UNDO_ORDER]
    for tool in UNDO_ORDER:
        assert sorted(upstream.get(f"/executions/{tool}").values()) == [1] * len(sessions)
