"""The failure limiter on its own: the sliding window, Retry-After, and bounded memory.
(Through a real proxy: tests/ui/test_origins_and_limits.py and test_metrics_auth.py.)"""

from __future__ import annotations

import pytest

from undolog.proxy.ratelimit import FailureLimiter

pytestmark = pytest.mark.security


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_the_failure_after_the_limit_is_refused_until_the_oldest_ages_out() -> None:
    clock = Clock()
    limiter = FailureLimiter(3, 60.0, clock=clock)
    assert [limiter.failed("a") for _ in range(3)] == [None, None, None]
    clock.now += 10
    assert limiter.failed("a") == 50  # the first failure leaves the window in 50 s
    assert limiter.failed("b") is None  # per address
    clock.now += 50
    assert limiter.retry_after("a") is None  # the first three aged out; the 4th remains
    assert limiter.failed("a") is None


def test_a_steady_attacker_stays_limited() -> None:
    clock = Clock()
    limiter = FailureLimiter(2, 10.0, clock=clock)
    limiter.failed("a")
    limiter.failed("a")
    for _ in range(20):
        clock.now += 4
        assert limiter.failed("a") is not None


def test_memory_is_bounded_by_addresses_and_by_the_limit() -> None:
    clock = Clock()
    limiter = FailureLimiter(5, 60.0, max_clients=100, clock=clock)
    for n in range(10_000):
        limiter.failed(f"10.0.{n // 256}.{n % 256}")
    assert len(limiter) == 100
    for _ in range(1000):
        limiter.failed("one")
    assert len(limiter._failures["one"]) == 5
    clock.now += 61
    assert limiter.retry_after("one") is None
    assert len(limiter) == 99  # an address is forgotten once its failures aged out
