"""The quotas of valid keys on their own (services/quotas.py), on an injected clock: the token
buckets' refill and Retry-After, new sessions told from known ones without the store unless
the tokens are spent, the event-stream caps, and bounded memory.
(Through the app: tests/proxy/test_key_quotas.py.)"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import pytest

from undolog.services.quotas import (
    KeyQuotas,
    Quota,
    QuotaExceeded,
    TokenBuckets,
    agent_stream_cap,
    check_streams,
)

pytestmark = pytest.mark.security


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Store:
    """What `admit` asks of the store: whether a session exists (and how often it asked)."""

    def __init__(self, *existing: str) -> None:
        self.existing = set(existing)
        self.asked: list[str] = []

    def exists(self, session: str) -> Callable[[], Awaitable[bool]]:
        async def ask() -> bool:
            self.asked.append(session)
            return session in self.existing

        return ask


def test_a_bucket_gives_its_burst_then_one_token_per_interval() -> None:
    clock = Clock()
    buckets = TokenBuckets(2.0, 3, clock=clock)
    assert [buckets.take("k") for _ in range(3)] == [None, None, None]
    assert buckets.take("k") == pytest.approx(0.5)
    assert buckets.take("other") is None  # per key
    clock.now += 0.5
    assert buckets.take("k") is None
    assert buckets.take("k") == pytest.approx(0.5)
    clock.now += 60  # refills up to the burst, no further
    assert [buckets.take("k") for _ in range(4)][3] is not None


def test_a_steady_flood_gets_the_rate_and_no_more() -> None:
    clock = Clock()
    buckets = TokenBuckets(10.0, 20, clock=clock)
    taken = 0
    for _ in range(10_000):  # 1000 tries a second for 10 s
        clock.now += 0.001
        taken += buckets.take("k") is None
    assert 20 + 99 <= taken <= 20 + 101


def test_buckets_are_bounded_and_forget_full_ones_first() -> None:
    clock = Clock()
    buckets = TokenBuckets(1.0, 5, max_keys=100, clock=clock)
    for n in range(100):
        buckets.take(f"idle-{n}")
    clock.now += 10  # all refilled: forgetting them changes nothing
    buckets.take("busy")
    for _ in range(4):
        buckets.take("busy")
    for n in range(1000):
        buckets.take(f"new-{n}")
    assert len(buckets) <= 100


async def test_calls_over_the_burst_are_refused_with_when_to_retry() -> None:
    clock = Clock()
    quotas = KeyQuotas(calls_per_second=0.5, call_burst=2, sessions_per_minute=60, clock=clock)
    store = Store()
    assert await quotas.admit("k", "s", store.exists("s")) is None
    assert await quotas.admit("k", "s", store.exists("s")) is None
    over = await quotas.admit("k", "s", store.exists("s"))
    assert isinstance(over, QuotaExceeded)
    assert (over.code, over.http_status, over.quota) == ("rate_limited", 429, Quota.CALLS)
    assert over.fields() == {"retry_after": 2, "quota": "calls"}
    assert await quotas.admit("j", "t", store.exists("t")) is None  # another key
    clock.now += 2
    assert await quotas.admit("k", "s", store.exists("s")) is None


async def test_known_sessions_cost_no_session_token_and_no_store_read() -> None:
    clock = Clock()
    quotas = KeyQuotas(calls_per_second=1000, call_burst=1000, sessions_per_minute=2, clock=clock)
    store = Store()
    for _ in range(50):
        assert await quotas.admit("k", "a", store.exists("a")) is None
    assert await quotas.admit("k", "b", store.exists("b")) is None
    over = await quotas.admit("k", "c", store.exists("c"))
    assert isinstance(over, QuotaExceeded)
    assert over.quota is Quota.NEW_SESSIONS
    assert over.retry_after == 30  # a token a minute / 2
    assert store.asked == ["c"]  # the store only once the tokens were spent
    assert await quotas.admit("k", "a", store.exists("a")) is None
    assert await quotas.admit("other", "c", store.exists("c")) is None  # per key


async def test_a_session_that_exists_is_admitted_when_the_tokens_are_spent() -> None:
    quotas = KeyQuotas(calls_per_second=1000, call_burst=1000, sessions_per_minute=1)
    store = Store("old")
    assert await quotas.admit("k", "new", store.exists("new")) is None
    assert await quotas.admit("k", "old", store.exists("old")) is None
    assert await quotas.admit("k", "old", store.exists("old")) is None
    assert store.asked == ["old"]  # remembered after the first read
    assert await quotas.admit("k", "newer", store.exists("newer")) is not None


async def test_the_memory_of_known_sessions_is_bounded() -> None:
    quotas = KeyQuotas(
        calls_per_second=1e6, call_burst=10**6, sessions_per_minute=10**6, max_known_sessions=50
    )
    store = Store()
    for n in range(1000):
        assert await quotas.admit("k", f"s{n}", store.exists(f"s{n}")) is None
    assert len(quotas._known) == 50


def stream(key: str, agent: bool = False) -> tuple[str, bool]:
    return (key, agent)


def test_a_key_may_hold_its_streams_and_no_more() -> None:
    held = [stream("a", True), stream("a", True)]
    check_streams(held[:1], "a", agent=True, max_per_key=2, org_cap=100)
    with pytest.raises(QuotaExceeded) as raised:
        check_streams(held, "a", agent=True, max_per_key=2, org_cap=100)
    assert raised.value.fields() == {"retry_after": 5, "quota": "event_streams"}
    check_streams(held, "b", agent=True, max_per_key=2, org_cap=100)
    check_streams(held, "a", agent=True, max_per_key=None, org_cap=100)


def test_agent_keys_together_leave_a_quarter_of_the_orgs_streams() -> None:
    assert agent_stream_cap(100) == 75
    assert agent_stream_cap(1) == 1
    agents = [stream(f"agent-{n}", True) for n in range(75)]
    with pytest.raises(QuotaExceeded):
        check_streams(agents, "agent-new", agent=True, max_per_key=10, org_cap=100)
    check_streams(agents, "approver", agent=False, max_per_key=10, org_cap=100)
