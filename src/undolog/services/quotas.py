"""Quotas of valid API keys: tool calls, new sessions and open event streams, per key.

Failed keys are limited per client address (`proxy/ratelimit.py`); these limit what one
*valid* key may do, so that one key — a runaway agent, or a stolen one — can neither flood the
server nor take its org's share of it:

- **tool calls** (REST `POST /mcp/tool_call` and MCP `tools/call`, both through
  `services.calls.run_call`): a token bucket per key, refilled at `calls_per_second`, holding
  `call_burst`;
- **new sessions**: a token bucket per key holding `sessions_per_minute`, refilled over a
  minute. A session is new to a key when this process has not seen the key call it (a bounded
  memory of recent (key, session) pairs), so the common call costs a dict lookup and no store
  round trip, and a new session is refused *before* anything is written. Such a session may
  still exist (opened through another worker, before a restart, or forgotten): only a key
  whose tokens are spent pays a read of the store then, and a session that exists is never
  refused;
- **event streams** (`GET /events`): at most `max_per_key` open at once per key, and the org's
  agent keys together at most `AGENT_STREAM_SHARE` of the org's streams, so approvers and
  admins (the dashboard) always find one (`services.events.EventBroker.subscribe`).

Over a quota the answer is `429 rate_limited` with `Retry-After` and the quota's name
(`quota`: `calls`, `new_sessions`, `event_streams`). The counts are in memory and per process:
with `--workers N` a key may get up to N times each figure (the kernel spreads its connections
over the workers), and a restart forgets them. Internal callers (no key: sweeps, approved
runs) are not counted.
"""

from __future__ import annotations

import math
import time
import uuid
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterable
from enum import StrEnum
from typing import Any

from undolog_sdk.errors import RateLimited, UndoLogError

__all__ = [
    "AGENT_STREAM_SHARE",
    "STREAM_RETRY_AFTER_SECONDS",
    "KeyQuotas",
    "Quota",
    "QuotaExceeded",
    "TokenBuckets",
    "agent_stream_cap",
    "check_streams",
    "session_exists",
]

# The share of an org's event streams its agent keys may hold together; the rest is kept for
# approvers and admins (the dashboard).
AGENT_STREAM_SHARE = 0.75
# A stream is given back when its client leaves, at a time no one knows: a fixed hint.
STREAM_RETRY_AFTER_SECONDS = 5
MAX_KEYS = 10_000  # buckets kept per quota (keys are valid ones: bounded by the key table)
MAX_KNOWN_SESSIONS = 100_000  # (key, session) pairs remembered: a few MB


class Quota(StrEnum):
    """Which quota refused (the error body's `quota`)."""

    CALLS = "calls"
    NEW_SESSIONS = "new_sessions"
    EVENT_STREAMS = "event_streams"


class QuotaExceeded(RateLimited):
    """A valid key is over one of its quotas: `429 rate_limited` with `retry_after`."""

    def __init__(self, quota: Quota, retry_after: int, message: str) -> None:
        self.quota = quota
        self.retry_after = retry_after
        UndoLogError.__init__(self, message)

    def fields(self) -> dict[str, Any]:
        return {"retry_after": self.retry_after, "quota": self.quota.value}


def _seconds(wait: float) -> int:
    """A wait as `Retry-After` says it: whole seconds, at least 1."""
    return max(1, math.ceil(wait))


class TokenBuckets:
    """A token bucket per key: `burst` tokens at most, `rate` tokens a second back.

    A key's first take finds a full bucket. At most `max_keys` buckets are kept: past that,
    the full ones (which say nothing a missing one would not) are dropped, then the oldest.
    """

    def __init__(
        self,
        rate: float,
        burst: float,
        *,
        max_keys: int = MAX_KEYS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.rate = rate
        self.burst = burst
        self.max_keys = max(1, max_keys)
        self._clock = clock
        self._buckets: dict[str, list[float]] = {}  # key → [tokens, when counted]

    def take(self, key: str) -> float | None:
        """Take a token for `key`: None when taken, else the seconds until one is back."""
        now = self._clock()
        bucket = self._buckets.get(key)
        if bucket is None:
            if len(self._buckets) >= self.max_keys:
                self._forget(now)
            self._buckets[key] = [self.burst - 1, now]
            return None
        tokens = min(self.burst, bucket[0] + (now - bucket[1]) * self.rate)
        bucket[1] = now
        if tokens >= 1:
            bucket[0] = tokens - 1
            return None
        bucket[0] = tokens
        return (1 - tokens) / self.rate

    def _forget(self, now: float) -> None:
        full = [
            key
            for key, (tokens, when) in self._buckets.items()
            if tokens + (now - when) * self.rate >= self.burst
        ]
        for key in full:
            del self._buckets[key]
        while len(self._buckets) >= self.max_keys:
            del self._buckets[next(iter(self._buckets))]

    def __len__(self) -> int:
        return len(self._buckets)


class KeyQuotas:
    """The call and new-session quotas of every key, in this process (see the module).

    Args:
        calls_per_second: tool calls a key may make per second, sustained.
        call_burst: tool calls a key may make at once (the call bucket's size).
        sessions_per_minute: new sessions a key may open per minute; as many at once.
        max_known_sessions: (key, session) pairs remembered as not new.
        clock: monotonic seconds (injectable for tests).
    """

    def __init__(
        self,
        *,
        calls_per_second: float,
        call_burst: int,
        sessions_per_minute: int,
        max_known_sessions: int = MAX_KNOWN_SESSIONS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.calls = TokenBuckets(calls_per_second, call_burst, clock=clock)
        self.sessions = TokenBuckets(sessions_per_minute / 60, sessions_per_minute, clock=clock)
        self.calls_per_second = calls_per_second
        self.call_burst = call_burst
        self.sessions_per_minute = sessions_per_minute
        self.max_known_sessions = max(1, max_known_sessions)
        self._known: OrderedDict[tuple[str, str], None] = OrderedDict()

    async def admit(
        self, key_id: str, session_id: str, exists: Callable[[], Awaitable[bool]]
    ) -> QuotaExceeded | None:
        """Count one tool call of `key_id` in `session_id`; the refusal if it is over a quota.

        `exists` asks the store whether the session exists; it is called only when the session
        is new to this process and the key's new-session tokens are spent.
        """
        wait = self.calls.take(key_id)
        if wait is not None:
            return QuotaExceeded(
                Quota.CALLS,
                _seconds(wait),
                f"this API key is over its quota of {self.calls_per_second:g} tool calls per "
                f"second (bursts of {self.call_burst}); retry after {_seconds(wait)}s",
            )
        pair = (key_id, session_id)
        known = self._known
        if pair in known:
            known.move_to_end(pair)
            return None
        wait = self.sessions.take(key_id)
        if wait is not None and not await exists():
            return QuotaExceeded(
                Quota.NEW_SESSIONS,
                _seconds(wait),
                f"this API key is over its quota of {self.sessions_per_minute} new sessions "
                f"per minute; its open sessions still take calls; retry after "
                f"{_seconds(wait)}s",
            )
        known[pair] = None
        if len(known) > self.max_known_sessions:
            known.popitem(last=False)
        return None


async def session_exists(store: Any, org_id: str, session_id: str) -> bool:
    """Whether the org has this session (an id that is no UUID: True, since the engine
    refuses the call before it could create one)."""
    try:
        canonical = str(uuid.UUID(session_id))
    except (ValueError, TypeError, AttributeError):
        return True
    async with store.reader() as q:
        found, _ = await q.session_owner(org_id, "session", canonical)
    return bool(found)


def agent_stream_cap(org_cap: int) -> int:
    """How many of an org's `org_cap` event streams its agent keys may hold together."""
    return max(1, math.floor(org_cap * AGENT_STREAM_SHARE))


def check_streams(
    held: Iterable[tuple[str | None, bool]],
    key_id: str,
    *,
    agent: bool,
    max_per_key: int | None,
    org_cap: int,
) -> None:
    """Raise `QuotaExceeded` if `key_id` may not open one more event stream.

    Args:
        held: the org's open streams, as (key id, opened by an agent key).
        agent: whether `key_id` is an agent key.
        max_per_key: streams per key (None: no cap but the org's).
        org_cap: the org's streams in this process.
    """
    mine = agents = 0
    for holder, by_agent in held:
        mine += holder == key_id
        agents += by_agent
    if max_per_key is not None and mine >= max_per_key:
        raise QuotaExceeded(
            Quota.EVENT_STREAMS,
            STREAM_RETRY_AFTER_SECONDS,
            f"this API key already has {mine} event streams open, its quota; close one "
            f"or retry after {STREAM_RETRY_AFTER_SECONDS}s",
        )
    cap = agent_stream_cap(org_cap)
    if agent and agents >= cap:
        raise QuotaExceeded(
            Quota.EVENT_STREAMS,
            STREAM_RETRY_AFTER_SECONDS,
            f"this organisation's agent keys already hold {agents} event streams, as many "
            f"as they may: the rest are kept for approvers and admins; retry after "
            f"{STREAM_RETRY_AFTER_SECONDS}s",
        )
