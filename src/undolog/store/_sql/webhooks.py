"""Shared SQL, part 3: the webhook outbox (migration 14, docs/notifications.md).

Rows are written by a trigger on `events` (in the transaction that writes the event); here
they are claimed, settled and listed. States are parameters, as everywhere in the store.
"""

from __future__ import annotations

import abc
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from undolog.store._columns import columns
from undolog.store._sql.rows import EVENT
from undolog.store.records import EventRecord, WebhookDeliveryRecord

DELIVERY = columns(WebhookDeliveryRecord)


class WebhookSql(abc.ABC):
    """Statements on `webhook_subscriptions` and `webhook_outbox`."""

    # On PostgreSQL a claim locks its rows (" FOR UPDATE SKIP LOCKED"); SQLite's single
    # writer needs nothing.
    _SKIP_LOCKED = ""

    @abc.abstractmethod
    async def _fetch(self, sql: str, *args: Any) -> list[Sequence[Any]]: ...

    @abc.abstractmethod
    async def _execute(self, sql: str, *args: Any) -> int: ...

    async def replace_webhook_subscriptions(
        self, subscriptions: Sequence[tuple[str, str, str]]
    ) -> None:
        """Make the subscriptions exactly these `(org_id, event_type, webhook)` rows."""
        await self._execute("DELETE FROM webhook_subscriptions")
        for org_id, event_type, webhook in subscriptions:
            await self._execute(
                "INSERT INTO webhook_subscriptions (org_id, event_type, webhook) "
                "VALUES (?, ?, ?) ON CONFLICT DO NOTHING",
                org_id,
                event_type,
                webhook,
            )

    async def claim_webhook_deliveries(
        self, now_us: int, lease_until_us: int, limit: int, *, pending: str
    ) -> list[tuple[WebhookDeliveryRecord, EventRecord]]:
        """Due `pending` rows, oldest first, with their events; each claimed (attempts + 1,
        not due again before `lease_until_us`). Inside a transaction."""
        rows = await self._fetch(
            f"SELECT {DELIVERY.select()} FROM webhook_outbox WHERE state = ? "
            f"AND next_attempt_us <= ? ORDER BY next_attempt_us, delivery_id "
            f"LIMIT ?{self._SKIP_LOCKED}",
            pending,
            now_us,
            limit,
        )
        claimed = []
        for row in rows:
            record = DELIVERY.row(row)
            await self._execute(
                "UPDATE webhook_outbox SET attempts = attempts + 1, next_attempt_us = ?, "
                "updated_us = ? WHERE delivery_id = ?",
                lease_until_us,
                now_us,
                record.delivery_id,
            )
            events = await self._fetch(
                f"SELECT {EVENT.select()} FROM events WHERE event_id = ?", record.event_id
            )
            if not events:  # pragma: no cover - events are never deleted
                continue
            mine = replace(
                record,
                attempts=record.attempts + 1,
                next_attempt_us=lease_until_us,
                updated_us=now_us,
            )
            claimed.append((mine, EVENT.row(events[0])))
        return claimed

    async def settle_webhook_delivery(
        self,
        delivery_id: int,
        attempts: int,
        *,
        state: str,
        next_attempt_us: int,
        last_error: str | None,
        now_us: int,
        pending: str,
    ) -> bool:
        """Record one attempt's outcome, if the row is still the claim of that attempt (a
        sender whose lease ran out, and whose row was claimed again, changes nothing)."""
        changed = await self._execute(
            "UPDATE webhook_outbox SET state = ?, next_attempt_us = ?, last_error = ?, "
            "updated_us = ? WHERE delivery_id = ? AND attempts = ? AND state = ?",
            state,
            next_attempt_us,
            last_error,
            now_us,
            delivery_id,
            attempts,
            pending,
        )
        return changed == 1

    async def list_webhook_deliveries(
        self, org_id: str | None, state: str | None, limit: int
    ) -> list[WebhookDeliveryRecord]:
        """Outbox rows, newest first; of one org and one state when given."""
        where, args = [], []
        if org_id is not None:
            where.append("org_id = ?")
            args.append(org_id)
        if state is not None:
            where.append("state = ?")
            args.append(state)
        clause = f"WHERE {' AND '.join(where)} " if where else ""
        rows = await self._fetch(
            f"SELECT {DELIVERY.select()} FROM webhook_outbox {clause}"
            "ORDER BY delivery_id DESC LIMIT ?",
            *args,
            limit,
        )
        return [DELIVERY.row(r) for r in rows]
