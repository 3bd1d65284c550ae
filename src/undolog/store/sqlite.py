"""SQLite store: the embedded default.

One writer connection (SQLite has one writer anyway) guarded by an asyncio lock, each write
transaction opened with `BEGIN IMMEDIATE` so that writers from other processes sharing the file
queue on `busy_timeout` instead of failing at commit. WAL lets a separate reader connection see
committed data while a write is open. `synchronous=FULL` makes a committed intent durable
before the tool runs. Concurrent writers share one transaction, each under a savepoint, and
one fsync (group commit, docs/performance.md).

The hot-path writes (`execute_new`'s transaction, `atomic` for a new call's commit,
`autocommit` for a replay's event) run each whole in one trip to the writer's thread
(store/sqlite_hop.py) instead of one per statement; every other write uses `transaction`.
"""

from __future__ import annotations

import asyncio
import re
import sqlite3
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Collection, Coroutine, Sequence
from contextlib import asynccontextmanager, suppress
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar, cast

import aiosqlite

from undolog.store._sql import SqlQueries
from undolog.store.base import StoreBase, load_migrations
from undolog.store.protocol import ExecuteNew, NewCall, Queries, Store
from undolog.store.records import EffectRecord, UndoEntryRecord
from undolog.store.sqlite_hop import Body, Hop, HopEnd, SyncQueries, in_thread, run_to_end
from undolog_sdk.errors import Database
from undolog_sdk.wire import SessionState

__all__ = ["SqliteStore"]

BUSY_TIMEOUT_MS = 10_000
_ACTIVE = SessionState.ACTIVE.value
T = TypeVar("T")


# The most writers one transaction holds: a bound on how long the first waits for its answer.
MAX_BATCH = 64


class _Batch:
    """The open write transaction that writers join (see `SqliteStore.transaction`)."""

    __slots__ = ("done", "marks")

    def __init__(self) -> None:
        self.done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.marks = 0  # savepoints taken: the writers after the first


class _SqliteQueries(SqlQueries):
    def __init__(self, conn: aiosqlite.Connection) -> None:
        self._conn = conn

    # One trip to aiosqlite's thread per query (`execute_fetchall`), not three (execute, fetch,
    # close): each trip is a thread hand-off, and a new call makes about a dozen queries. Reading
    # to the end also finishes the statement, which an open one would keep the database locked.

    async def _fetchrow(self, sql: str, *args: Any) -> Sequence[Any] | None:
        rows = list(await self._conn.execute_fetchall(sql, args))
        return tuple(rows[0]) if rows else None

    async def _fetch(self, sql: str, *args: Any) -> list[Sequence[Any]]:
        return [tuple(r) for r in await self._conn.execute_fetchall(sql, args)]

    async def _execute(self, sql: str, *args: Any) -> int:
        async with self._conn.execute(sql, args) as cursor:
            return cursor.rowcount


async def _pragma(conn: aiosqlite.Connection, pragma: str) -> None:
    # Read the answer to the end: an unfinished statement would keep the database locked.
    async with conn.execute(f"PRAGMA {pragma}") as cursor:
        await cursor.fetchall()


def _path_from_url(url: str) -> str:
    """`sqlite:///./undolog.db` → `./undolog.db`; `sqlite:////abs/x.db` → `/abs/x.db`."""
    if url in ("sqlite://", "sqlite:///:memory:"):
        return ":memory:"
    if not url.startswith("sqlite:///"):
        raise ValueError(f"not a SQLite URL: {url!r} (expected sqlite:///path/to/file.db)")
    return url[len("sqlite:///") :]


class SqliteStore(StoreBase):
    dialect = "sqlite"

    def __init__(self, path: str) -> None:
        self.path = path
        self._writer: aiosqlite.Connection | None = None
        self._reader: aiosqlite.Connection | None = None
        self._write_lock = asyncio.Lock()
        self._waiting = 0  # writers waiting for `_write_lock`
        self._batch: _Batch | None = None  # the open write transaction, if any
        self._tasks: set[asyncio.Task[None]] = set()
        self.commits = 0  # write transactions committed (each one fsync)

    @classmethod
    async def open(cls, url: str) -> SqliteStore:
        store = cls(_path_from_url(url))
        try:
            if store.path != ":memory:":
                Path(store.path).parent.mkdir(parents=True, exist_ok=True)
            store._writer = await store._connect()
            await _pragma(store._writer, "journal_mode=WAL")
            # The reader of an in-memory database would see another database: share the writer.
            store._reader = store._writer if store.path == ":memory:" else await store._connect()
        except (sqlite3.Error, OSError) as exc:
            await store.close()
            raise Database(f"cannot open SQLite database {store.path}: {exc}") from exc
        except BaseException:
            await store.close()
            raise
        return store

    async def _connect(self) -> aiosqlite.Connection:
        # isolation_level=None: we issue BEGIN/COMMIT ourselves.
        conn = await aiosqlite.connect(self.path, isolation_level=None)
        try:
            await _pragma(conn, f"busy_timeout={BUSY_TIMEOUT_MS}")
            await _pragma(conn, "synchronous=FULL")
            await _pragma(conn, "foreign_keys=ON")
        except BaseException:
            # Each aiosqlite connection owns a non-daemon thread: one left open here (a file
            # that opens but cannot be read, as on a read-only filesystem) keeps the process
            # from ever exiting after a failed start.
            await conn.close()
            raise
        return conn

    @asynccontextmanager
    async def transaction(self, lock_key: str | None = None) -> AsyncIterator[Queries]:
        """One write transaction, committed in a group with the writers waiting behind it.

        The writer's `BEGIN IMMEDIATE ... COMMIT` is shared: a writer that finds the
        transaction of a batch open joins it under a savepoint (its failure rolls back its
        own writes only); the writer that finds nobody waiting behind it, or the batch full,
        commits for all. Each is answered after that commit: an answered write is on disk.
        A lone writer commits at once. See docs/performance.md ("SQLite group commit").
        """
        conn = self._writer
        if conn is None:
            raise Database("store is closed")
        await self._acquire()
        try:
            try:
                batch, mark = await self._join(conn)
            except sqlite3.Error as exc:
                raise Database(str(exc)) from exc
            q = _SqliteQueries(conn)
            try:
                yield q
            except BaseException as exc:
                await self._roll_back(conn, batch, mark)
                if isinstance(exc, sqlite3.Error):
                    raise Database(str(exc)) from exc
                raise
        finally:
            await self._hand_on(conn)
        # Shielded: the future is shared by the batch's writers, and a cancelled await would
        # cancel it for all of them.
        await asyncio.shield(batch.done)
        self._committed(q)

    async def _acquire(self) -> None:
        """Take the writer, counted among those waiting for it while it is held."""
        self._waiting += 1
        try:
            await self._write_lock.acquire()
        except asyncio.CancelledError:
            self._waiting -= 1
            if not self._waiting and self._batch is not None and not self._write_lock.locked():
                # The holder left the batch open for this writer, which will not come: close it.
                self._spawn(self._flush())
            raise
        self._waiting -= 1

    async def _join(self, conn: aiosqlite.Connection) -> tuple[_Batch, str | None]:
        """Open a batch (`BEGIN IMMEDIATE`) or join the open one under a savepoint."""
        batch = self._batch
        if batch is None:
            await conn.execute("BEGIN IMMEDIATE")
            batch = self._batch = _Batch()
            return batch, None
        batch.marks += 1
        mark = f"w{batch.marks}"
        await conn.execute(f"SAVEPOINT {mark}")
        return batch, mark

    async def _roll_back(self, conn: aiosqlite.Connection, batch: _Batch, mark: str | None) -> None:
        """Undo one writer's writes: its savepoint, or the whole transaction if it opened it
        (nobody else is in a batch before its first writer ends)."""
        if mark is not None:
            with suppress(sqlite3.Error):
                await conn.execute(f"ROLLBACK TO {mark}")
            if conn.in_transaction:
                return
            # SQLite ended the transaction itself (an I/O error, a full disk): the writes of
            # the batch's earlier writers are gone with it.
            self._end(batch, Database("the write transaction was rolled back by SQLite"))
            return
        with suppress(sqlite3.Error):
            await conn.execute("ROLLBACK")
        self._end(batch, None)

    async def _hand_on(self, conn: aiosqlite.Connection) -> None:
        """Leave the open batch to the next waiting writer, or commit it and answer its
        writers; the next writer gets in once that is done."""
        commit = self._hand_on_now(conn)
        if commit is not None:
            await asyncio.shield(commit)

    def _hand_on_now(self, conn: aiosqlite.Connection) -> asyncio.Task[None] | None:
        """`_hand_on` without waiting: the commit's task, if it commits."""
        batch = self._batch
        if batch is None or (self._waiting and batch.marks < MAX_BATCH - 1):
            self._write_lock.release()
            return None
        commit = self._spawn(self._commit(conn, batch))
        # Released when the commit is done, even if this writer is cancelled meanwhile: a
        # writer let in before would open its transaction behind a COMMIT that may fail.
        commit.add_done_callback(lambda _: self._write_lock.release())
        return commit

    async def _commit(self, conn: aiosqlite.Connection, batch: _Batch) -> None:
        self._batch = None
        try:
            await conn.execute("COMMIT")
        except (sqlite3.Error, ValueError) as exc:  # ValueError: aiosqlite's closed connection
            with suppress(sqlite3.Error, ValueError):
                await conn.execute("ROLLBACK")
            self._end(batch, Database(str(exc)))
            return
        except BaseException:
            self._end(batch, Database("the write transaction was interrupted"))
            raise
        self.commits += 1
        self._end(batch, None)

    def _end(self, batch: _Batch, error: Database | None) -> None:
        if self._batch is batch:
            self._batch = None
        if batch.done.done():
            return
        if error is None:
            batch.done.set_result(None)
        else:
            batch.done.set_exception(error)
            batch.done.exception()  # retrieved: a batch may have no writer left to raise it

    async def _flush(self) -> None:
        """Commit a batch whose next writer went away."""
        conn = self._writer
        if conn is None:
            return
        await self._acquire()
        await self._hand_on(conn)

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def execute_new(
        self,
        new: NewCall,
        replay: tuple[Collection[str], str, str],
        *,
        owner: str | None = None,
        owner_only: bool = False,
    ) -> tuple[ExecuteNew, EffectRecord | None]:
        """`Store.execute_new` for SQLite: a read, then one `BEGIN IMMEDIATE` transaction,
        each one trip to its connection's thread (store/sqlite_hop.py).

        An effect that has the signature is answered "exists" (a replay included: the engine
        replays it with its event written best-effort, so a store that cannot write still
        serves replays); the new call's records are built only after that read missed. The
        single writer serialises new calls: there is no "busy".
        """
        org_id, session_id = new.org_id, new.session_id

        async def look(q: Queries) -> EffectRecord | None:
            if owner_only and not await _may_use(q, org_id, session_id, owner):
                raise _Refused
            return await q.get_effect_by_signature(org_id, new.call_signature)

        try:
            seen = await self._read(look)
            if seen is not None:
                return "exists", seen
            return await self._write_hop(_new_call_body(new, owner, owner_only)), None
        except _Refused:
            return "forbidden", None

    async def _read(self, body: Body[T]) -> T:
        """Reads of committed data in one trip to the reader's thread."""
        conn = self._reader
        if conn is None:
            raise Database("store is closed")
        try:
            return await in_thread(conn, lambda c: run_to_end(body(SyncQueries(c))))
        except sqlite3.Error as exc:
            raise Database(str(exc)) from exc

    async def _write_hop(self, body: Body[T], *, bare_ok: bool = False) -> T:
        """One write transaction, run whole in one trip to the writer's thread (`Hop`), in
        the group commit of `transaction`: it opens the batch or joins it under a savepoint,
        a failing body rolls back its own writes only, and the hop commits the batch itself
        when no other writer waits. Answered after the commit that holds its writes.

        `bare_ok`: with the writer free and nobody waiting, run the body with no transaction
        of its own (each statement commits alone: `autocommit`).
        """
        conn = self._writer
        if conn is None:
            raise Database("store is closed")
        bare = bare_ok and self._batch is None and not self._waiting
        bare = bare and not self._write_lock.locked()
        await self._acquire()  # when bare: free, taken at once, nobody came between
        batch: _Batch | None = None
        start = mark = None
        if not bare:
            batch = self._batch
            if batch is None:
                batch = self._batch = _Batch()
                start = "BEGIN IMMEDIATE"
            else:
                batch.marks += 1
                mark = f"w{batch.marks}"
                start = f"SAVEPOINT {mark}"
        full = batch is not None and batch.marks >= MAX_BATCH - 1
        loop = asyncio.get_running_loop()

        def after() -> None:  # in the writer's thread, once the hop is done
            with suppress(RuntimeError):  # the loop is closed: nobody left to tell
                loop.call_soon_threadsafe(self._hop_done, conn, hop, batch)

        # `commit_now` is read in the writer's thread after the body: a stale answer only
        # commits a batch that a writer arriving meanwhile could have joined, or leaves the
        # commit to `_hop_done` (which asks again in the loop).
        hop: Hop[T] = Hop(body, start, mark, lambda: full or not self._waiting, after)
        try:
            await in_thread(conn, hop.run)
        except asyncio.CancelledError:
            # Its writes are undone if its hop is still running and leaves its batch open
            # (`_hop_done`); after that they stand, as a generic writer's after its body.
            hop.abandoned = True
            raise
        except ValueError:  # aiosqlite's closed connection: the hop never ran
            hop.error = Database("store is closed")
            self._hop_done(conn, hop, batch)
        if hop.error is not None:
            if isinstance(hop.error, sqlite3.Error):
                raise Database(str(hop.error)) from hop.error
            raise hop.error
        if batch is not None:
            await asyncio.shield(batch.done)  # shared by the batch: see `transaction`
        if hop.events_written:
            self._events_committed()
        return cast(T, hop.value)

    def _hop_done(self, conn: aiosqlite.Connection, hop: Hop[Any], batch: _Batch | None) -> None:
        """In the loop as soon as a hop is done (before its writer's task resumes): end its
        batch if the hop ended it, and hand the writer on, so that the next writer starts a
        loop turn earlier."""
        if hop.abandoned and hop.end is HopEnd.OPEN:
            self._spawn(self._undo_abandoned(conn, hop, batch))
            return
        self._settle(hop, batch)
        self._hand_on_now(conn)
        if hop.abandoned and hop.end is HopEnd.COMMITTED and hop.events_written:
            self._events_committed()

    async def _undo_abandoned(
        self, conn: aiosqlite.Connection, hop: Hop[Any], batch: _Batch | None
    ) -> None:
        """Undo the writes of a hop whose writer was cancelled while it ran (it was never
        answered), then let the batch go on."""
        with suppress(ValueError, sqlite3.Error):
            await in_thread(conn, hop.undo_if_open)
        self._settle(hop, batch)
        self._hand_on_now(conn)

    def _settle(self, hop: Hop[Any], batch: _Batch | None) -> None:
        """End a hop's batch if the hop ended it."""
        if batch is None:
            return
        end = hop.end
        if end is HopEnd.COMMITTED:
            self.commits += 1
            self._end(batch, None)
        elif end is HopEnd.COMMIT_FAILED:
            self._end(batch, Database(str(hop.commit_error)))
        elif end is HopEnd.LOST:
            self._end(batch, Database("the write transaction was rolled back by SQLite"))
        elif end is HopEnd.ROLLED_BACK or (end is HopEnd.NOT_STARTED and hop.mark is None):
            self._end(batch, None)  # it was alone in the batch it opened

    @asynccontextmanager
    async def reader(self) -> AsyncIterator[Queries]:
        conn = self._reader
        if conn is None:
            raise Database("store is closed")
        try:
            yield _SqliteQueries(conn)
        except sqlite3.Error as exc:
            raise Database(str(exc)) from exc

    @asynccontextmanager
    async def autocommit(self) -> AsyncIterator[Queries]:
        """Single-statement writes: each call commits alone, in one trip to the writer's
        thread. With no other writer about, as cheap as a write gets (no BEGIN, no COMMIT);
        with writers waiting or a batch open, a write of the batch like any other (see
        `transaction`), one fsync for all."""
        if self._writer is None:
            raise Database("store is closed")
        yield cast(Queries, _HopQueries(self, bare_ok=True, one_call=False))

    @asynccontextmanager
    async def atomic(self) -> AsyncIterator[Queries]:
        """For one `Queries` call (a new call's commit, `finish_effect`): its own write
        transaction in the batch, run whole in one trip to the writer's thread."""
        if self._writer is None:
            raise Database("store is closed")
        yield cast(Queries, _HopQueries(self, bare_ok=False, one_call=True))

    async def schema_version(self) -> int:
        async with self.reader() as q:
            assert isinstance(q, _SqliteQueries)
            # Inside `reader()` a failing statement raises sqlite3.Error (turned into Database
            # only on the way out), so ask whether the table exists instead of catching.
            exists = await q._fetchrow(
                "SELECT 1 FROM sqlite_master WHERE type = 'table' "
                "AND name = 'undolog_schema_version'"
            )
            if exists is None:
                return 0
            row = await q._fetchrow("SELECT MAX(version) FROM undolog_schema_version")
        return int(row[0]) if row and row[0] is not None else 0

    async def migrate(self) -> int:
        conn = self._writer
        if conn is None:
            raise Database("store is closed")
        await self._acquire()
        try:
            try:
                if self._batch is not None:
                    await self._commit(conn, self._batch)
                await conn.execute("BEGIN IMMEDIATE")
                await conn.execute(
                    "CREATE TABLE IF NOT EXISTS undolog_schema_version "
                    "(version INTEGER PRIMARY KEY, applied_us INTEGER NOT NULL)"
                )
                async with conn.execute("SELECT MAX(version) FROM undolog_schema_version") as cur:
                    row = await cur.fetchone()
                current = int(row[0]) if row and row[0] is not None else 0
                for version, sql in load_migrations(self.dialect):
                    if version <= current:
                        continue
                    for statement in _statements(sql):
                        await conn.execute(statement)
                    await conn.execute(
                        "INSERT INTO undolog_schema_version (version, applied_us) VALUES (?, ?)",
                        (version, time.time_ns() // 1000),
                    )
                    current = version
                await conn.execute("COMMIT")
            except sqlite3.Error as exc:
                # No transaction to roll back when BEGIN itself failed (busy).
                with suppress(sqlite3.Error):
                    await conn.execute("ROLLBACK")
                raise Database(f"migration failed: {exc}") from exc
        finally:
            self._write_lock.release()
        return current

    async def close(self) -> None:
        conns = {id(c): c for c in (self._reader, self._writer) if c is not None}.values()
        self._reader = self._writer = None
        errors = []
        for conn in conns:
            # Close every one even if one fails: each holds a thread the process waits for.
            try:
                await conn.close()
            except sqlite3.Error as exc:
                errors.append(exc)
        if errors:
            raise Database(str(errors[0])) from errors[0]


class _Refused(Exception):
    """Rolls back `execute_new`'s transaction: the session is another key's."""


# The dialect primitives (`SqlQueries`), which a caller may use like any query.
_PRIMITIVES = frozenset({"_fetchrow", "_fetch", "_execute"})


class _HopQueries:
    """`Queries` for `atomic` and `autocommit`: each call is a write transaction of its
    own, run whole in one hop (`SqliteStore._write_hop`). `one_call`: a second call is
    refused (it would not be in the first one's transaction)."""

    def __init__(self, store: SqliteStore, *, bare_ok: bool, one_call: bool) -> None:
        self._store = store
        self._bare_ok = bare_ok
        self._one_call = one_call
        self._calls = 0

    def __getattr__(self, name: str) -> Callable[..., Awaitable[Any]]:
        if (name.startswith("_") and name not in _PRIMITIVES) or not callable(
            getattr(SqlQueries, name, None)
        ):
            raise AttributeError(name)

        async def call(*args: Any, **kwargs: Any) -> Any:
            self._calls += 1
            if self._one_call and self._calls > 1:
                raise RuntimeError("atomic() holds one Queries call: use transaction()")
            return await self._store._write_hop(
                lambda q: getattr(q, name)(*args, **kwargs), bare_ok=self._bare_ok
            )

        return call


async def _insert_executing(
    q: Queries, effect: EffectRecord, undo: UndoEntryRecord | None, event_type: str, payload: str
) -> bool:
    # The event type was checked where `execute_new`'s caller spelled it (an EventType).
    return await q.insert_executing_effect(effect, undo, event_type, payload)


def _new_call_body(new: NewCall, owner: str | None, owner_only: bool) -> Body[ExecuteNew]:
    """`execute_new`'s write transaction, its records built now (the read missed)."""
    effect, undo, event = new.records()

    async def write(q: Queries) -> ExecuteNew:
        session = await q.touch_session(
            new.org_id, new.session_id, effect.step_index, effect.created_us, owner
        )
        # Again under the write lock: another key may have created the session since the
        # read; then the touch is rolled back.
        if owner_only and session.owner_key_id != owner:
            raise _Refused
        if session.state != _ACTIVE:
            return "closed"
        if not await _insert_executing(q, effect, undo, *event):
            return "busy"  # inserted meanwhile by a step-less call: full path
        return "inserted"

    return write


async def _may_use(q: Queries, org_id: str, session_id: str, owner: str | None) -> bool:
    """Whether a key held to its own sessions may use this one (absent: it will own it)."""
    found, owner_key_id = await q.session_owner(org_id, "session", session_id)
    return not found or owner_key_id == owner


def _statements(script: str) -> list[str]:
    """Split a migration script into statements (our scripts have no `;` inside literals;
    a trigger's `BEGIN ... END;` body is kept whole: `sqlite3.complete_statement` says
    where a statement ends)."""
    body = re.sub(r"--[^\n]*", "", script)
    statements, current = [], ""
    for piece in body.split(";"):
        current += piece + ";"
        if sqlite3.complete_statement(current):
            if current.strip(" \t\n;"):
                statements.append(current.strip())
            current = ""
    return statements


if TYPE_CHECKING:  # mypy checks that the store and its queries meet the protocol
    _store: Store = SqliteStore(":memory:")
    _queries: Queries = _SqliteQueries(cast("aiosqlite.Connection", None))
