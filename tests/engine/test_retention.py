"""Retention (`undolog.engine.retention`) over both stores: what is pruned, what never is.

Rows are written through the store as the engine would leave them, at chosen times; the
pruner's clock is injected (`clock_us=`), so "older than the retention" is a matter of
arithmetic, never of waiting. Each test has its own org and passes it to `prune`, so tests
sharing the PostgreSQL database never prune each other's rows.
"""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import replace

import pytest

from tests.store.contract_helpers import NOW
from tests.store.test_mcp_tasks import TASK
from tests.support.retention import add_org, bulk_seed, seed, still_there
from undolog.engine.retention import DAY_US, PruneCounts, Retention
from undolog.store import Store, open_store

RETENTION_DAYS = 30
LATER = NOW + (RETENTION_DAYS + 1) * DAY_US  # the pruner's now: NOW is a day past the retention
YOUNG = LATER - DAY_US  # within the retention


@pytest.fixture
async def org(store: Store) -> str:
    org_id = f"org-{uuid.uuid4().hex[:12]}"
    await add_org(store, org_id, RETENTION_DAYS)
    return org_id


def pruner(store: Store) -> Retention:
    return Retention(store, clock_us=lambda: LATER)


async def test_an_org_keeps_its_retention_and_none_means_forever(store: Store) -> None:
    forever, monthly = f"org-{uuid.uuid4().hex[:12]}", f"org-{uuid.uuid4().hex[:12]}"
    await add_org(store, forever, None)
    await add_org(store, monthly, RETENTION_DAYS)
    async with store.reader() as q:
        assert (await q.get_org(forever)).retention_days is None  # type: ignore[union-attr]
        assert (await q.get_org(monthly)).retention_days == RETENTION_DAYS  # type: ignore[union-attr]
    old = await seed(store, forever)
    assert await pruner(store).prune(forever) == {}
    assert await still_there(store, forever, old)
    assert (forever, RETENTION_DAYS) not in await pruner(store).policies()
    assert (monthly, RETENTION_DAYS) in await pruner(store).policies()


async def test_an_old_finished_session_goes_with_everything_that_hangs_off_it(
    store: Store, org: str
) -> None:
    completed = await seed(
        store, org, effects=("committed", "committed", "failed"), undo=("pending",),
        approval="approved",
    )  # fmt: skip
    compensated = await seed(
        store, org, state="compensated", effects=("compensated",), undo=("compensated",)
    )
    report = await pruner(store).prune(org)
    assert report == {
        org: PruneCounts(sessions=2, effects=4, undo_entries=2, approvals=1, events=4)
    }
    assert not await still_there(store, org, completed)
    assert not await still_there(store, org, compensated)


async def test_a_young_session_and_another_org_are_kept(store: Store, org: str) -> None:
    young = await seed(store, org, at=YOUNG)
    other = f"org-{uuid.uuid4().hex[:12]}"
    await add_org(store, other, RETENTION_DAYS * 10)
    others = await seed(store, other)
    assert await pruner(store).prune(org) == {org: PruneCounts()}
    assert await still_there(store, org, young)
    assert await still_there(store, other, others)


async def test_failed_and_halted_sessions_go_once_nothing_is_left_to_unwind(
    store: Store, org: str
) -> None:
    unwound = await seed(
        store, org, state="failed", effects=("failed", "committed"), undo=("skipped", "resolved")
    )
    halted = await seed(store, org, state="halted", effects=("rejected",), approval="rejected")
    to_unwind = await seed(store, org, state="failed", effects=("committed",), undo=("pending",))
    gave_up = await seed(store, org, state="halted", effects=("committed",), undo=("failed",))
    await pruner(store).prune(org)
    assert not await still_there(store, org, unwound)
    assert not await still_there(store, org, halted)
    assert await still_there(store, org, to_unwind)
    assert await still_there(store, org, gave_up)


NEVER_PRUNED = {
    "an open session": {"state": "active"},
    "a session unwinding": {"state": "compensating", "effects": ("compensating",)},
    "a session whose unwinding failed": {
        "state": "compensation_failed",
        "effects": ("compensation_failed",),
        "undo": ("failed",),
    },
    "an effect in doubt": {"effects": ("committed", "in_doubt")},
    "an effect executing": {"effects": ("executing",)},
    "an effect pending": {"effects": ("pending",)},
    "an effect awaiting approval": {"effects": ("awaiting_approval",), "approval": "pending"},
    "a pending approval": {"effects": ("committed",), "approval": "pending"},
    "an undo entry running": {"effects": ("committed",), "undo": ("running",)},
    "an effect updated within the retention": {"effect_updated": YOUNG},
}


@pytest.mark.parametrize("shape", NEVER_PRUNED.values(), ids=NEVER_PRUNED.keys())
async def test_never_pruned(store: Store, org: str, shape: dict[str, object]) -> None:
    kept = await seed(store, org, **shape)  # type: ignore[arg-type]
    gone = await seed(store, org)
    report = await pruner(store).prune(org)
    assert report[org].sessions == 1
    assert await still_there(store, org, kept)
    assert not await still_there(store, org, gone)


async def test_a_dry_run_counts_what_a_prune_deletes_and_deletes_nothing(
    store: Store, org: str
) -> None:
    seeded = [await seed(store, org, effects=("committed", "failed")) for _ in range(5)]
    kept = await seed(store, org, state="active")
    dry = await pruner(store).prune(org, dry_run=True, batch_size=2)
    assert all([await still_there(store, org, s) for s in seeded])
    real = await pruner(store).prune(org, batch_size=2)
    assert dry == real == {org: PruneCounts(sessions=5, effects=10, events=10)}
    assert not any([await still_there(store, org, s) for s in seeded])
    assert await still_there(store, org, kept)


async def test_pruning_goes_in_batches_that_each_commit(store: Store, org: str) -> None:
    seeded = [await seed(store, org) for _ in range(11)]
    # A session that is kept sits among them (the same time): batches step over it.
    kept = await seed(store, org, effects=("in_doubt",))
    batches: list[PruneCounts] = []
    report = await pruner(store).prune(org, batch_size=3, on_batch=lambda _, c: batches.append(c))
    session_batches = [b.sessions for b in batches if b.sessions]
    assert session_batches == [3, 3, 3, 2]
    assert sum(b.events for b in batches) == 11
    assert report[org] == PruneCounts(sessions=11, effects=11, events=11)
    assert not any([await still_there(store, org, s) for s in seeded])
    assert await still_there(store, org, kept)


async def test_events_go_when_old_and_their_session_is_gone(store: Store, org: str) -> None:
    async with store.transaction() as q:
        await q.insert_event(org, "effect_replayed", None, None, "{}", NOW)  # no session: old
        await q.insert_event(org, "effect_replayed", None, None, "{}", YOUNG)  # no session: young
    done = await seed(store, org)
    async with store.transaction() as q:  # a replay of the pruned session's call, later on
        await q.insert_event(org, "effect_replayed", done.session_id, None, "{}", YOUNG)
    report = await pruner(store).prune(org)
    assert report[org] == PruneCounts(sessions=1, effects=1, events=2)
    async with store.reader() as q:
        left = await q.list_events(org)
    assert [(e.session_id, e.created_us) for e in left] == [(None, YOUNG), (done.session_id, YOUNG)]
    # Once it is old too, the later event of the pruned session goes.
    much_later = Retention(store, clock_us=lambda: LATER + RETENTION_DAYS * DAY_US)
    assert (await much_later.prune(org))[org] == PruneCounts(events=2)


async def test_a_batch_size_out_of_bounds_is_refused(store: Store, org: str) -> None:
    with pytest.raises(ValueError, match="batch size"):
        await pruner(store).prune(org, batch_size=0)


@pytest.mark.security
async def test_a_prune_never_touches_another_org_that_uses_the_same_session_id(
    store: Store, org: str
) -> None:
    """Session ids are the client's choice: an org's prune is scoped by org in every
    statement, so a second org's session of the same id (old and finished, in an org that
    keeps everything) keeps every row, its events included."""
    mine = await seed(store, org)
    victim = f"org-{uuid.uuid4().hex[:12]}"
    await add_org(store, victim, None)
    theirs = await seed(store, victim, session_id=mine.session_id)
    assert (await pruner(store).prune(org))[org].sessions == 1
    assert not await still_there(store, org, mine)
    assert await still_there(store, victim, theirs)  # its event included


async def test_two_pruners_at_once_share_the_work_and_count_each_row_once(
    store: Store, store_url: str, org: str
) -> None:
    """As two server processes' sweeps would: each its own store (connection pool); on
    PostgreSQL a batch skips the sessions the other holds, on SQLite the batches take turns."""
    await bulk_seed(store_url, org, 300, 2, at=NOW)
    other = await open_store(store_url)
    try:
        reports = await asyncio.gather(
            pruner(store).prune(org, batch_size=20),
            pruner(other).prune(org, batch_size=20),
        )
    finally:
        await other.close()
    total = reports[0][org] + reports[1][org]
    assert total == PruneCounts(sessions=300, effects=600, events=600)
    assert (await pruner(store).prune(org))[org] == PruneCounts()


async def test_expired_mcp_tasks_go_in_batches_whatever_the_org_keeps(
    store: Store, org: str
) -> None:
    """Tasks live for their ttl, not the org's retention: every org's expired rows go."""
    forever = f"org-{uuid.uuid4().hex[:12]}"
    await add_org(store, forever, None)
    expired = [
        replace(TASK, task_id=str(uuid.uuid4()), org_id=owner, expires_us=LATER - 1)
        for owner in (org, forever)
        for _ in range(3)
    ]
    alive = replace(TASK, task_id=str(uuid.uuid4()), org_id=forever, expires_us=LATER + 1)
    async with store.transaction() as q:
        for task in (*expired, alive):
            await q.insert_mcp_task(task)
    assert await pruner(store).expire_tasks(batch_size=2) >= len(expired)
    async with store.reader() as q:
        for task in expired:
            assert await q.get_mcp_task(task.org_id, task.task_id) is None
        assert await q.get_mcp_task(forever, alive.task_id) == alive
