"""PostgreSQL under pressure: a duplicate storm over two processes, and a network outage.

The storm: 64 identical calls at once, split over two proxy processes on one database, each
client retrying until it has a final answer: the tool runs exactly once and every client that
got a result got the same one. The outage: 32 clients call in a loop through a TCP forwarder
placed between the proxy and PostgreSQL; the forwarder drops every connection and refuses new
ones until the clients have felt it, then forwards again: no call runs twice, no result a
client received is lost, nothing stays `executing`. And a database that refuses writes must
still serve the replays of committed calls (nothing a replay needs is a write).
"""

from __future__ import annotations

import asyncio
import os
import random
import secrets
import signal
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import httpx
import pytest

from tests.conftest import _pg_admin_url
from tests.faults.harness import (
    DEADLINE,
    IN_DOUBT,
    LEASE_SECONDS,
    RETRY_PAUSE,
    SETTLED,
    TOOL_SPECS,
    TRANSIENT_CODES,
    TRANSPORT_ERROR,
    Call,
    Cluster,
    new_session,
)
from tests.support.forwarder import forwarding
from tests.support.servers import ProcessServer, await_until, wait_until

pytestmark = [pytest.mark.slow, pytest.mark.postgres]

STORM = 64
CLIENTS = 32
CALLS_PER_CLIENT = 4
READ_ONLY_CALLS = 4
READ_ONLY_TRIES = 10
"""How often a client asks for each replay while the database refuses writes."""


async def settle(
    client: httpx.AsyncClient, server: ProcessServer, call: Call, *, max_tries: int = 10_000
) -> str:
    """Async twin of `Cluster.settle`: retry until a final answer, noting every answer."""
    deadline = time.monotonic() + DEADLINE
    said = TRANSPORT_ERROR
    for _ in range(max_tries):
        try:
            response = await client.post(server.url + "/mcp/tool_call", json=call.body)
        except httpx.TransportError:
            said = call.note(None)
        else:
            said = call.note(response)
        if said in SETTLED:
            return said
        if said != TRANSPORT_ERROR and said.split()[-1] not in TRANSIENT_CODES:
            return said
        if time.monotonic() > deadline:
            break
        await asyncio.sleep(RETRY_PAUSE)
    return said


def storm_rounds(config: pytest.Config) -> int:
    return max(3, int(config.getoption("faults_seeds", None) or 0))


def test_a_duplicate_storm_over_two_processes_runs_the_call_exactly_once(
    pg_url: str,
    cluster_on: Callable[[str], Cluster],
    request: pytest.FixtureRequest,
    fault_report: Callable[..., str],
) -> None:
    cluster = cluster_on(pg_url)
    first, second = cluster.spawn("first", "second")
    cluster.register(first, TOOL_SPECS)
    rounds = storm_rounds(request.config)

    async def storm() -> list[list[Call]]:
        limits = httpx.Limits(max_connections=STORM, max_keepalive_connections=STORM)
        async with httpx.AsyncClient(
            headers=cluster.headers, timeout=DEADLINE, limits=limits
        ) as client:
            made = []
            for _ in range(rounds):
                session = new_session()
                calls = [Call(session, 1, "write") for _ in range(STORM)]
                servers = [first, second] * (STORM // 2)
                await asyncio.gather(
                    *(settle(client, s, c) for s, c in zip(servers, calls, strict=True))
                )
                made.append(calls)
            return made

    made = asyncio.run(storm())
    cluster.wait_upstream_idle()

    sessions = [calls[0].session_id for calls in made]
    executions = cluster.log.per_call()
    duplicates = cluster.duplicates(sessions)
    lost = cluster.lost(first, [call for calls in made for call in calls])
    for calls in made:  # every client's result is the one the single run produced
        results = {(b["effect_id"], str(b["result"])) for c in calls for b in c.acknowledged()}
        if len(results) > 1:
            lost.append(f"{calls[0].call_id}: {len(results)} different results")
    stuck = cluster.stuck(sessions, within=LEASE_SECONDS + 3.0)
    fault_report(store="postgres", point="duplicate_storm", trials=rounds,
                 duplicates=duplicates, lost=len(lost), stuck=stuck)  # fmt: skip
    assert [executions[calls[0].call_id] for calls in made] == [1] * rounds
    assert duplicates == 0
    assert lost == []
    assert stuck == 0
    for calls in made:
        assert all(c.last in ("200 executed", "200 replayed") for c in calls), [
            c.answers for c in calls if c.last not in ("200 executed", "200 replayed")
        ]
        assert [c.last for c in calls].count("200 executed") <= 1


def _through(url: str, address: str) -> str:
    """`url` with its host and port replaced by `address`."""
    parts = urlsplit(url)
    user = parts.netloc.rsplit("@", 1)[0] + "@" if "@" in parts.netloc else ""
    return urlunsplit(parts._replace(netloc=user + address))


def test_a_database_outage_under_32_clients_loses_nothing_and_runs_nothing_twice(
    pg_url: str, cluster_on: Callable[[str], Cluster], fault_report: Callable[..., str]
) -> None:
    target = urlsplit(pg_url)
    with forwarding(target.hostname or "127.0.0.1", target.port or 5432) as forwarder:
        cluster = cluster_on(_through(pg_url, forwarder.address))
        server = cluster.clean
        rng = random.Random(f"outage/{cluster.org_id}")
        clients = [
            [Call(session, step, rng.choice(["write", "iwrite"]))
             for step in range(1, CALLS_PER_CLIENT + 1)]
            for session in (new_session() for _ in range(CLIENTS))
        ]  # fmt: skip
        calls = [call for session in clients for call in session]
        sessions = [session[0].session_id for session in clients]

        def failures() -> int:
            return sum(1 for c in calls for said, _ in c.answers if not said.startswith("200"))

        async def run() -> None:
            limits = httpx.Limits(max_connections=CLIENTS, max_keepalive_connections=CLIENTS)
            async with httpx.AsyncClient(
                headers=cluster.headers, timeout=DEADLINE, limits=limits
            ) as client:

                async def one_client(session: list[Call]) -> None:
                    for call in session:
                        await settle(client, server, call)

                async def outage() -> None:
                    # Cut once the clients are busy, until they have felt it; then restore.
                    await await_until(
                        lambda: sum(1 for c in calls if c.answers) >= CLIENTS,
                        within=DEADLINE, what="the clients to get going",
                    )  # fmt: skip
                    before = failures()
                    await asyncio.to_thread(forwarder.cut)
                    try:
                        await await_until(
                            lambda: failures() >= before + CLIENTS,
                            within=DEADLINE, what="the clients to feel the outage",
                        )  # fmt: skip
                    finally:
                        await asyncio.to_thread(forwarder.restore)

                await asyncio.gather(outage(), *(one_client(s) for s in clients))

        asyncio.run(run())
        cluster.wait_upstream_idle()
        refused = forwarder.refused

        duplicates = cluster.duplicates(sessions)
        lost = cluster.lost(server, calls)
        stuck = cluster.stuck(sessions, within=LEASE_SECONDS + 3.0)
        fault_report(store="postgres", point="database_outage", trials=len(calls),
                     duplicates=duplicates, lost=len(lost), stuck=stuck)  # fmt: skip
    assert refused >= 1  # the proxy did try to reconnect during the outage
    assert [c.answers for c in calls if not c.settled] == []
    assert duplicates == 0, cluster.log.lines()
    assert lost == []
    assert stuck == 0


def test_replays_are_served_while_the_database_refuses_writes(
    pg_url: str, cluster_on: Callable[[str], Cluster], fault_report: Callable[..., str]
) -> None:
    # Only this cluster's connections carry the application name: they are the ones reset.
    app_name = "undolog-readonly-" + secrets.token_hex(4)
    cluster = cluster_on(f"{pg_url}?application_name={app_name}")
    server = cluster.clean
    calls = [Call(new_session(), 1, "write") for _ in range(READ_ONLY_CALLS)]
    for call in calls:
        assert cluster.settle(server, call) == "200 executed", call.answers
    database = pg_url.rsplit("/", 1)[1]

    async def read_only(on: bool) -> None:
        admin = await asyncpg.connect(_pg_admin_url(), timeout=10)
        try:
            setting = "SET default_transaction_read_only = on" if on else "RESET ALL"
            await admin.execute(f'ALTER DATABASE "{database}" {setting}')
            await admin.execute(  # new connections take the setting
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE application_name = $1",
                app_name,
            )
        finally:
            await admin.close()

    asyncio.run(read_only(True))
    try:
        probes = [Call(c.session_id, c.step, c.tool) for c in calls]
        for probe in probes:
            cluster.settle(server, probe, max_tries=READ_ONLY_TRIES)
        # Readiness means "takes calls": a database that answers but refuses writes is not
        # ready (a standby, say, when the primary is gone: tests/faults/test_failover.py).
        not_ready = httpx.get(server.url + "/ready", timeout=DEADLINE)
    finally:
        asyncio.run(read_only(False))

    lost = []
    for call, probe in zip(calls, probes, strict=True):
        executed = call.answers[-1][1] or {}
        if probe.last != "200 replayed" or probe.answers[-1][1] != {
            **executed,
            "status": "replayed",
        }:
            lost.append(probe.answers)
    fault_report(store="postgres", point="read_only_replay", trials=len(calls),
                 duplicates=cluster.duplicates([c.session_id for c in calls]), lost=len(lost),
                 stuck=0)  # fmt: skip
    assert lost == []
    assert not_ready.status_code == 503, not_ready.text
    assert not_ready.json()["code"] == "store_unavailable"
    assert "read-only" not in not_ready.text  # the database's own words stay in the log


HELD_CALLS = 4


def test_a_proxy_killed_while_it_holds_results_leaves_them_to_the_next_one(
    pg_url: str,
    cluster_on: Callable[[str], Cluster],
    fault_report: Callable[..., str],
    tmp_path: Path,
) -> None:
    """The database goes away while tools run: the proxy writes their results to its spool and
    answers them; it is killed -9 before the database is back. The proxy started next on the
    same spool commits them: every acknowledged result is replayed, nothing ran twice, and
    nothing is left in doubt for an operator."""
    target = urlsplit(pg_url)
    spool = {"UNDOLOG_SPOOL_DIR": str(tmp_path / "spool"), "UNDOLOG_COMMIT_RETRY_ATTEMPTS": "2",
             "UNDOLOG_COMMIT_RETRY_BACKOFF_MS": "10"}  # fmt: skip
    with forwarding(target.hostname or "127.0.0.1", target.port or 5432) as forwarder:
        cluster = cluster_on(_through(pg_url, forwarder.address))
        [holder] = cluster.spawn("holder", **spool)
        cluster.register(holder, TOOL_SPECS)
        calls = [Call(new_session(), 1, "write", {"seconds": 1.0}) for _ in range(HELD_CALLS)]
        with ThreadPoolExecutor(HELD_CALLS) as pool:
            pending = [pool.submit(cluster.send, holder, call) for call in calls]
            wait_until(lambda: cluster.upstream_inflight() >= HELD_CALLS, what="every call to run")
            forwarder.cut()
            said = [p.result(timeout=DEADLINE) for p in pending]
        holder.kill()
        forwarder.restore()
        assert said == ["200 executed"] * HELD_CALLS, said  # written down, so answered
        [successor] = cluster.spawn("successor", **spool)
        for call in calls:
            cluster.settle(successor, call)
        sessions = [call.session_id for call in calls]
        duplicates = cluster.duplicates(sessions)
        lost = cluster.lost(successor, calls)
        in_doubt = sum(1 for call in calls if call.last == IN_DOUBT)
        stuck = cluster.stuck(sessions, within=LEASE_SECONDS + 3.0)
        fault_report(store="postgres", point="kill_9_while_holding", trials=HELD_CALLS,
                     duplicates=duplicates, lost=len(lost) + in_doubt, stuck=stuck)  # fmt: skip
    assert [call.last for call in calls] == ["200 replayed"] * HELD_CALLS, cluster.log.lines()
    assert (duplicates, lost, stuck) == (0, [], 0)


WORKER_CALLS = 8


def test_a_worker_killed_with_calls_in_flight_loses_nothing_and_runs_nothing_twice(
    cluster_on: Callable[[str], Cluster],
    faults_pg_url: str,
    fault_report: Callable[..., str],
) -> None:
    """`serve --workers 2` with calls in flight on both workers; one worker is killed -9 (the
    supervisor starts another). Every call ends with a result or the in-doubt answer (what the
    dead worker had sent is in doubt, never re-run), nothing ran twice, nothing is stuck."""
    cluster = cluster_on(faults_pg_url)
    [server] = cluster.spawn("workers", UNDOLOG_WORKERS="2", UNDOLOG_TEST_WORKER_HEADER="1")
    cluster.register(server, TOOL_SPECS)
    pids: dict[int, int] = {}

    def both_seen() -> bool:
        answer = httpx.get(server.url + "/health", timeout=DEADLINE)
        index, pid = answer.headers["x-undolog-worker"].split("/")
        pids[int(index)] = int(pid)
        return len(pids) == 2

    wait_until(both_seen, timeout=DEADLINE, what="both workers to answer")
    calls = [Call(new_session(), 1, "write", {"seconds": 1.0}) for _ in range(WORKER_CALLS)]
    with ThreadPoolExecutor(WORKER_CALLS) as pool:
        pending = [pool.submit(cluster.send, server, call) for call in calls]
        wait_until(lambda: cluster.upstream_inflight() >= WORKER_CALLS, what="every call to run")
        os.kill(pids[0], signal.SIGKILL)
        for p in pending:
            p.result(timeout=DEADLINE)
    for call in calls:
        if not call.settled:
            cluster.settle(server, call)
    sessions = [call.session_id for call in calls]
    cluster.wait_upstream_idle()
    duplicates = cluster.duplicates(sessions)
    lost = cluster.lost(server, calls)
    stuck = cluster.stuck(sessions, within=LEASE_SECONDS + 3.0)
    fault_report(store="postgres", point="worker_killed", trials=WORKER_CALLS,
                 duplicates=duplicates, lost=len(lost), stuck=stuck)  # fmt: skip
    assert [call.answers for call in calls if not call.settled] == []
    assert (duplicates, lost, stuck) == (0, [], 0)
