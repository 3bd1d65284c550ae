"""The event broker: one per process, fanning new event rows out to live subscribers.

It reads new event rows from the store and fans them out to its subscribers, each with a
bounded queue (a slow subscriber loses events, counted in
`undolog_proxy_sse_events_dropped_total`, rather than slowing everyone). It wakes when this
process commits events, when another process announces some (PostgreSQL LISTEN/NOTIFY), and
every `poll_seconds` in any case (SQLite files shared by processes have no notifications).

Event ids come from a sequence, assigned at insert: on PostgreSQL a transaction can commit
after another that took a higher id. The broker therefore only hands out ids up to its
*high-water mark*, the highest id below which it has seen every row; a hole is waited for up
to `gap_grace_seconds` (a rolled-back insert leaves one forever) and then skipped. A client
that resumes from an id the broker handed out therefore misses nothing.

Streams are capped per org (`max_per_org`) and, so that one key cannot take them all, per key
(`max_per_key`) with the org's agent keys together held to a share of them
(`services/quotas.py`).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from undolog.services.metrics import ProxyMetrics
from undolog.services.quotas import check_streams
from undolog.store import EventRecord, Store

__all__ = ["REPLAY_PAGE", "EventBroker", "Subscriber", "stop_background"]

CHANNEL = "undolog_events"
ANNOUNCE_EVERY_SECONDS = 0.05
REPLAY_PAGE = 500


async def stop_background(task: asyncio.Task[None] | None, closers: list[Any]) -> None:
    """Cancel a background loop, then run its closers (listeners, sync or async)."""
    if task is not None:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    for close in closers:
        result = close()
        if asyncio.iscoroutine(result):
            await result


@dataclass(eq=False)
class Subscriber:
    org_id: str
    queue: asyncio.Queue[EventRecord]
    key_id: str | None = None  # the API key that opened it (None: no key behind it)
    agent: bool = False  # opened by an agent key


@dataclass
class EventBroker:
    store: Store
    metrics: ProxyMetrics
    queue_size: int = 1000
    max_per_org: int = 100
    max_per_key: int | None = None  # streams per API key (None: no cap but the org's)
    poll_seconds: float = 0.25
    gap_grace_seconds: float = 2.0
    hwm: int = 0
    _subscribers: dict[str, set[Subscriber]] = field(default_factory=dict)
    # Long waits (services/waits.py): (org, effect id) → callbacks run on each of its events.
    _watchers: dict[tuple[str, str], set[Callable[[], None]]] = field(default_factory=dict)
    _wake: asyncio.Event = field(default_factory=asyncio.Event)
    _task: asyncio.Task[None] | None = None
    _gap_since: float | None = None
    _closers: list[Any] = field(default_factory=list)
    _advancing: asyncio.Lock = field(default_factory=asyncio.Lock)
    _announce: bool = False  # this process committed events other processes have not heard of
    _last_announce: float = 0.0

    async def start(self) -> None:
        async with self.store.reader() as q:
            latest = await q.list_events_since(0, 1, newest=True)
        self.hwm = latest[0].event_id if latest else 0
        self._closers.append(self.store.on_events(self._local_commit))
        close_listen = await self.store.listen(CHANNEL, self._wake.set)
        self._closers.append(close_listen)
        self._task = asyncio.create_task(self._run())

    async def stop(self) -> None:
        await stop_background(self._task, self._closers)

    def _local_commit(self) -> None:
        self._announce = True
        if self._watchers or any(self._subscribers.values()):  # someone here wants it now
            self._wake.set()

    async def _run(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self.poll_seconds)
            self._wake.clear()
            now = time.monotonic()
            if self._announce and now - self._last_announce >= ANNOUNCE_EVERY_SECONDS:
                # At most one NOTIFY per interval, however many commits: the hot path
                # never pays for it, and listeners re-read everything new anyway.
                self._announce = False
                self._last_announce = now
                with contextlib.suppress(Exception):  # other processes still poll
                    await self.store.announce(CHANNEL)
            # Without subscribers this runs once per poll (commits do not wake it), which
            # keeps the high-water mark current so a first subscriber has little to read;
            # it then reads the events' ids only (`_read_since`).
            try:
                await self._advance()
            except Exception:  # the store is down: keep polling
                await asyncio.sleep(self.poll_seconds)

    async def catch_up(self) -> None:
        """Read up to the present (a new subscriber's replay ends at `hwm`)."""
        with contextlib.suppress(Exception):
            await self._advance()

    async def _advance(self) -> None:
        async with self._advancing:  # the loop and a new subscriber's catch-up take turns
            await self._advance_locked()

    def _listened(self) -> bool:
        return bool(self._watchers) or any(self._subscribers.values())

    async def _read_since(self) -> list[EventRecord] | list[int] | None:
        """The next page above `hwm`: the events, or only their ids while nobody listens
        (the high-water mark needs the ids alone). None: someone began to listen while the
        ids were read, so the events must be read after all."""
        if not self._listened():
            async with self.store.reader() as q:
                ids = await q.list_event_ids_since(self.hwm, REPLAY_PAGE)
            return None if self._listened() else ids
        async with self.store.reader() as q:
            return await q.list_events_since(self.hwm, REPLAY_PAGE)

    async def _advance_locked(self) -> None:
        while True:
            rows = await self._read_since()
            if rows is None:
                continue
            if not rows:
                return
            for event in rows:
                event_id = event if isinstance(event, int) else event.event_id
                if event_id != self.hwm + 1:
                    now = time.monotonic()
                    if self._gap_since is None:
                        self._gap_since = now
                    if now - self._gap_since < self.gap_grace_seconds:
                        self._wake.set()  # look again soon: the hole may fill
                        await asyncio.sleep(0.02)
                        return
                self._gap_since = None
                self.hwm = event_id
                if not isinstance(event, int):
                    self._deliver(event)
            if len(rows) < REPLAY_PAGE:
                return

    def _deliver(self, event: EventRecord) -> None:
        if event.effect_id is not None:
            for callback in tuple(self._watchers.get((event.org_id, event.effect_id), ())):
                callback()
        for sub in self._subscribers.get(event.org_id, ()):
            try:
                sub.queue.put_nowait(event)
            except asyncio.QueueFull:
                self.metrics.sse_events_dropped.labels(event.org_id).inc()

    def watch(
        self, org_id: str, effect_id: str, callback: Callable[[], None]
    ) -> Callable[[], None]:
        """Run `callback` on each event of one effect this broker hands out, from any process
        (PostgreSQL: NOTIFY; SQLite: the poll); returns the remover."""
        key = (org_id, effect_id)
        self._watchers.setdefault(key, set()).add(callback)

        def remove() -> None:
            callbacks = self._watchers.get(key)
            if callbacks is not None:
                callbacks.discard(callback)
                if not callbacks:
                    del self._watchers[key]

        return remove

    def subscribe(
        self, org_id: str, key_id: str | None = None, *, agent: bool = False
    ) -> Subscriber | None:
        """A new subscriber for `key_id` (an agent key: `agent`), or None when the org
        already has `max_per_org`.

        Raises:
            QuotaExceeded: the key already holds `max_per_key` streams, or it is an agent key
                and the org's agent keys hold their share (`services.quotas.check_streams`).
        """
        subs = self._subscribers.setdefault(org_id, set())
        if len(subs) >= self.max_per_org:
            return None
        if key_id is not None:
            check_streams(
                ((s.key_id, s.agent) for s in subs),
                key_id,
                agent=agent,
                max_per_key=self.max_per_key,
                org_cap=self.max_per_org,
            )
        sub = Subscriber(org_id, asyncio.Queue(self.queue_size), key_id, agent)
        subs.add(sub)
        self.metrics.sse_subscribers.labels(org_id).set(len(subs))
        return sub

    def unsubscribe(self, sub: Subscriber) -> None:
        subs = self._subscribers.get(sub.org_id, set())
        subs.discard(sub)
        self.metrics.sse_subscribers.labels(sub.org_id).set(len(subs))
