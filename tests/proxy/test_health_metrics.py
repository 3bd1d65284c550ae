"""Saga-health metrics through a real proxy and demo upstream, on both stores.

Approvals pending by age and effects in doubt are gauges read from the store by every proxy's
approval sweep (store-wide: two proxies on one store report the same value); compensations
that gave up are counted; time to compensate and time to decide are histograms
(docs/observability.md). The sweep runs every 0.1 s here; gauges are waited for by polling.
"""

from __future__ import annotations

import uuid
from typing import Any

import httpx

from tests.proxy.conftest import ProxyHarness
from tests.proxy.test_events import metric as metric_at
from tests.proxy.test_rollback import EMAIL, TRANSFER, call, on_store, register, rollback
from tests.support.servers import wait_until
from undolog.engine.model import now_us

TOOL_CALL = "/mcp/tool_call"
FAST_SWEEP = {"approval_sweep_seconds": 0.1}
PENDING = "undolog_proxy_approvals_pending"
IN_DOUBT = "undolog_proxy_effects_in_doubt_current"
DECIDE = "undolog_proxy_approval_time_to_decide_seconds_count"
COMPENSATE = "undolog_proxy_compensation_duration_seconds_count"
FAILED = "undolog_proxy_compensations_failed_total"


def metric(proxy: ProxyHarness, name: str, **labels: str) -> float:
    return metric_at(proxy.url, name, **labels)


def drop_db(session_id: str, step: int = 1) -> dict[str, Any]:
    return {
        "session_id": session_id,
        "tool_name": "delete_database",
        "step_index": step,
        "args": {"db_name": "prod"},
    }


def approval_id(c: httpx.Client, body: dict[str, Any]) -> str:
    response = c.post(TOOL_CALL, json=body)
    assert response.status_code == 202, response.text
    found: str = response.json()["approval_id"]
    return found


def test_pending_approvals_are_a_gauge_by_age_read_from_the_store_by_every_proxy(
    proxy_factory: Any,
) -> None:
    first: ProxyHarness = proxy_factory(**FAST_SWEEP)
    second: ProxyHarness = proxy_factory(org_id=first.org_id, **FAST_SWEEP)
    org = first.org_id
    with first.client() as c:
        pending = approval_id(c, drop_db(str(uuid.uuid4())))
        # Seen by both processes, though only the first one took the call.
        for proxy in (first, second):
            wait_until(
                lambda p=proxy: metric(p, PENDING, org=org, older_than="0s") == 1,
                what="the pending gauge",
            )
        assert metric(second, PENDING, org=org, older_than="1m") == 0
        assert c.post(f"/approvals/{pending}/approve", json={}).status_code == 200
    for proxy in (first, second):
        wait_until(
            lambda p=proxy: metric(p, PENDING, org=org, older_than="0s") == 0,
            what="the gauge back to 0",
        )
    # The decision is timed where it was made: by the first proxy, from request to decision.
    assert metric(first, DECIDE, status="approved") == 1
    assert metric(second, DECIDE, status="approved") == 0


def test_the_age_buckets_count_an_approval_in_every_bucket_it_has_outlived(
    proxy_factory: Any,
) -> None:
    proxy: ProxyHarness = proxy_factory()
    with proxy.client() as c:
        approval_id(c, drop_db(str(uuid.uuid4())))
        approval_id(c, drop_db(str(uuid.uuid4())))
    now = now_us()
    # Cutoffs: now (both count), an hour ago (neither), an hour ahead (both: "older" than it).
    cutoffs = [now, now - 3_600_000_000, now + 3_600_000_000]
    ages = on_store(proxy, lambda q: q.pending_approvals_by_age(cutoffs), write=False)
    assert ages[proxy.org_id] == [2, 0, 2]


def test_a_timed_out_approval_is_timed_by_the_sweep(proxy_factory: Any) -> None:
    proxy: ProxyHarness = proxy_factory({"approval_timeout_seconds": 1}, **FAST_SWEEP)
    with proxy.client() as c:
        approval_id(c, drop_db(str(uuid.uuid4())))
    wait_until(lambda: metric(proxy, DECIDE, status="timed_out") == 1, what="the timeout")
    sum_ = metric(proxy, "undolog_proxy_approval_time_to_decide_seconds_sum", status="timed_out")
    assert sum_ >= 1.0  # waited at least its timeout


def test_effects_in_doubt_are_a_gauge_that_follows_the_store(proxy_factory: Any) -> None:
    proxy: ProxyHarness = proxy_factory(**FAST_SWEEP)
    body = {"session_id": str(uuid.uuid4()), "tool_name": "broken", "step_index": 1, "args": {}}
    with proxy.client() as c:
        first = c.post(TOOL_CALL, json=body)
        assert first.status_code == 409, first.text
        wait_until(
            lambda: metric(proxy, IN_DOUBT, org=proxy.org_id) == 1, what="the in-doubt gauge"
        )
        effect = first.json()["effect_id"]
        resolved = c.post(f"/effects/{effect}/resolve", json={"outcome": "failed"})
        assert resolved.status_code == 200, resolved.text
    wait_until(lambda: metric(proxy, IN_DOUBT, org=proxy.org_id) == 0, what="the gauge at 0")


def test_compensations_are_timed_and_those_that_give_up_are_counted(
    proxy: ProxyHarness,
) -> None:
    with proxy.client() as c:
        good = str(uuid.uuid4())
        call(c, good, "send_email", EMAIL, 1)
        assert rollback(c, good).status_code == 200
        bad = str(uuid.uuid4())
        register(c, "transfer_funds", "reverse_transfer", args={"fail_times": 1000},
                 max_retries=1)  # fmt: skip
        call(c, bad, "transfer_funds", TRANSFER, 1)
        assert rollback(c, bad).status_code == 502
    assert metric(proxy, COMPENSATE, result="compensated") == 1
    assert metric(proxy, COMPENSATE, result="failed") == 1
    assert metric(proxy, FAILED, reason="exhausted") == 1
