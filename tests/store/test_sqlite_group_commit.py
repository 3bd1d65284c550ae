"""SQLite group commit: concurrent writers share one transaction and one fsync.

Every write of the SQLite store (`transaction`, `autocommit`) goes through one writer. When
writers are waiting for it, the one that holds it leaves its transaction open and hands it on;
the last one of the batch commits for all (docs/performance.md). What must hold:

- a lone writer commits at once (no waiting for company);
- a writer is answered only after the commit that holds its writes (an acknowledged write is
  on disk: another connection sees it);
- a writer that fails leaves the others of its batch alone (a savepoint per writer);
- a writer cancelled while it waits does not leave the batch open.
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from undolog.store.sqlite import SqliteStore
from undolog_sdk.errors import Database

NOW = 1_700_000_000_000_000


@pytest.fixture
async def sqlite_store(tmp_path: Path) -> AsyncIterator[SqliteStore]:
    store = await SqliteStore.open(f"sqlite:///{tmp_path / 'group.db'}")
    await store.migrate()
    try:
        yield store
    finally:
        await store.close()


def _orgs_on_disk(store: SqliteStore) -> set[str]:
    """The orgs another connection (another process) sees: committed rows only."""
    conn = sqlite3.connect(store.path)
    try:
        return {row[0] for row in conn.execute("SELECT org_id FROM orgs")}
    finally:
        conn.close()


async def _write(store: SqliteStore, org_id: str) -> set[str]:
    async with store.transaction() as q:
        await q.ensure_org_exists(org_id, NOW)
    return _orgs_on_disk(store)  # right after the acknowledgement


async def test_a_lone_writer_commits_at_once(sqlite_store: SqliteStore) -> None:
    before = sqlite_store.commits
    assert "org-alone" in await _write(sqlite_store, "org-alone")
    assert sqlite_store.commits == before + 1


async def test_concurrent_writers_share_commits_and_each_is_on_disk_when_answered(
    sqlite_store: SqliteStore,
) -> None:
    before = sqlite_store.commits
    orgs = [f"org-{i}" for i in range(32)]
    seen = await asyncio.gather(*(_write(sqlite_store, org) for org in orgs))
    for org, on_disk in zip(orgs, seen, strict=True):
        assert org in on_disk
    assert set(orgs) <= _orgs_on_disk(sqlite_store)
    # 32 writers, far fewer commits (each one fsync): they queued behind the first.
    assert sqlite_store.commits - before <= 4


async def test_autocommit_writes_join_the_batch_too(sqlite_store: SqliteStore) -> None:
    async def write(org_id: str) -> None:
        async with sqlite_store.autocommit() as q:
            await q.ensure_org_exists(org_id, NOW)
        assert org_id in _orgs_on_disk(sqlite_store)

    before = sqlite_store.commits
    await asyncio.gather(*(write(f"auto-{i}") for i in range(16)))
    assert sqlite_store.commits - before <= 4


@pytest.mark.parametrize("failing", [0, 2], ids=["first-of-batch", "inside-batch"])
async def test_a_failing_writer_leaves_the_others_of_its_batch(
    sqlite_store: SqliteStore, failing: int
) -> None:
    holding, go = asyncio.Event(), asyncio.Event()

    async def write(i: int) -> str:
        async with sqlite_store.transaction() as q:
            await q.ensure_org_exists(f"w-{i}", NOW)
            if i == 0:  # the first holds the writer until every other one waits for it
                holding.set()
                await go.wait()
            if i == failing:
                raise RuntimeError("this writer fails")
        return "ok"

    tasks = [asyncio.create_task(write(0))]
    await holding.wait()
    tasks += [asyncio.create_task(write(i)) for i in range(1, 5)]
    await asyncio.sleep(0)  # let them queue (a yield, not a wait for time)
    before = sqlite_store.commits
    go.set()
    results = await asyncio.gather(*tasks, return_exceptions=True)
    for i, result in enumerate(results):
        if i == failing:
            assert isinstance(result, RuntimeError)
        else:
            assert result == "ok"
    assert _orgs_on_disk(sqlite_store) & {f"w-{i}" for i in range(5)} == {
        f"w-{i}" for i in range(5) if i != failing
    }
    assert sqlite_store.commits - before <= 2


async def test_a_database_error_in_one_writer_fails_only_that_writer(
    sqlite_store: SqliteStore,
) -> None:
    holding, go = asyncio.Event(), asyncio.Event()

    async def first() -> None:
        async with sqlite_store.transaction() as q:
            await q.ensure_org_exists("db-0", NOW)
            holding.set()
            await go.wait()

    async def broken() -> None:
        async with sqlite_store.transaction() as q:
            await q.ensure_org_exists("db-broken", NOW)
            await q.get_org("db-broken")
            raise sqlite3.OperationalError("disk I/O error (injected by the test)")

    async def last() -> None:
        async with sqlite_store.transaction() as q:
            await q.ensure_org_exists("db-2", NOW)

    tasks = [asyncio.create_task(first())]
    await holding.wait()
    tasks += [asyncio.create_task(broken()), asyncio.create_task(last())]
    await asyncio.sleep(0)
    go.set()
    results = await asyncio.gather(*tasks, return_exceptions=True)
    assert results[0] is None and results[2] is None
    assert isinstance(results[1], Database)
    assert {"db-0", "db-2"} <= _orgs_on_disk(sqlite_store)
    assert "db-broken" not in _orgs_on_disk(sqlite_store)


@pytest.mark.parametrize("yields", range(4))
async def test_a_writer_cancelled_while_waiting_does_not_strand_the_batch(
    sqlite_store: SqliteStore, yields: int
) -> None:
    """Whenever the waiting writer is cancelled — before or after the holder handed the open
    transaction on to it — the holder's write still commits and is answered."""
    holding, go = asyncio.Event(), asyncio.Event()

    async def holder() -> None:
        async with sqlite_store.transaction() as q:
            await q.ensure_org_exists(f"held-{yields}", NOW)
            holding.set()
            await go.wait()

    first = asyncio.create_task(holder())
    await holding.wait()
    waiter = asyncio.create_task(_write(sqlite_store, f"cancelled-{yields}"))
    await asyncio.sleep(0)  # the waiter queues
    go.set()
    for _ in range(yields):
        await asyncio.sleep(0)
    waiter.cancel()
    await asyncio.wait_for(first, timeout=10)
    assert f"held-{yields}" in _orgs_on_disk(sqlite_store)
    # The writer is usable afterwards.
    assert "after" in await asyncio.wait_for(_write(sqlite_store, "after"), timeout=10)
