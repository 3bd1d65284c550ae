"""The webhook sender: delivers the outbox (migration 14) with retries, backoff and a cap.

A trigger writes one outbox row per subscribed webhook in the transaction that writes the
event it announces, so nothing announced is lost if a process dies. Each process runs one
sender. It claims due rows in a short transaction (PostgreSQL: `FOR UPDATE SKIP LOCKED`)
and moves their `next_attempt_us` to the end of a lease longer than an attempt can take,
so one row is sent by one process at a time; a process that dies mid-attempt leaves the row
due again when the lease ends. Then it POSTs, outside any transaction, and settles the row:
`delivered` on a 2xx answer; otherwise due again after `backoff * 2^(attempts-1)` (capped),
and `dead` after `max_attempts`. See docs/notifications.md.

Network safety: URLs are operator config only; every attempt has a total timeout; redirects
are never followed (a 3xx is a failed attempt); a receiver's body is never read, logged or
stored (the recorded error is a status code or an exception's class name).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import enum
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson

from undolog.services.events import CHANNEL, stop_background
from undolog.services.webhook_messages import SIGNATURE_HEADER, build_message, sign
from undolog.store import Store
from undolog.store.records import ApprovalRecord, EventRecord, WebhookDeliveryRecord
from undolog_sdk.wire import EventType

__all__ = [
    "WEBHOOK_EVENTS",
    "WEBHOOK_KINDS",
    "DeliveryState",
    "WebhookConfig",
    "WebhookSender",
    "backoff_seconds",
    "subscriptions",
]

# The events a webhook may ask for (all of them by default): an approval requested,
# decided (approved, auto-approved or rejected), approved by one of several approvers, or
# timed out, and a compensation that gave up and needs a person.
WEBHOOK_EVENTS = tuple(
    e.value
    for e in (
        EventType.APPROVAL_REQUIRED,
        EventType.APPROVAL_APPROVED,
        EventType.APPROVAL_PARTIALLY_APPROVED,
        EventType.APPROVAL_REJECTED,
        EventType.APPROVAL_TIMED_OUT,
        EventType.COMPENSATION_FAILED,
    )
)
WEBHOOK_KINDS = ("json", "slack")


@dataclass(frozen=True)
class WebhookConfig:
    """One webhook of an org. `kind` `json`: UndoLog's signed JSON body; `slack`: a
    Slack-compatible message (signed too when a secret is given)."""

    name: str
    url: str
    secret: str | None = dataclasses.field(default=None, repr=False)
    kind: str = "json"
    events: tuple[str, ...] = WEBHOOK_EVENTS


BATCH = 16  # rows claimed at once
POLL_SECONDS = 1.0  # retries fall due without an event to wake the sender


class DeliveryState(enum.StrEnum):
    """The life of an outbox row: `pending → delivered | dead`."""

    PENDING = "pending"  # due at `next_attempt_us` (or claimed until then)
    DELIVERED = "delivered"  # a 2xx answer
    DEAD = "dead"  # `max_attempts` failed, or its webhook is no longer configured


def backoff_seconds(attempts: int, base: float, cap: float) -> float:
    """The wait after the `attempts`-th failed attempt: `base * 2^(attempts-1)`, at most
    `cap`."""
    return float(min(cap, base * 2 ** min(max(attempts - 1, 0), 62)))


def subscriptions(
    orgs: Iterable[tuple[str, Iterable[WebhookConfig]]],
) -> list[tuple[str, str, str]]:
    """The `(org_id, event_type, webhook)` rows the config asks for."""
    return [
        (org_id, event_type, hook.name)
        for org_id, hooks in orgs
        for hook in hooks
        for event_type in hook.events
    ]


def _now_us() -> int:
    return time.time_ns() // 1000


@dataclass
class WebhookSender:
    """One per process: claims due outbox rows, POSTs them, settles them."""

    store: Store
    hooks: dict[tuple[str, str], WebhookConfig]  # (org_id, name) → its config
    dashboard_url: str
    log: Any
    timeout_seconds: float = 5.0
    max_attempts: int = 10
    backoff_seconds: float = 1.0
    backoff_max_seconds: float = 300.0
    poll_seconds: float = POLL_SECONDS
    clock_us: Callable[[], int] = _now_us
    _wake: asyncio.Event = field(default_factory=asyncio.Event)
    _task: asyncio.Task[None] | None = None
    _http: aiohttp.ClientSession | None = None
    _closers: list[Any] = field(default_factory=list)

    @property
    def lease_us(self) -> int:
        """How long a claim holds a row: longer than an attempt can take."""
        return int((2 * self.timeout_seconds + 5) * 1_000_000)

    async def start(self) -> None:
        """Start sending (a no-op without webhooks: the outbox then stays empty)."""
        if not self.hooks:
            return
        self._http = aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=self.timeout_seconds),
            connector=aiohttp.TCPConnector(limit=8),
            # Never proxies from the environment: a webhook goes where the config says.
            trust_env=False,
            # Every org's deliveries share this client: a receiver's cookie is not kept.
            cookie_jar=aiohttp.DummyCookieJar(),
        )
        self._closers.append(self.store.on_events(self._wake.set))
        self._closers.append(await self.store.listen(CHANNEL, self._wake.set))
        self._task = asyncio.create_task(self._run())

    async def stop(self) -> None:
        await stop_background(self._task, self._closers)
        if self._http is not None:
            await self._http.close()

    async def _run(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self.poll_seconds)
            self._wake.clear()
            try:
                while await self.run_once() == BATCH:
                    pass
            except Exception:  # the store is down: try again at the next poll
                self.log.warning("webhook_sender_failed", exc_info=True)

    async def run_once(self) -> int:
        """Claim the due rows (up to a batch), deliver them at once; how many it claimed."""
        now = self.clock_us()
        async with self.store.transaction() as q:
            claimed = await q.claim_webhook_deliveries(
                now, now + self.lease_us, BATCH, pending=DeliveryState.PENDING
            )
            approvals: dict[int, ApprovalRecord | None] = {}
            for _, event in claimed:
                approval_id = _approval_id(event)
                approvals[event.event_id] = (
                    await q.get_approval(event.org_id, approval_id) if approval_id else None
                )
        await asyncio.gather(
            *(self._deliver(row, event, approvals[event.event_id]) for row, event in claimed)
        )
        return len(claimed)

    async def _deliver(
        self, row: WebhookDeliveryRecord, event: EventRecord, approval: ApprovalRecord | None
    ) -> None:
        hook = self.hooks.get((row.org_id, row.webhook))
        if hook is None:
            await self._settle(row, DeliveryState.DEAD, "webhook no longer configured")
            return
        error = await self._post(hook, event, approval)
        if error is None:
            await self._settle(row, DeliveryState.DELIVERED, None)
        elif row.attempts >= self.max_attempts:
            await self._settle(row, DeliveryState.DEAD, error)
        else:
            delay = backoff_seconds(row.attempts, self.backoff_seconds, self.backoff_max_seconds)
            await self._settle(row, DeliveryState.PENDING, error, int(delay * 1_000_000))

    async def _post(
        self, hook: WebhookConfig, event: EventRecord, approval: ApprovalRecord | None
    ) -> str | None:
        """One attempt; None when the receiver took it (2xx), else why not (no body text)."""
        assert self._http is not None
        message = build_message(hook.kind, event, approval, self.dashboard_url)
        headers = dict(message.headers)
        if hook.secret:
            headers[SIGNATURE_HEADER] = sign(hook.secret, int(time.time()), message.body)
        try:
            async with self._http.post(
                hook.url, data=message.body, headers=headers, allow_redirects=False
            ) as response:
                status = response.status
        except TimeoutError:
            return "timeout"
        except aiohttp.ClientError as exc:
            return f"connection failed ({type(exc).__name__})"
        if 200 <= status < 300:
            return None
        if 300 <= status < 400:
            return f"HTTP {status} (redirects are not followed)"
        return f"HTTP {status}"

    async def _settle(
        self, row: WebhookDeliveryRecord, state: DeliveryState, error: str | None, delay_us: int = 0
    ) -> None:
        now = self.clock_us()
        try:
            async with self.store.transaction() as q:
                await q.settle_webhook_delivery(
                    row.delivery_id, row.attempts, state=state, next_attempt_us=now + delay_us,
                    last_error=error, now_us=now, pending=DeliveryState.PENDING,
                )  # fmt: skip
        except Exception:
            # The row stays claimed until its lease ends, then is due again: a delivered
            # one may be sent twice (receivers deduplicate by the event id).
            self.log.warning("webhook_settle_failed", delivery_id=row.delivery_id, exc_info=True)
            return
        log = self.log.info if state is DeliveryState.DELIVERED else self.log.warning
        log(
            f"webhook_{state.value}",
            org_id=row.org_id,
            webhook=row.webhook,
            event_id=row.event_id,
            delivery_id=row.delivery_id,
            attempt=row.attempts,
            error=error,
        )


def _approval_id(event: EventRecord) -> str | None:
    if not event.type.startswith("approval_"):
        return None
    value = orjson.loads(event.payload_json).get("approval_id")
    return value if isinstance(value, str) else None
