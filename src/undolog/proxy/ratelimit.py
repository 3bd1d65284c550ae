"""A limit on failed authentication per client address: key checks, the metrics token and
dashboard sign-ins.

Only failures count, and only failures are refused: a request with a valid key is never
slowed, whatever the address did before. After `limit` failures within `window_seconds`, a
further failure from that address answers `429 rate_limited` with `Retry-After` (when the
oldest failure in the window ages out) instead of saying whether the key was wrong.

Memory is bounded: per address at most `limit` timestamps, and at most `max_clients`
addresses (the one that failed longest ago is forgotten first), so a flood of addresses
cannot grow it. In memory and per process: a restart forgets, and each process of a
multi-process deployment counts on its own. The address is the connection's peer unless that
peer is a reverse proxy named in `forwarded_allow_ips` (then uvicorn puts the client its
`X-Forwarded-For` names in the scope); behind a proxy not named there every client shares the
proxy's address and the limit applies to all of them together (valid keys still pass).
"""

from __future__ import annotations

import math
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from typing import Any

__all__ = ["FailureLimiter", "client_address"]


def client_address(scope: Any) -> str:
    """The peer address of an ASGI connection ("unknown" when the server gives none)."""
    client = scope.get("client")
    return str(client[0]) if client else "unknown"


class FailureLimiter:
    """Sliding window of failed attempts per client address."""

    def __init__(
        self,
        limit: int,
        window_seconds: float,
        *,
        max_clients: int = 10_000,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.limit = max(1, limit)
        self.window = max(0.001, window_seconds)
        self.max_clients = max(1, max_clients)
        self._clock = clock
        self._failures: OrderedDict[str, deque[float]] = OrderedDict()

    def _recent(self, client: str, now: float) -> deque[float] | None:
        times = self._failures.get(client)
        if times is None:
            return None
        while times and times[0] <= now - self.window:
            times.popleft()
        if not times:
            del self._failures[client]
            return None
        return times

    def retry_after(self, client: str) -> int | None:
        """Seconds until `client` may fail again without a 429; None if it may now."""
        now = self._clock()
        times = self._recent(client, now)
        if times is None or len(times) < self.limit:
            return None
        return max(1, math.ceil(times[0] + self.window - now))

    def failed(self, client: str) -> int | None:
        """Record a failure; the Retry-After seconds if `client` was already at the limit
        (this failure is then answered 429), else None."""
        blocked = self.retry_after(client)
        now = self._clock()
        times = self._failures.pop(client, None)
        if times is None:
            times = deque(maxlen=self.limit)
        times.append(now)
        self._failures[client] = times  # most recent last: the oldest goes first below
        while len(self._failures) > self.max_clients:
            self._failures.popitem(last=False)
        return blocked

    def __len__(self) -> int:
        return len(self._failures)
