"""A SQLite write transaction in one trip to the connection's thread (a "hop").

aiosqlite runs each statement in the connection's own thread and hands the answer back to the
event loop: a hop, whose cost is less the thread switch than the wait in the loop's ready queue,
shared with every request in flight. A hot-path write made one hop per statement (`BEGIN`, the
session touch, the effect, its undo entry, its event, `COMMIT`), all while holding SQLite's one
writer: so the writer's throughput was bounded by loop turns, not by SQLite.

Here the whole transaction runs in one hop. The body is the shared async SQL (`SqlQueries`)
over `SyncQueries`, whose primitives call the raw `sqlite3.Connection` synchronously: its
coroutine never suspends, so `run_to_end` drives it to completion with one `send(None)`
inside the thread. A body that awaits anything else (it would wait for the event loop, which
this thread is not) is closed and fails with `BodySuspended`: loudly, never a hang.

`Hop.run` wraps the body with the group commit's statements (store/sqlite.py): `BEGIN
IMMEDIATE` or `SAVEPOINT` before it, `ROLLBACK` / `ROLLBACK TO` when it fails, and `COMMIT`
after it when no other writer waits. The store keeps the batch's bookkeeping in the loop.

`in_thread` is the one use of aiosqlite's private `Connection._execute(fn, *args)` (run
`fn(*args)` in the connection's thread, in order with its other work, and answer its return
value or exception): pinned below 0.23 in pyproject.toml and checked by
tests/store/test_sqlite_one_hop.py.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from contextlib import suppress
from enum import Enum
from typing import Any, Generic, TypeVar, cast

import aiosqlite

from undolog.store._sql import SqlQueries
from undolog.store.protocol import Queries

__all__ = ["Body", "BodySuspended", "Hop", "HopEnd", "SyncQueries", "in_thread", "run_to_end"]

T = TypeVar("T")

Body = Callable[[Queries], Coroutine[Any, Any, T]]


class BodySuspended(RuntimeError):
    """A one-hop body awaited something that is not a query of its `SyncQueries`."""


class SyncQueries(SqlQueries):
    """The shared SQL on a raw `sqlite3.Connection`, used in that connection's thread only.

    Its primitives are coroutines that never suspend (see `run_to_end`).
    """

    def __init__(self, conn: sqlite3.Connection) -> None:
        self._conn = conn

    # Reading to the end finishes the statement, which an open one would keep locked.

    async def _fetchrow(self, sql: str, *args: Any) -> Sequence[Any] | None:
        rows = self._conn.execute(sql, args).fetchall()
        return tuple(rows[0]) if rows else None

    async def _fetch(self, sql: str, *args: Any) -> list[Sequence[Any]]:
        return [tuple(r) for r in self._conn.execute(sql, args).fetchall()]

    async def _execute(self, sql: str, *args: Any) -> int:
        cursor = self._conn.execute(sql, args)
        try:
            return cursor.rowcount
        finally:
            cursor.close()


def run_to_end(coro: Coroutine[Any, Any, T]) -> T:
    """Run a coroutine that never suspends; `BodySuspended` (after closing it) if it does."""
    try:
        coro.send(None)
    except StopIteration as stop:
        return cast(T, stop.value)
    coro.close()
    raise BodySuspended(
        "a one-hop SQLite body awaited something that is not one of its queries "
        "(it runs in the database's thread, where nothing else can answer)"
    )


class HopEnd(Enum):
    """Where a hop left the write transaction."""

    NOT_STARTED = "not_started"  # its BEGIN or SAVEPOINT failed (or it never ran): no writes
    BARE = "bare"  # no transaction of its own: each statement committed alone
    OPEN = "open"  # the batch is open with its writes in it: the store hands it on
    COMMITTED = "committed"  # it committed the batch
    COMMIT_FAILED = "commit_failed"  # its COMMIT failed: the batch was rolled back
    ROLLED_BACK = "rolled_back"  # the body failed and it had opened the batch: rolled back
    LOST = "lost"  # the body failed and SQLite had ended the whole transaction itself


class Hop(Generic[T]):
    """One writer's transaction, run whole by `run` in the writer connection's thread.

    `start` is `BEGIN IMMEDIATE` (it opens the batch), `SAVEPOINT <mark>` (it joins the open
    one) or None (bare: each statement commits alone). After a body that succeeded,
    `commit_now` (asked in the thread) says whether to commit the batch in the same hop.
    The outcome is set on the object in the thread (`end`, `value`, `error`), then `after`
    tells the store, which settles the batch from there: even when the writer was cancelled
    while the hop ran, and without waiting for the writer's task to resume.
    """

    __slots__ = (
        "abandoned", "after", "body", "commit_error", "commit_now", "end", "error",
        "events_written", "mark", "start", "value",
    )  # fmt: skip

    def __init__(
        self,
        body: Body[T],
        start: str | None,
        mark: str | None,
        commit_now: Callable[[], bool],
        after: Callable[[], object],
    ) -> None:
        self.body = body
        self.start = start
        self.mark = mark
        self.commit_now = commit_now
        self.after = after  # called in the thread once the hop is done (to tell the loop)
        self.abandoned = False  # set in the loop: its writer was cancelled meanwhile
        self.end = HopEnd.NOT_STARTED
        self.value: T | None = None
        self.error: BaseException | None = None  # the body's (or BEGIN's) exception
        self.commit_error: sqlite3.Error | None = None
        self.events_written = False

    def run(self, conn: sqlite3.Connection) -> None:
        """In the connection's thread: start, body, then roll back or maybe commit; then
        `after`."""
        try:
            self._run(conn)
        finally:
            self.after()

    def _run(self, conn: sqlite3.Connection) -> None:
        if self.start is not None:
            try:
                conn.execute(self.start)
            except sqlite3.Error as exc:
                self.error = exc
                return
        q = SyncQueries(conn)
        try:
            self.value = run_to_end(self.body(q))
        except BaseException as exc:  # handed to the writer, which raises it
            self.error = exc
            self.end = self._roll_back(conn)
            return
        self.events_written = q.events_written
        if self.start is None:
            self.end = HopEnd.BARE
        elif self.commit_now():
            self.end = self._commit(conn)
        else:
            self.end = HopEnd.OPEN

    def undo_if_open(self, conn: sqlite3.Connection) -> None:
        """In the thread, after `run`: undo the writes of a hop whose writer went away (it
        was cancelled) while its batch is still open."""
        if self.end is HopEnd.OPEN:
            self.end = self._roll_back(conn)
            self.events_written = False

    def _roll_back(self, conn: sqlite3.Connection) -> HopEnd:
        """Undo this writer's writes only: its savepoint, or the batch it opened (nobody
        else is in a batch before its first writer ends)."""
        if self.start is None:
            return HopEnd.BARE
        if self.mark is None:
            with suppress(sqlite3.Error):
                conn.execute("ROLLBACK")
            return HopEnd.ROLLED_BACK
        with suppress(sqlite3.Error):
            conn.execute(f"ROLLBACK TO {self.mark}")
        # SQLite may have ended the transaction itself (an I/O error, a full disk).
        return HopEnd.OPEN if conn.in_transaction else HopEnd.LOST

    def _commit(self, conn: sqlite3.Connection) -> HopEnd:
        try:
            conn.execute("COMMIT")
        except sqlite3.Error as exc:
            self.commit_error = exc
            with suppress(sqlite3.Error):
                conn.execute("ROLLBACK")
            return HopEnd.COMMIT_FAILED
        return HopEnd.COMMITTED


async def in_thread(conn: aiosqlite.Connection, fn: Callable[[sqlite3.Connection], T]) -> T:
    """Run `fn` on the raw connection in its own thread, in order with the connection's other
    work (aiosqlite's private `_execute`; see the module docstring). ValueError when the
    connection is closed."""
    execute: Callable[..., Awaitable[T]] = conn._execute
    return await execute(fn, conn._conn)
