"""The webhook outbox (migration 14) on both stores: a trigger on `events` writes one row per
subscribed webhook in the event's own transaction; claims hold a row for one sender at a
time; a settle from a stale claim changes nothing."""

from __future__ import annotations

import pytest

from tests.store.contract_helpers import NOW, new_org, new_session
from undolog.store import Store

PENDING = "pending"
LEASE = 30_000_000


async def _subscribe(store: Store, *rows: tuple[str, str, str]) -> None:
    async with store.transaction() as q:
        await q.replace_webhook_subscriptions(list(rows))


async def _event(store: Store, org_id: str, type_: str) -> int:
    async with store.transaction() as q:
        return await q.insert_event(org_id, type_, new_session(), None, '{"approval_id":"a"}', NOW)


async def _rows(store: Store, org_id: str) -> list[tuple[str, int, str]]:
    async with store.reader() as q:
        found = await q.list_webhook_deliveries(org_id, None, 100)
    return sorted((r.webhook, r.event_id, r.state) for r in found)


async def test_an_event_writes_one_row_per_subscribed_webhook(store: Store) -> None:
    org, other = new_org(), new_org()
    await _subscribe(
        store,
        (org, "approval_required", "ops"),
        (org, "approval_required", "slack"),
        (org, "approval_rejected", "ops"),
        (other, "approval_required", "theirs"),
    )
    required = await _event(store, org, "approval_required")
    await _event(store, org, "effect_committed")  # nobody subscribed: no row
    rejected = await _event(store, org, "approval_rejected")
    assert await _rows(store, org) == [
        ("ops", required, PENDING),
        ("ops", rejected, PENDING),
        ("slack", required, PENDING),
    ]
    assert await _rows(store, other) == []


async def test_a_rolled_back_event_leaves_no_outbox_row(store: Store) -> None:
    org = new_org()
    await _subscribe(store, (org, "approval_required", "ops"))
    with pytest.raises(RuntimeError):
        async with store.transaction() as q:
            await q.insert_event(org, "approval_required", new_session(), None, "{}", NOW)
            raise RuntimeError("the approval's transaction fails")
    assert await _rows(store, org) == []


async def test_replacing_subscriptions_stops_new_rows_only(store: Store) -> None:
    org = new_org()
    await _subscribe(store, (org, "approval_required", "ops"))
    first = await _event(store, org, "approval_required")
    await _subscribe(store)  # the config lists no webhook any more
    await _event(store, org, "approval_required")
    assert await _rows(store, org) == [("ops", first, PENDING)]


async def test_a_claimed_row_is_not_claimed_again_until_its_lease_ends(store: Store) -> None:
    org = new_org()
    await _subscribe(store, (org, "approval_required", "ops"))
    event_id = await _event(store, org, "approval_required")
    async with store.transaction() as q:
        claimed = await q.claim_webhook_deliveries(NOW, NOW + LEASE, 100, pending=PENDING)
    mine = [(row, event) for row, event in claimed if row.org_id == org]
    assert len(mine) == 1
    row, event = mine[0]
    assert (row.attempts, event.event_id, event.type) == (1, event_id, "approval_required")
    async with store.transaction() as q:
        again = await q.claim_webhook_deliveries(NOW + LEASE - 1, NOW + 2 * LEASE, 100,
                                                 pending=PENDING)  # fmt: skip
    assert [r for r, _ in again if r.org_id == org] == []
    async with store.transaction() as q:  # the sender died: the lease ends, it is due again
        taken_over = await q.claim_webhook_deliveries(NOW + LEASE, NOW + 2 * LEASE, 100,
                                                      pending=PENDING)  # fmt: skip
    rows = [r for r, _ in taken_over if r.org_id == org]
    assert [r.attempts for r in rows] == [2]
    async with store.transaction() as q:  # the first sender's late settle changes nothing
        stale = await q.settle_webhook_delivery(
            row.delivery_id, 1, state="delivered", next_attempt_us=NOW, last_error=None,
            now_us=NOW, pending=PENDING,
        )  # fmt: skip
        current = await q.settle_webhook_delivery(
            row.delivery_id, 2, state="delivered", next_attempt_us=NOW, last_error=None,
            now_us=NOW, pending=PENDING,
        )  # fmt: skip
    assert (stale, current) == (False, True)
    assert await _rows(store, org) == [("ops", event_id, "delivered")]


async def test_postgres_switches_the_trigger_off_without_subscriptions(store: Store) -> None:
    """The trigger's cost (a plpgsql call per event) is paid only while webhooks exist."""
    if store.dialect != "postgres":
        pytest.skip("a PostgreSQL trigger switch")
    org = new_org()
    await _subscribe(store)
    await _event(store, org, "approval_required")
    await _subscribe(store, (org, "approval_required", "ops"))
    second = await _event(store, org, "approval_required")
    await _subscribe(store, (org, "approval_required", "ops"))  # no change: no ALTER
    assert await _rows(store, org) == [("ops", second, PENDING)]
