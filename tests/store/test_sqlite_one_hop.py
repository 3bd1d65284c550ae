"""SQLite hot-path writes: one trip ("hop") to the writer's thread per write transaction.

`execute_new`'s transaction, `atomic` (a new call's commit) and `autocommit` (a replay's
event) run their statements, with the group commit's BEGIN / SAVEPOINT / ROLLBACK TO /
COMMIT, in one function in the connection's thread (store/sqlite_hop.py). What must hold,
besides what tests/store/test_sqlite_group_commit.py asks of every writer:

- one hop per write transaction, counted at aiosqlite's one door to its thread;
- a one-hop writer that fails (its body raises, a statement fails, it suspends) rolls back
  its own writes only, alone or inside a batch, and fails loudly, never hangs;
- one-hop and generic (`transaction`) writers share batches;
- a one-hop writer cancelled while its hop runs does not strand the batch, and its writes,
  never answered, are undone while its batch is open;
- the private aiosqlite API it relies on does what the store needs (a guard for upgrades).
"""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import aiosqlite
import pytest

from tests.store.contract_helpers import make_effect, make_undo
from tests.store.test_sqlite_group_commit import _orgs_on_disk, sqlite_store
from undolog.engine import Engine, Outcome
from undolog.store import Finish, NewCall, Queries
from undolog.store.sqlite import SqliteStore
from undolog.store.sqlite_hop import BodySuspended, in_thread, run_to_end
from undolog_sdk.errors import Database

NOW = 1_700_000_000_000_000
REPLAY = (("committed",), "effect_replayed", '{"stage":"replayed"}')
INTERCEPTED = ("effect_intercepted", '{"stage":"executing"}')
__all__ = ["sqlite_store"]  # the fixture, used here

DEADLINE_S = 10  # a bound on waiting for what must happen, never a measure of time


@pytest.fixture
def hops(sqlite_store: SqliteStore, monkeypatch: pytest.MonkeyPatch) -> Iterator[Counter[str]]:
    """Trips to each connection's thread: every aiosqlite operation goes through `_execute`."""
    counted: Counter[str] = Counter()
    names = {id(sqlite_store._writer): "writer", id(sqlite_store._reader): "reader"}
    execute = aiosqlite.Connection._execute

    async def counting(self: aiosqlite.Connection, fn: Any, *args: Any, **kwargs: Any) -> Any:
        counted[names.get(id(self), "other")] += 1
        return await execute(self, fn, *args, **kwargs)

    monkeypatch.setattr(aiosqlite.Connection, "_execute", counting)
    yield counted


async def _hop_write(store: SqliteStore, org_id: str, *, fail: bool = False) -> str:
    async def body(q: Queries) -> str:
        await q.ensure_org_exists(org_id, NOW)
        if fail:
            raise RuntimeError("this writer fails")
        return org_id

    return await store._write_hop(body)


class _Holder:
    """A generic writer that holds the writer (inside its transaction) until released, so
    that the writers started meanwhile queue behind it and share its batch."""

    def __init__(self, store: SqliteStore, org_id: str) -> None:
        self.holding, self.go = asyncio.Event(), asyncio.Event()
        self.task = asyncio.create_task(self._run(store, org_id))

    async def _run(self, store: SqliteStore, org_id: str) -> None:
        async with store.transaction() as q:
            await q.ensure_org_exists(org_id, NOW)
            self.holding.set()
            await self.go.wait()


async def _hop_started(
    store: SqliteStore, body: Callable[[Queries], Awaitable[Any]], holder: _Holder | None
) -> asyncio.Task[Any]:
    """A one-hop writer's task: alone, or queued behind `holder`, whose open batch it then
    joins (the holder is released once the hop waits for it)."""
    if holder is not None:
        await holder.holding.wait()
    task = asyncio.create_task(store._write_hop(body))
    if holder is not None:
        await _queued(store, 1)
        holder.go.set()
    return task


async def _queued(store: SqliteStore, n: int) -> None:
    """Let the writers just started queue for the held writer (a yield, not a wait for
    time: each runs to its wait for the lock)."""
    await asyncio.sleep(0)
    assert store._waiting == n


# -- aiosqlite's private door, as the store uses it -------------------------------------------


async def test_aiosqlite_runs_a_function_on_the_raw_connection_in_its_thread_in_order(
    sqlite_store: SqliteStore,
) -> None:
    """The store relies on `Connection._execute(fn, *args)` and `Connection._conn`
    (aiosqlite 0.20-0.22): `fn` runs in the connection's own thread (where sqlite3 allows
    the connection), after the work queued before it, and its value or error comes back."""
    conn = sqlite_store._writer
    assert conn is not None
    seen: list[str] = []

    def first(raw: sqlite3.Connection) -> int:
        seen.append("first")
        return int(raw.execute("SELECT 41 + 1").fetchone()[0])

    def second(raw: sqlite3.Connection) -> int:
        seen.append("second")
        return threading.get_ident()

    answer, ident = await asyncio.gather(in_thread(conn, first), in_thread(conn, second))
    assert (answer, seen) == (42, ["first", "second"])
    assert ident != threading.get_ident()

    def broken(raw: sqlite3.Connection) -> None:
        raw.execute("SELECT nope FROM no_such_table")

    with pytest.raises(sqlite3.OperationalError):
        await in_thread(conn, broken)


async def test_a_coroutine_that_never_suspends_runs_to_its_end_and_one_that_does_is_refused() -> (
    None
):
    async def plain() -> int:
        return 7

    assert run_to_end(plain()) == 7
    closed = []

    async def suspends() -> int:
        try:
            await asyncio.sleep(0)
        finally:
            closed.append(True)
        return 1

    with pytest.raises(BodySuspended):
        run_to_end(suspends())
    assert closed == [True]  # closed, not left pending


# -- one hop per hot-path write ---------------------------------------------------------------


async def test_a_new_call_and_its_commit_take_one_hop_each_to_the_writer(
    sqlite_store: SqliteStore, hops: Counter[str]
) -> None:
    effect = make_effect("org-hops")
    outcome = await sqlite_store.execute_new(
        NewCall.of(effect, make_undo(effect), INTERCEPTED), REPLAY, owner="key-a", owner_only=True
    )
    assert outcome == ("inserted", None)
    assert hops == {"reader": 1, "writer": 1}  # the signature's read; the whole transaction
    hops.clear()
    async with sqlite_store.atomic() as q:
        done = await q.finish_effect(
            Finish(
                effect.org_id, effect.effect_id, "committed", "{}", None, NOW, "effect_committed"
            )
        )
    assert done is not None and done.state == "committed"
    assert hops == {"writer": 1}
    hops.clear()
    async with sqlite_store.autocommit() as q:
        await q.insert_event(effect.org_id, "effect_replayed", None, None, "{}", NOW)
    assert hops == {"writer": 1}
    assert sqlite_store.commits == 2  # the intent's and the result's: each its own fsync


async def test_through_the_engine_a_new_call_is_three_hops_and_a_replay_two(
    sqlite_store: SqliteStore, hops: Counter[str]
) -> None:
    engine = Engine(sqlite_store)
    await engine.ensure_org("org-engine", approval_timeout_s=60)
    await engine.register_tool(
        "org-engine", "send_email", tier="compensable", compensation={"fn_name": "undo"}
    )
    session = "00000000-0000-4000-8000-000000000001"
    await engine.intercept("org-engine", session, "send_email", {"n": 0}, step_index=0)  # warm
    hops.clear()
    decision = await engine.intercept("org-engine", session, "send_email", {"n": 1}, step_index=1)
    await engine.commit("org-engine", decision.effect_id, '{"ok": true}')
    assert hops == {"reader": 1, "writer": 2}
    hops.clear()
    replay = await engine.intercept("org-engine", session, "send_email", {"n": 1}, step_index=1)
    assert replay.outcome is Outcome.REPLAY
    assert hops == {"reader": 1, "writer": 1}


async def test_a_lone_one_hop_writer_commits_in_its_hop_and_is_on_disk_when_answered(
    sqlite_store: SqliteStore,
) -> None:
    before = sqlite_store.commits
    await _hop_write(sqlite_store, "org-lone")
    assert "org-lone" in _orgs_on_disk(sqlite_store)
    assert sqlite_store.commits == before + 1


# -- failures roll back one writer only -------------------------------------------------------


@pytest.mark.parametrize("failing", [0, 2], ids=["first-of-batch", "inside-batch"])
async def test_a_failing_one_hop_writer_rolls_back_only_its_own_writes(
    sqlite_store: SqliteStore, failing: int
) -> None:
    """Writers 0-3 queue behind a generic holder and join its batch under savepoints: the
    failing one's is rolled back, the batch commits the others."""
    holder = _Holder(sqlite_store, "held")
    await holder.holding.wait()
    tasks = [
        asyncio.create_task(_hop_write(sqlite_store, f"h-{i}", fail=i == failing)) for i in range(4)
    ]
    await _queued(sqlite_store, 4)
    before = sqlite_store.commits
    holder.go.set()
    results = await asyncio.gather(*tasks, return_exceptions=True)
    await holder.task
    for i, result in enumerate(results):
        if i == failing:
            assert isinstance(result, RuntimeError)
        else:
            assert result == f"h-{i}"
    on_disk = _orgs_on_disk(sqlite_store)
    assert {"held"} | {f"h-{i}" for i in range(4) if i != failing} <= on_disk
    assert f"h-{failing}" not in on_disk
    assert sqlite_store.commits - before <= 2


async def test_a_failing_one_hop_writer_that_opened_the_batch_rolls_it_back_alone(
    sqlite_store: SqliteStore,
) -> None:
    with pytest.raises(RuntimeError):
        await _hop_write(sqlite_store, "org-failed", fail=True)
    assert "org-failed" not in _orgs_on_disk(sqlite_store)
    assert await _hop_write(sqlite_store, "org-next") == "org-next"  # the writer is free
    assert "org-next" in _orgs_on_disk(sqlite_store)


async def test_a_failing_statement_in_a_hop_is_database_for_that_writer_only(
    sqlite_store: SqliteStore,
) -> None:
    holder = _Holder(sqlite_store, "db-held")
    await holder.holding.wait()

    async def broken(q: Queries) -> None:
        await q.ensure_org_exists("db-broken", NOW)
        await q._execute("UPDATE no_such_table SET x = 1")

    bad = asyncio.create_task(sqlite_store._write_hop(broken))
    good = asyncio.create_task(_hop_write(sqlite_store, "db-good"))
    await _queued(sqlite_store, 2)
    holder.go.set()
    results = await asyncio.gather(bad, good, holder.task, return_exceptions=True)
    assert isinstance(results[0], Database)
    assert results[1:] == ["db-good", None]
    assert {"db-held", "db-good"} <= _orgs_on_disk(sqlite_store)
    assert "db-broken" not in _orgs_on_disk(sqlite_store)


async def test_a_batch_that_sqlite_ended_inside_a_hop_fails_every_writer_of_it(
    sqlite_store: SqliteStore,
) -> None:
    """As if SQLite had rolled the whole transaction back (an I/O error, a full disk): the
    writers already in the batch are told, none was acknowledged; the next batch is fine."""
    holder = _Holder(sqlite_store, "lost-held")
    await holder.holding.wait()

    async def ends_it(q: Queries) -> None:
        await q._execute("ROLLBACK")
        raise sqlite3.OperationalError("disk I/O error (injected by the test)")

    rogue = asyncio.create_task(sqlite_store._write_hop(ends_it))
    await _queued(sqlite_store, 1)
    holder.go.set()
    results = await asyncio.gather(holder.task, rogue, return_exceptions=True)
    assert [type(r) for r in results] == [Database, Database]
    assert "lost-held" not in _orgs_on_disk(sqlite_store)
    assert await asyncio.wait_for(_hop_write(sqlite_store, "lost-after"), DEADLINE_S)
    assert "lost-after" in _orgs_on_disk(sqlite_store)


@pytest.mark.parametrize("batched", [False, True], ids=["alone", "in-a-batch"])
async def test_a_body_that_suspends_fails_loudly_and_rolls_back_its_writes(
    sqlite_store: SqliteStore, batched: bool
) -> None:
    async def suspends(q: Queries) -> None:
        await q.ensure_org_exists("org-suspended", NOW)
        await asyncio.sleep(0)  # not a query: there is no event loop in the writer's thread

    holder = _Holder(sqlite_store, "org-held") if batched else None
    task = await _hop_started(sqlite_store, suspends, holder)
    with pytest.raises(BodySuspended):
        await asyncio.wait_for(task, DEADLINE_S)
    if holder is not None:
        await asyncio.wait_for(holder.task, DEADLINE_S)
        assert "org-held" in _orgs_on_disk(sqlite_store)
    assert "org-suspended" not in _orgs_on_disk(sqlite_store)
    assert await asyncio.wait_for(_hop_write(sqlite_store, "org-after"), DEADLINE_S)


async def test_a_second_call_in_atomic_is_refused(sqlite_store: SqliteStore) -> None:
    async with sqlite_store.atomic() as q:
        await q.ensure_org_exists("org-once", NOW)
        with pytest.raises(RuntimeError, match="one Queries call"):
            await q.ensure_org_exists("org-twice", NOW)
    assert "org-twice" not in _orgs_on_disk(sqlite_store)


# -- one-hop and generic writers together ------------------------------------------------------


async def test_one_hop_and_generic_writers_share_batches_and_each_is_on_disk_when_answered(
    sqlite_store: SqliteStore,
) -> None:
    async def generic(org_id: str) -> set[str]:
        async with sqlite_store.transaction() as q:
            await q.ensure_org_exists(org_id, NOW)
        return _orgs_on_disk(sqlite_store)

    async def one_hop(org_id: str) -> set[str]:
        await _hop_write(sqlite_store, org_id)
        return _orgs_on_disk(sqlite_store)

    async def auto(org_id: str) -> set[str]:
        async with sqlite_store.autocommit() as q:
            await q.ensure_org_exists(org_id, NOW)
        return _orgs_on_disk(sqlite_store)

    kinds = [generic, one_hop, auto]
    orgs = [f"mix-{i}" for i in range(33)]
    before = sqlite_store.commits
    seen = await asyncio.gather(*(kinds[i % 3](org) for i, org in enumerate(orgs)))
    for org, on_disk in zip(orgs, seen, strict=True):
        assert org in on_disk
    assert sqlite_store.commits - before <= 6  # 33 writers: they queued and shared commits


# -- cancellation ------------------------------------------------------------------------------


@pytest.mark.parametrize("joined", [False, True], ids=["opened-the-batch", "joined-a-batch"])
async def test_a_one_hop_writer_cancelled_while_its_hop_runs_does_not_strand_the_batch(
    sqlite_store: SqliteStore, joined: bool
) -> None:
    """The hop cannot be stopped once in the thread: the store waits for it, undoes its
    writes (its writer was never answered) while the batch is open, and goes on; the other
    writers of the batch are answered."""
    inside, release = threading.Event(), threading.Event()

    async def slow(q: Queries) -> None:
        await q.ensure_org_exists("org-cancelled", NOW)
        inside.set()
        release.wait(DEADLINE_S)  # in the writer's thread: holds the hop, not the loop

    holder = _Holder(sqlite_store, "org-holder") if joined else None
    cancelled = await _hop_started(sqlite_store, slow, holder)  # joins the holder's batch
    assert await asyncio.to_thread(inside.wait, DEADLINE_S)
    behind = asyncio.create_task(_hop_write(sqlite_store, "org-behind"))
    await _queued(sqlite_store, 1)  # so the hop leaves the batch open for it
    cancelled.cancel()
    release.set()
    with pytest.raises(asyncio.CancelledError):
        await cancelled
    assert await asyncio.wait_for(behind, DEADLINE_S) == "org-behind"
    if holder is not None:
        await asyncio.wait_for(holder.task, DEADLINE_S)
    on_disk = _orgs_on_disk(sqlite_store)
    assert "org-behind" in on_disk
    assert ("org-holder" in on_disk) is joined
    assert "org-cancelled" not in on_disk
    assert await asyncio.wait_for(_hop_write(sqlite_store, "org-after"), DEADLINE_S)


async def test_a_one_hop_writer_cancelled_after_its_hop_committed_leaves_the_writer_free(
    sqlite_store: SqliteStore,
) -> None:
    inside, release = threading.Event(), threading.Event()

    async def slow(q: Queries) -> None:
        await q.ensure_org_exists("org-committed", NOW)
        inside.set()
        release.wait(DEADLINE_S)

    cancelled = asyncio.create_task(sqlite_store._write_hop(slow))
    assert await asyncio.to_thread(inside.wait, DEADLINE_S)
    cancelled.cancel()
    release.set()
    with pytest.raises(asyncio.CancelledError):
        await cancelled
    # The store settles the cancelled writer's hop once it is done, then lets go. (Taken
    # directly, the lock does not count as a waiting writer: the hop commits.)
    async with asyncio.timeout(DEADLINE_S), sqlite_store._write_lock:
        pass
    # Nobody waited: the hop committed its batch itself, before the store could undo it
    # (as a generic writer cancelled after its commit: the write stands).
    assert "org-committed" in _orgs_on_disk(sqlite_store)
    assert sqlite_store._batch is None
    assert await asyncio.wait_for(_hop_write(sqlite_store, "org-after"), DEADLINE_S)
