"""Long waits: hold a request until something happens to an effect, or a deadline passes.

`GET /approvals/{id}?wait=N` waits for a person's decision this way (docs/mcp.md, "Long
waits"). A wait sleeps on the event broker (services/events.py): each event of the effect
wakes it, from this process or, on PostgreSQL, another one (LISTEN/NOTIFY); it then reads the
store again. No polling loop: a wait costs a callback and an `asyncio.Event` until then.

Waits are bounded: at most `MAX_WAIT_SECONDS` each, `max_per_key` at once per API key and
`max_total` at once per process. Over a cap the request is answered at once with
`429 rate_limited` (Retry-After), so many waits cannot exhaust the server.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field

from undolog.services.events import EventBroker
from undolog_sdk.errors import RateLimited, UndoLogError

__all__ = ["MAX_WAIT_SECONDS", "TooManyWaits", "Waits"]

# An approved call's run has not finished while its effect is in one of these.

MAX_WAIT_SECONDS = 55  # under the ~60 s request timeout of MCP clients
DEFAULT_MAX_PER_KEY = 10
DEFAULT_MAX_TOTAL = 500
RETRY_AFTER_SECONDS = 1


class TooManyWaits(RateLimited):
    """This key (or this process) already holds as many long waits as it may."""

    def __init__(self, retry_after: int = RETRY_AFTER_SECONDS) -> None:
        self.retry_after = retry_after
        UndoLogError.__init__(
            self,
            f"too many long waits at once for this key or server; retry after {retry_after}s "
            "or without ?wait",
        )


@dataclass
class Waits:
    """The long waits of one process."""

    broker: EventBroker
    max_per_key: int = DEFAULT_MAX_PER_KEY
    max_total: int = DEFAULT_MAX_TOTAL
    _per_key: dict[str, int] = field(default_factory=dict)
    _total: int = 0

    @contextlib.contextmanager
    def slot(self, key_id: str) -> Iterator[None]:
        """Hold one of the key's (and the process's) wait slots, or raise `TooManyWaits`."""
        held = self._per_key.get(key_id, 0)
        if held >= self.max_per_key or self._total >= self.max_total:
            raise TooManyWaits()
        self._per_key[key_id] = held + 1
        self._total += 1
        try:
            yield
        finally:
            self._total -= 1
            left = self._per_key[key_id] - 1
            if left:
                self._per_key[key_id] = left
            else:
                del self._per_key[key_id]

    async def until(
        self,
        org_id: str,
        effect_id: str,
        done: Callable[[], Awaitable[bool]],
        seconds: float,
    ) -> bool:
        """Wait until `done()` holds — checked now and after each event of the effect — or
        `seconds` pass; whether it held."""
        woke = asyncio.Event()
        remove = self.broker.watch(org_id, effect_id, woke.set)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + min(seconds, MAX_WAIT_SECONDS)
        try:
            while True:
                woke.clear()  # before the check: an event after it wakes the wait below
                if await done():
                    return True
                remaining = deadline - loop.time()
                if remaining <= 0:
                    return False
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(woke.wait(), remaining)
        finally:
            remove()
