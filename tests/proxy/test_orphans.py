"""The lease sweeper: a call whose proxy died (kill -9) and that nobody retries is found.

Proxies run as child processes on one store (both stores). The survivors' sweepers move the
orphan to `in_doubt` once its lease has expired — exactly once between them — the overview
counts it, the session's rollback names it, an operator resolves it, and the rollback proceeds.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable

import httpx
import pytest

from tests.proxy.conftest import METRICS_AUTH
from tests.proxy.test_crash import (  # noqa: F401 - fleet_on: a fixture, used by name
    DEADLINE,
    LEASE_SECONDS,
    Fleet,
    fleet_on,
    outcome,
    slow_call,
)
from tests.support.servers import ProcessServer, wait_until

pytestmark = pytest.mark.slow

SWEEP = {"UNDOLOG_LEASE_SWEEP_SECONDS": "0.2"}


@pytest.fixture
def fleet(store_url: str, fleet_on: Callable[[str], Fleet]) -> Fleet:  # noqa: F811
    return fleet_on(store_url)


def get(fleet: Fleet, server: ProcessServer, path: str) -> httpx.Response:
    return httpx.get(server.url + path, headers=fleet.headers, timeout=DEADLINE)


def swept(fleet: Fleet, server: ProcessServer) -> float:
    text = httpx.get(server.url + "/metrics", headers=METRICS_AUTH, timeout=DEADLINE).text
    name = 'undolog_proxy_effects_in_doubt_total{reason="lease_expired"}'
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_an_orphaned_call_is_swept_in_doubt_once_resolved_and_rolled_back(fleet: Fleet) -> None:
    dying, survivor, other = fleet.spawn("dying", "survivor", "other", **SWEEP)
    fleet.register_tools(dying)
    body = slow_call(str(uuid.uuid4()))
    session = body["session_id"]

    effect_id = fleet.cut_off(dying, body)  # and nobody retries it

    def in_doubt() -> bool:
        return bool(get(fleet, survivor, f"/effects/{effect_id}").json()["state"] == "in_doubt")

    wait_until(in_doubt, timeout=LEASE_SECONDS + DEADLINE, what="the sweeper")
    effect = get(fleet, survivor, f"/effects/{effect_id}").json()
    assert (effect["attempts"], effect["error"]) == (
        1,
        "execution lease expired before commit or fail",
    )
    assert get(fleet, survivor, "/overview").json()["effects_in_doubt"] == 1
    # The sweeper counts the move once its transaction has committed, so the count can trail
    # the state a reader already sees: wait for it, then it must be exactly one move.
    wait_until(
        lambda: swept(fleet, survivor) + swept(fleet, other) >= 1.0,
        timeout=DEADLINE,
        what="the sweeper to count the move",
    )
    assert swept(fleet, survivor) + swept(fleet, other) == 1.0  # one sweeper moved it

    blocked = fleet.post(survivor, f"/sessions/{session}/rollback", {})
    assert outcome(blocked) == "409 effect_in_doubt", blocked.json()
    assert blocked.json()["outcome"] == "effect_in_doubt"
    assert blocked.json()["in_doubt_effects"] == [
        {"effect_id": effect_id, "tool_name": "slow", "state": "in_doubt"}
    ]

    resolved = fleet.post(
        survivor,
        f"/effects/{effect_id}/resolve",
        {"outcome": "committed", "result": {"success": True, "output": {"slept": 2}}},
    )
    assert resolved.status_code == 200, resolved.json()
    assert resolved.json()["state"] == "committed"

    rolled = fleet.post(other, f"/sessions/{session}/rollback", {})
    assert rolled.status_code == 200, rolled.json()
    assert rolled.json()["outcome"] == "compensated"
    assert rolled.json()["in_doubt_effects"] == []
    assert fleet.counters("slow") == {effect_id: 1}
    [entry] = rolled.json()["undo_stack"]
    assert fleet.counters("echo") == {entry["entry_id"]: 1}  # the compensation ran once
