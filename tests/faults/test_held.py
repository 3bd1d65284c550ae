"""Held results under load: 32 callers whose calls are running when the store stops taking
writes, on both stores.

- `outage_longer_than_lease`: the store refuses writes for twice the lease while every tool is
  running. Each result is written to the spool and answered `200`; the proxy keeps them past
  the lease and commits them once the store is back, without an operator. The recovery time
  (store writable again -> every held result committed and a new call answered) is reported.
- `unwritable_spool`: the same, but the spool cannot be written either: no caller may be told
  `200` for a result that lives only in memory (they are answered in doubt, with the reason);
  once the store is back the proxy still commits what it holds.

Each case counts duplicates (a tool that ran twice), lost results (an answered `200` whose
replay differs, or an in-doubt answer whose effect never settles) and stuck effects.
The store is made read-only for real (tests/proxy/test_read_only.py, `set_read_only`).
"""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.proxy import conftest as proxy_fixtures
from tests.proxy.conftest import ProxyHarness
from tests.proxy.test_read_only import set_read_only
from tests.support.servers import wait_until
from undolog.services.held import SPOOL_FILE

pytestmark = pytest.mark.slow

proxy_factory = proxy_fixtures.proxy_factory  # the fixtures, used here by name
demo_upstream = proxy_fixtures.demo_upstream

CALLERS = 32
TOOL_CALL = "/mcp/tool_call"
LEASE_SECONDS = 1.5
DEADLINE = 90.0


def outcome(response: httpx.Response) -> str:
    body = response.json()
    return f"{response.status_code} {body.get('status') or body.get('code')}"


@pytest.fixture
def holding_proxy(proxy_factory: Any, tmp_path: Path) -> ProxyHarness:
    harness: ProxyHarness = proxy_factory(
        lease_seconds=LEASE_SECONDS,
        lease_sweep_seconds=0.2,
        commit_retry_attempts=2,
        commit_retry_backoff_ms=10,
        spool_dir=str(tmp_path / "spool"),
        key_calls_per_second=1000.0,  # 32 callers at once, then a poll per effect
        key_call_burst=1000,
    )
    return harness


def _bodies() -> list[dict[str, Any]]:
    return [
        {"session_id": str(uuid.uuid4()), "tool_name": "slow", "step_index": 1,
         "args": {"seconds": 1.0}}
        for _ in range(CALLERS)
    ]  # fmt: skip


def _cut_under_load(proxy: ProxyHarness, bodies: list[dict[str, Any]]) -> list[httpx.Response]:
    """Send every call at once; once all are running upstream, the store stops taking writes.
    The answers (the store is still read-only on return)."""
    limits = httpx.Limits(max_connections=CALLERS, max_keepalive_connections=CALLERS)
    with ThreadPoolExecutor(CALLERS) as pool, proxy.client(limits=limits) as c:
        pending = [pool.submit(c.post, TOOL_CALL, json=body) for body in bodies]
        wait_until(lambda: len(proxy.counters("slow")) == CALLERS, timeout=DEADLINE,
                   what="every call to reach the upstream")  # fmt: skip
        set_read_only(proxy, True)
        return [p.result(timeout=DEADLINE) for p in pending]


def _settle(proxy: ProxyHarness, answers: list[httpx.Response]) -> tuple[list[str], float]:
    """Wait until every effect is committed (or the deadline); their states, and the seconds
    it took."""
    start = time.monotonic()
    with proxy.client() as c:

        def states() -> list[str]:
            return [
                str(c.get(f"/effects/{a.json()['effect_id']}").json().get("state")) for a in answers
            ]

        final: list[str] = []

        def all_committed() -> bool:
            final[:] = states()
            return all(s == "committed" for s in final)

        with contextlib.suppress(TimeoutError):
            wait_until(all_committed, timeout=DEADLINE, what="every held result to commit")
    return final, time.monotonic() - start


def _count(
    proxy: ProxyHarness,
    bodies: list[dict[str, Any]],
    answers: list[httpx.Response],
    final: list[str],
) -> tuple[int, int, int]:
    """(duplicates, lost, stuck)."""
    with proxy.client() as c:
        replays = [c.post(TOOL_CALL, json=body) for body in bodies]
    lost = 0
    for answer, replay, state in zip(answers, replays, final, strict=True):
        if answer.status_code == 200:
            if (
                outcome(replay) != "200 replayed"
                or replay.json()["result"] != answer.json()["result"]
            ):
                lost += 1
        elif state != "committed":  # in doubt with its result known to the proxy
            lost += 1
    stuck = sum(1 for s in final if s not in ("committed", "in_doubt", "failed"))
    duplicates = sum(1 for n in proxy.counters("slow").values() if n > 1)
    return duplicates, lost, stuck


def test_an_outage_longer_than_the_lease_under_32_callers_needs_no_operator(
    holding_proxy: ProxyHarness, seed: int, fault_report: Callable[..., str]
) -> None:
    proxy = holding_proxy
    bodies = _bodies()
    try:
        answers = _cut_under_load(proxy, bodies)
        said = [outcome(a) for a in answers]
        lease_over = time.monotonic() + 2 * LEASE_SECONDS
        wait_until(lambda: time.monotonic() > lease_over, what="the lease to run out")
    finally:
        set_read_only(proxy, False)
    restored = time.monotonic()
    final, _ = _settle(proxy, answers)
    with proxy.client() as c:
        fresh = c.post(TOOL_CALL, json={**_bodies()[0], "tool_name": "echo",
                                        "args": {"text": "after"}})  # fmt: skip
    recovery = time.monotonic() - restored
    duplicates, lost, stuck = _count(proxy, bodies, answers, final)
    fault_report(store=proxy.runtime.store.dialect, point="outage_longer_than_lease",
                 trials=CALLERS, duplicates=duplicates, lost=lost, stuck=stuck,
                 recovery=recovery)  # fmt: skip
    assert set(said) == {"200 executed"}, said  # every result written down, so answered
    assert outcome(fresh) == "200 executed", fresh.text
    assert final == ["committed"] * CALLERS, final
    assert (duplicates, lost, stuck) == (0, 0, 0)


def test_an_unwritable_spool_under_32_callers_never_answers_200_for_a_result_in_memory(
    holding_proxy: ProxyHarness, seed: int, fault_report: Callable[..., str]
) -> None:
    proxy = holding_proxy
    (Path(proxy.settings.spool_dir) / SPOOL_FILE).mkdir(parents=True)  # no line can be written
    bodies = _bodies()
    try:
        answers = _cut_under_load(proxy, bodies)
    finally:
        set_read_only(proxy, False)
    said = [outcome(a) for a in answers]
    final, _ = _settle(proxy, answers)
    duplicates, lost, stuck = _count(proxy, bodies, answers, final)
    fault_report(store=proxy.runtime.store.dialect, point="unwritable_spool", trials=CALLERS,
                 duplicates=duplicates, lost=lost, stuck=stuck)  # fmt: skip
    assert set(said) == {"409 effect_in_doubt"}, said
    assert all("spool" in a.json()["message"] for a in answers)
    assert final == ["committed"] * CALLERS, final
    assert (duplicates, lost, stuck) == (0, 0, 0)
