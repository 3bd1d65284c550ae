"""kill -9 and store outages: what a dead or cut-off proxy leaves behind, and how retries treat it.

Proxies run as child processes (`python -m undolog serve`) on one store, serving one org in
front of one demo tool server, so a test can kill -9 one of them in the middle of a call and
retry on another. Leases are short (`LEASE_SECONDS`) so that an abandoned call's lease
expires within the test. Every wait polls with a deadline; the only sleeping is the `slow`
tool's, which is the behaviour under test (a tool still running when its proxy dies).
"""

from __future__ import annotations

import asyncio
import secrets
import subprocess
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import pytest

from tests.conftest import _pg_admin_url
from tests.proxy.conftest import METRICS_AUTH, spawn_proxy, write_org_config
from tests.support.servers import (
    ProcessServer,
    ThreadServer,
    await_until,
    free_port,
    undolog_command,
    wait_until,
)
from undolog.demo.catalog import DEMO_TOOLS

pytestmark = pytest.mark.slow

LEASE_SECONDS = 3
SLOW_SECONDS = 2
"""How long the cut-off call's tool runs. The proxy is killed within milliseconds of the call
reaching the upstream, so this only has to outlast that on a loaded machine. It stays below
the lease, so that a live re-run (same args, so just as slow) never outlives its own lease."""
DEADLINE = 60.0
COMMIT_RETRY_ATTEMPTS = 3


def slow_call(session_id: str) -> dict[str, Any]:
    return {
        "session_id": session_id,
        "tool_name": "slow",
        "step_index": 1,
        "args": {"seconds": SLOW_SECONDS},
    }


def echo_call(session_id: str, text: str = "hello") -> dict[str, Any]:
    return {"session_id": session_id, "tool_name": "echo", "step_index": 1, "args": {"text": text}}


def outcome(response: httpx.Response) -> str:
    body = response.json()
    return f"{response.status_code} {body.get('status') or body.get('code')}"


def assert_in_progress(response: httpx.Response, effect_id: str) -> None:
    assert outcome(response) == "409 in_progress", response.json()
    body = response.json()
    assert body["effect_id"] == effect_id
    assert 1 <= body["retry_after"] <= LEASE_SECONDS
    assert response.headers["Retry-After"] == str(body["retry_after"])


@dataclass
class Fleet:
    """Proxy processes sharing one store and one org, in front of one demo upstream."""

    store_url: str
    upstream_url: str
    config: Path
    api_key: str
    logs: Path
    started: list[ProcessServer] = field(default_factory=list)

    def spawn(self, *names: str, **env: str) -> list[ProcessServer]:
        """Start one proxy per name, at once (a python start-up takes a while on 2 cores)."""
        env = {"UNDOLOG_LEASE_SECONDS": str(LEASE_SECONDS), **env}

        def start(name: str) -> ProcessServer:
            server = spawn_proxy(
                self.store_url,
                self.upstream_url,
                self.config,
                log_path=self.logs / f"proxy-{name}.log",
                **env,
            )
            self.started.append(server)  # at once: stopped at the end even if another fails
            return server

        with ThreadPoolExecutor(len(names)) as pool:
            return list(pool.map(start, names))

    @property
    def headers(self) -> dict[str, str]:
        return {"X-Api-Key": self.api_key}

    def post(self, server: ProcessServer, path: str, body: dict[str, Any]) -> httpx.Response:
        return httpx.post(server.url + path, json=body, headers=self.headers, timeout=DEADLINE)

    def call(self, server: ProcessServer, body: dict[str, Any]) -> httpx.Response:
        return self.post(server, "/mcp/tool_call", body)

    def session(self, server: ProcessServer, session_id: str) -> dict[str, Any]:
        """`GET /sessions/{id}`: the session with its effects and undo stack."""
        response = httpx.get(
            f"{server.url}/sessions/{session_id}", headers=self.headers, timeout=DEADLINE
        )
        response.raise_for_status()
        view: dict[str, Any] = response.json()
        return view

    def register_tools(self, server: ProcessServer, **overrides: dict[str, Any]) -> None:
        for name, spec in {**DEMO_TOOLS, **overrides}.items():
            response = httpx.put(
                f"{server.url}/tools/{name}", json=spec, headers=self.headers, timeout=DEADLINE
            )
            response.raise_for_status()

    def upstream_calls(self, session_id: str) -> list[dict[str, Any]]:
        calls = httpx.get(f"{self.upstream_url}/calls", timeout=DEADLINE).json()
        return [c for c in calls if c["session_id"] == session_id]

    def counters(self, tool: str) -> dict[str, int]:
        data: dict[str, int] = httpx.get(
            f"{self.upstream_url}/counters/{tool}", timeout=DEADLINE
        ).json()
        return data

    def retry_until_settled(self, server: ProcessServer, body: dict[str, Any]) -> httpx.Response:
        """Retry a call until it is no longer `in_progress` (its lease expired); that answer."""
        answers: list[httpx.Response] = []

        def settled() -> bool:
            answers.append(self.call(server, body))
            return outcome(answers[-1]) != "409 in_progress"

        wait_until(settled, timeout=DEADLINE, what="the execution lease to expire")
        return answers[-1]

    def cut_off(self, server: ProcessServer, body: dict[str, Any]) -> str:
        """Send `body` to `server` and kill -9 it while the upstream runs the tool.

        Returns the effect id the upstream received as its `Idempotency-Key`.
        """
        session_id = body["session_id"]
        with ThreadPoolExecutor(1) as pool:
            pending = pool.submit(self.call, server, body)
            wait_until(
                lambda: bool(self.upstream_calls(session_id)),
                timeout=DEADLINE,
                what="the call to reach the upstream",
            )
            server.kill()
            with pytest.raises(httpx.TransportError):
                pending.result(timeout=DEADLINE)
        [arrived] = self.upstream_calls(session_id)
        assert arrived["idempotency_key"] == arrived["effect_id"]
        return str(arrived["effect_id"])


@pytest.fixture
def fleet_on(demo_upstream: ThreadServer, tmp_path: Path) -> Iterator[Callable[[str], Fleet]]:
    """Fleets on a given store URL, each with a fresh org; every proxy is stopped at the end."""
    fleets: list[Fleet] = []

    def make(store_url: str) -> Fleet:
        org_id, api_key = f"org-{secrets.token_hex(6)}", "ul_test_" + secrets.token_urlsafe(18)
        config = write_org_config(tmp_path / f"{org_id}.toml", org_id, api_key)
        fleets.append(Fleet(store_url, demo_upstream.url, config, api_key, tmp_path))
        return fleets[-1]

    try:
        yield make
    finally:
        for fleet in fleets:
            for server in fleet.started:
                server.stop()


@pytest.fixture
def fleet(store_url: str, fleet_on: Callable[[str], Fleet]) -> Fleet:
    return fleet_on(store_url)


# -- kill -9 ------------------------------------------------------------------------------------


def test_a_call_cut_off_by_kill_9_waits_out_its_lease_then_stays_in_doubt_until_resolved(
    fleet: Fleet,
) -> None:
    # The replacement starts before the kill, so it serves while the dead call's lease lives.
    dying, survivor = fleet.spawn("dying", "survivor")
    fleet.register_tools(dying)
    body = slow_call(str(uuid.uuid4()))

    effect_id = fleet.cut_off(dying, body)

    assert_in_progress(fleet.call(survivor, body), effect_id)
    settled = fleet.retry_until_settled(survivor, body)
    assert outcome(settled) == "409 effect_in_doubt", settled.json()
    assert settled.json()["effect_id"] == effect_id
    [effect] = fleet.session(survivor, body["session_id"])["effects"]
    assert (effect["effect_id"], effect["state"], effect["attempts"]) == (effect_id, "in_doubt", 1)
    for _ in range(2):
        again = fleet.call(survivor, body)
        assert outcome(again) == "409 effect_in_doubt"
        assert again.json()["effect_id"] == effect_id
    assert fleet.counters("slow") == {effect_id: 1}  # the tool never ran twice

    resolved = fleet.post(
        survivor,
        f"/effects/{effect_id}/resolve",
        {"outcome": "failed", "error": "operator checked"},
    )
    assert resolved.status_code == 200, resolved.json()
    assert (resolved.json()["state"], resolved.json()["error"]) == (
        "failed", "operator checked (resolved by key:admin)",
    )  # fmt: skip

    rerun = fleet.call(survivor, body)
    assert outcome(rerun) == "200 executed", rerun.json()
    assert rerun.json()["effect_id"] == effect_id
    assert fleet.counters("slow") == {effect_id: 2}  # attempt 2 ran under the same key
    view = fleet.session(survivor, body["session_id"])
    [effect] = view["effects"]
    assert (effect["state"], effect["attempts"]) == ("committed", 2)
    assert [u["effect_id"] for u in view["undo_stack"]] == [effect_id]  # pushed once


def test_a_call_cut_off_by_kill_9_on_an_idempotent_upstream_reruns_with_the_same_key(
    fleet: Fleet,
) -> None:
    dying, survivor = fleet.spawn("dying", "survivor")
    idempotent = {"compensation": {"fn_name": "echo"}, "idempotent_upstream": True}
    fleet.register_tools(dying, slow={"tier": "compensable", **idempotent})
    body = slow_call(str(uuid.uuid4()))

    effect_id = fleet.cut_off(dying, body)

    assert_in_progress(fleet.call(survivor, body), effect_id)
    rerun = fleet.retry_until_settled(survivor, body)
    assert outcome(rerun) == "200 executed", rerun.json()
    assert rerun.json()["effect_id"] == effect_id
    keys = [c["idempotency_key"] for c in fleet.upstream_calls(body["session_id"])]
    assert keys == [effect_id, effect_id]
    view = fleet.session(survivor, body["session_id"])
    [effect] = view["effects"]
    assert (effect["state"], effect["attempts"]) == ("committed", 2)
    assert [u["effect_id"] for u in view["undo_stack"]] == [effect_id]

    replay = fleet.call(survivor, body)
    assert outcome(replay) == "200 replayed"
    assert replay.json()["effect_id"] == effect_id
    assert replay.json()["result"] == rerun.json()["result"]
    assert fleet.counters("slow") == {effect_id: 2}


def test_a_call_committed_before_kill_9_replays_on_a_new_process(fleet: Fleet) -> None:
    [dying] = fleet.spawn("dying")
    fleet.register_tools(dying)
    body = echo_call(str(uuid.uuid4()))
    executed = fleet.call(dying, body)
    assert outcome(executed) == "200 executed", executed.json()
    dying.kill()

    [successor] = fleet.spawn("successor")
    replay = fleet.call(successor, body)
    assert outcome(replay) == "200 replayed", replay.json()
    assert replay.json()["effect_id"] == executed.json()["effect_id"]
    assert replay.json()["result"] == executed.json()["result"]
    assert fleet.counters("echo") == {executed.json()["effect_id"]: 1}


# -- the store unavailable ----------------------------------------------------------------------


@pytest.mark.parametrize("dialect", ["postgres", "sqlite"])
def test_a_proxy_whose_store_cannot_be_opened_exits_non_zero_with_a_clear_error(
    dialect: str, tmp_path: Path
) -> None:
    password = "pw-" + secrets.token_hex(8)
    if dialect == "postgres":  # a closed port
        url = f"postgresql://postgres:{password}@127.0.0.1:{free_port()}/test"
    else:  # a path whose parent is a regular file
        (tmp_path / "not-a-directory").write_text("", encoding="utf-8")
        url = f"sqlite:///{tmp_path / 'not-a-directory' / 'undolog.db'}"
    config = write_org_config(tmp_path / "undolog.toml", "org-x", "ul_test_key")
    env = {
        "UNDOLOG_DATABASE_URL": url,
        "UNDOLOG_CONFIG": str(config),
        "UNDOLOG_PORT": str(free_port()),
        "UNDOLOG_LOG_LEVEL": "warning",
    }
    done = subprocess.run(
        undolog_command("serve"), env=env, capture_output=True, timeout=DEADLINE, check=False
    )
    log = (done.stdout + done.stderr).decode("utf-8", "replace")
    assert done.returncode != 0, log
    assert "Database error" in log, log
    if dialect == "postgres":  # several workers by default: the supervisor opens the store
        assert "cannot start: Database error: cannot connect to PostgreSQL" in log, log
    else:  # one process: the app's lifespan opens it
        assert "Application startup failed" in log, log
    assert password not in log


@pytest.mark.postgres
async def test_a_store_outage_refuses_new_calls_loses_no_commit_and_the_proxy_recovers(
    pg_url: str, fleet_on: Callable[[str], Fleet]
) -> None:
    # Only this proxy's connections carry this application name: they are the ones cut.
    app_name = "undolog-outage-" + secrets.token_hex(4)
    fleet = fleet_on(f"{pg_url}?application_name={app_name}")
    database = pg_url.rsplit("/", 1)[1]
    [server] = await asyncio.to_thread(
        fleet.spawn, "proxy", UNDOLOG_COMMIT_RETRY_ATTEMPTS=str(COMMIT_RETRY_ATTEMPTS)
    )
    await asyncio.to_thread(fleet.register_tools, server)
    # On the admin database: a database cannot refuse connections while one is connected to it.
    admin = await asyncpg.connect(_pg_admin_url())
    async with httpx.AsyncClient(
        base_url=server.url, headers=fleet.headers, timeout=DEADLINE
    ) as client:

        async def call(body: dict[str, Any]) -> httpx.Response:
            return await client.post("/mcp/tool_call", json=body)

        warm = await call(echo_call(str(uuid.uuid4()), "warm-up"))
        assert outcome(warm) == "200 executed"
        cut = slow_call(str(uuid.uuid4()))
        refused = echo_call(str(uuid.uuid4()), "during the outage")
        pending = asyncio.create_task(call(cut))
        try:
            await await_until(
                lambda: asyncio.to_thread(fleet.upstream_calls, cut["session_id"]),
                within=DEADLINE,
                what="the call to reach the upstream",
            )
            await admin.execute(f'ALTER DATABASE "{database}" ALLOW_CONNECTIONS false')
            cut_connections = await admin.fetchval(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                "WHERE application_name = $1",
                app_name,
            )
            assert cut_connections >= 1

            during = await call(refused)
            assert outcome(during) in {"502 intercept_failed", "503 database_error"}
            finished = await asyncio.wait_for(pending, DEADLINE)
            # The result is held, not dropped: answered, spooled, committed once the store is back.
            assert outcome(finished) == "200 executed", finished.json()
            assert finished.headers["X-UndoLog-Commit"] == "pending"
        finally:
            await admin.execute(f'ALTER DATABASE "{database}" ALLOW_CONNECTIONS true')
            await admin.close()
            pending.cancel()  # a no-op once it has answered

        metrics = (await client.get("/metrics", headers=METRICS_AUTH)).text
        retries = 'undolog_proxy_engine_rpc_retries_total{method="commit"} ' + (
            f"{COMMIT_RETRY_ATTEMPTS - 1:.1f}"
        )
        assert retries in metrics.splitlines()

        # Recovered: the pool reconnects, and the refused call (never recorded) runs now, once.
        after = await call(refused)
        assert outcome(after) == "200 executed", after.json()
        echo_keys = await asyncio.to_thread(fleet.counters, "echo")
        assert echo_keys == {warm.json()["effect_id"]: 1, after.json()["effect_id"]: 1}

        # The call whose commit failed is not lost: it commits in the background, and its
        # tool does not run again.
        [arrived] = await asyncio.to_thread(fleet.upstream_calls, cut["session_id"])
        settled = await asyncio.to_thread(fleet.retry_until_settled, server, cut)
        assert outcome(settled) == "200 replayed", settled.json()
        assert settled.json()["effect_id"] == arrived["effect_id"]
        assert settled.json()["result"] == finished.json()["result"]
        view = await asyncio.to_thread(fleet.session, server, cut["session_id"])
        assert [(e["effect_id"], e["state"]) for e in view["effects"]] == [
            (arrived["effect_id"], "committed")
        ]
        assert await asyncio.to_thread(fleet.counters, "slow") == {arrived["effect_id"]: 1}
