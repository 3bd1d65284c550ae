"""Calls that outlast the execution lease, or the upstream timeout: still one execution.

A tool slower than `--lease-seconds` runs while its proxy is alive, and a duplicate arrives in
the meantime; a tool slower than `--upstream-timeout-seconds` makes the proxy give up on an
answer the tool may still produce, and the client retries. Neither may run the tool twice
(unless it honours the key, `iwrite`), and no result a client received may be lost.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.faults.harness import (
    IN_DOUBT,
    LEASE_SECONDS,
    Call,
    Cluster,
    new_session,
)
from tests.support.servers import ProcessServer

pytestmark = pytest.mark.slow

LONGER_THAN_LEASE = 2 * LEASE_SECONDS + 0.5
UPSTREAM_TIMEOUT = 1.0
LONGER_THAN_TIMEOUT = UPSTREAM_TIMEOUT + 1.5
CLIENT_TRIES = 3
"""A client that got `tool_error` retries; it gives up after this many tries."""


def race_a_duplicate(cluster: Cluster, server: ProcessServer, tool: str) -> tuple[Call, Call]:
    """The call, sent once; and a duplicate retried from the moment the tool started running
    until it has a final answer. Both are settled (retried to a final answer) afterwards."""
    session = new_session()
    original = Call(session, 1, tool, {"seconds": LONGER_THAN_LEASE})
    duplicate = Call(session, 1, tool, {"seconds": LONGER_THAN_LEASE})
    with ThreadPoolExecutor(1) as pool:
        pending = pool.submit(cluster.send, server, original)
        cluster.wait_upstream_busy()
        cluster.settle(server, duplicate)
        pending.result(timeout=60)
    cluster.wait_upstream_idle()
    for call in (original, duplicate):
        cluster.settle(server, call)
    return original, duplicate


@pytest.mark.parametrize("tool", ["write", "iwrite"])
def test_a_call_longer_than_the_lease_runs_once_and_loses_no_result(
    cluster: Cluster, tool: str, fault_report: Callable[..., str]
) -> None:
    original, duplicate = race_a_duplicate(cluster, cluster.clean, tool)

    sessions = [original.session_id]
    duplicates = cluster.duplicates(sessions)
    lost = cluster.lost(cluster.clean, [original, duplicate])
    stuck = cluster.stuck(sessions, within=LEASE_SECONDS + 3.0)
    fault_report(store=cluster.store, point=f"longer_than_lease/{tool}", trials=1,
                 duplicates=duplicates, lost=len(lost), stuck=stuck)  # fmt: skip
    assert cluster.log.per_call()[original.call_id] == 1
    assert duplicates == 0
    assert lost == []
    assert stuck == 0


def test_a_call_longer_than_the_lease_is_answered_by_its_own_run(cluster: Cluster) -> None:
    original, duplicate = race_a_duplicate(cluster, cluster.clean, "write")

    assert original.answers[0][0] == "200 executed", original.answers
    assert IN_DOUBT not in [said for said, _ in duplicate.answers]
    assert duplicate.last == "200 replayed"
    assert cluster.lost(cluster.clean, [original, duplicate]) == []


@pytest.fixture
def impatient(cluster: Cluster) -> ProcessServer:
    """A proxy of the cluster that gives up on the upstream after `UPSTREAM_TIMEOUT`."""
    cluster.clean  # noqa: B018 - the tools are registered
    [server] = cluster.spawn("impatient", UNDOLOG_UPSTREAM_TIMEOUT_SECONDS=str(UPSTREAM_TIMEOUT))
    return server


@pytest.mark.parametrize(
    "tool",
    ["write", "iwrite"],
)
def test_a_call_longer_than_the_upstream_timeout_runs_once(
    cluster: Cluster, impatient: ProcessServer, tool: str, fault_report: Callable[..., str]
) -> None:
    call = Call(new_session(), 1, tool, {"seconds": LONGER_THAN_TIMEOUT})
    cluster.settle(impatient, call, max_tries=CLIENT_TRIES)
    cluster.wait_upstream_idle()

    sessions = [call.session_id]
    duplicates = cluster.duplicates(sessions)
    lost = cluster.lost(cluster.clean, [call])
    stuck = cluster.stuck(sessions, within=LEASE_SECONDS + 3.0)
    fault_report(store=cluster.store, point=f"longer_than_timeout/{tool}", trials=1,
                 duplicates=duplicates, lost=len(lost), stuck=stuck)  # fmt: skip
    assert cluster.log.per_call()[call.call_id] == 1, call.answers
    assert duplicates == 0
    assert lost == []
    assert stuck == 0
