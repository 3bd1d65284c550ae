"""Crash points x both stores x seeds: a proxy dies at a named line, a clean one takes over.

Each trial starts a proxy armed with `UNDOLOG_CRASH_POINT=<point>:<n>` (it exits like kill -9
at the n-th time a call reaches the point) and a clean proxy on the same store. The seed picks
the sessions, the tools (`write` runs on every request, `iwrite` honours the key and is declared
`idempotent_upstream`), how many calls run at once and which of them dies. Every call is then
retried on a clean proxy until it has a final answer (a result, or `effect_in_doubt`) — one
that ran all along, or (as the seed says) one started after the crash — and:

- duplicates: no logical call and no key ran twice (the tool server's fsync'd log);
- lost: every result a client received is what a replay returns, and the tool produced it;
- stuck: nothing is left `executing` (or an undo entry `running`) once the lease ran out.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.faults.harness import (
    IN_DOUBT,
    LEASE_SECONDS,
    SETTLED,
    TRANSPORT_ERROR,
    Call,
    Cluster,
    new_session,
)
from tests.support.servers import ProcessServer

pytestmark = pytest.mark.slow

FORWARD_POINTS = ["after_intent", "during_upstream", "after_answer", "after_commit"]
TOOLS = ["write", "kwrite", "iwrite"]
STUCK_WITHIN = LEASE_SECONDS + 3.0


def plan_calls(rng: random.Random) -> list[list[Call]]:
    """Sessions of one to two steps each (run in order within a session, sessions at once)."""
    sessions = []
    for _ in range(rng.randint(2, 4)):
        session = new_session()
        steps = range(1, rng.randint(1, 2) + 1)
        sessions.append([Call(session, step, rng.choice(TOOLS)) for step in steps])
    return sessions


def run_sessions(cluster: Cluster, server: ProcessServer, sessions: list[list[Call]]) -> None:
    """Each session's calls in order, one try each; all sessions at once."""

    def run(calls: list[Call]) -> None:
        for call in calls:
            cluster.send(server, call)

    with ThreadPoolExecutor(len(sessions)) as pool:
        list(pool.map(run, sessions))


@pytest.mark.parametrize("point", FORWARD_POINTS)
def test_a_proxy_killed_at_a_crash_point_loses_nothing_and_runs_nothing_twice(
    cluster: Cluster, point: str, seed: int, fault_report: Callable[..., str]
) -> None:
    rng = random.Random(f"{cluster.store}/{point}/{seed}")
    sessions = plan_calls(rng)
    calls = [call for session in sessions for call in session]
    first_wave = len(sessions)  # the calls that certainly reach the point before it fires
    hit = rng.randint(1, first_wave)
    restart = rng.random() < 0.5  # the survivor is a process started after the crash
    clean = cluster.clean
    [dying] = cluster.spawn("dying", armed={"dying": f"{point}:{hit}"})

    run_sessions(cluster, dying, sessions)
    cluster.wait_crash(dying)
    if restart:
        clean = cluster.restart_clean()
    for call in calls:  # the clean proxy serves every retry
        cluster.settle(clean, call)

    session_ids = [session[0].session_id for session in sessions]
    stuck = cluster.stuck(session_ids, within=STUCK_WITHIN)
    lost = cluster.lost(clean, calls)
    duplicates = cluster.duplicates(session_ids)
    fault_report(store=cluster.store, point=point, trials=1, duplicates=duplicates,
                 lost=len(lost), stuck=stuck)  # fmt: skip
    assert [c.answers for c in calls if not c.settled] == []
    assert duplicates == 0, cluster.log.lines()
    assert lost == []
    assert stuck == 0
    assert all(c.last in SETTLED for c in calls)
    assert any(said == TRANSPORT_ERROR for c in calls for said, _ in c.answers)  # one died
    # A tool that honours the key is re-run under it, never left in doubt.
    assert [c.call_id for c in calls if c.tool == "iwrite" and c.last == IN_DOUBT] == []


@pytest.mark.parametrize(
    "kind",
    ["idempotent", "non_idempotent"],
)
def test_a_proxy_killed_mid_rollback_runs_no_compensation_twice(
    cluster: Cluster, kind: str, seed: int, fault_report: Callable[..., str]
) -> None:
    # `kwrite`/`iwrite` are undone by `iunwrite` (honours the entry id), `write` by `unwrite`.
    rng = random.Random(f"{cluster.store}/mid_rollback/{kind}/{seed}")
    tools = ["kwrite", "iwrite"] if kind == "idempotent" else ["write"]
    clean = cluster.clean
    sessions = []
    for _ in range(rng.randint(2, 3)):
        session = new_session()
        calls = [Call(session, s, rng.choice(tools)) for s in range(1, rng.randint(1, 3) + 1)]
        for call in calls:
            assert cluster.settle(clean, call) == "200 executed", call.answers
        sessions.append(session)
    hit = rng.randint(1, len(sessions))  # each rollback reaches the point at least once
    [dying] = cluster.spawn("dying", armed={"dying": f"mid_rollback:{hit}"})

    with ThreadPoolExecutor(len(sessions)) as pool:
        first = list(pool.map(lambda s: cluster.rollback(dying, s), sessions))
    cluster.wait_crash(dying)
    if rng.random() < 0.5:  # the survivor is a process started after the crash
        clean = cluster.restart_clean()
    final = [cluster.settle_rollback(clean, session) for session in sessions]

    views = [cluster.view(clean, session) for session in sessions]
    lost = sum(
        1
        for answer, view in zip(first + final, views + views, strict=True)
        if answer == "200 compensated" and view["state"] != "compensated"
    )
    stuck = cluster.stuck(sessions, within=STUCK_WITHIN)
    duplicates = cluster.duplicates(sessions)
    fault_report(store=cluster.store, point=f"mid_rollback/{kind}", trials=1,
                 duplicates=duplicates, lost=lost, stuck=stuck)  # fmt: skip
    assert duplicates == 0, [e for e in cluster.log.lines() if e["session_id"] in sessions]
    assert lost == 0
    assert stuck == 0
    assert all(answer.split()[0] in ("200", "409", "502") for answer in final), final


def test_an_orphaned_call_nobody_retries_is_moved_out_of_executing_by_the_sweeper(
    cluster: Cluster, fault_report: Callable[..., str]
) -> None:
    # The call's proxy dies after the intent; nobody ever retries it.
    cluster.clean  # noqa: B018 - the tools are registered, a live proxy runs the sweeper
    [dying] = cluster.spawn("dying", armed={"dying": "after_intent"})
    call = Call(new_session(), 1, "write")
    assert cluster.send(dying, call) == "transport_error"
    cluster.wait_crash(dying)

    stuck = cluster.stuck([call.session_id], within=2 * LEASE_SECONDS + 3.0)
    fault_report(store=cluster.store, point="orphan", trials=1, duplicates=0, lost=0,
                 stuck=stuck)  # fmt: skip
    assert stuck == 0
    assert cluster.view(cluster.clean, call.session_id)["effects"][0]["state"] == "in_doubt"
