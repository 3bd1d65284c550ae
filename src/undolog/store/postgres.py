"""PostgreSQL store: for production and for more than one proxy process.

All instances share the database. A write transaction keyed by a call signature first takes
`pg_try_advisory_xact_lock` on it, retrying up to `lock_max_attempts` times `lock_retry_ms`
apart, then raises `AdvisoryLockTimeout`; the lock is released with the transaction. Inserts
rely on `UNIQUE (org_id, call_signature)` with `ON CONFLICT DO NOTHING` as the safety net.
"""

from __future__ import annotations

import contextlib
import hashlib
import time
from collections.abc import AsyncIterator, Callable, Collection, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import TYPE_CHECKING, Any, cast

import asyncpg
import orjson

from undolog.store._columns import numbered
from undolog.store._sql import EFFECT, SqlQueries
from undolog.store._sql.rows import UNDO
from undolog.store.base import StoreBase, has_statements, load_functions, load_migrations
from undolog.store.pg_group import FINISH, NEW_CALL, CallGroup
from undolog.store.protocol import ExecuteNew, NewCall, Queries, Store
from undolog.store.records import SESSION_TOUCH_US, EffectRecord, Finish, UndoEntryRecord
from undolog_sdk.errors import AdvisoryLockTimeout, Database
from undolog_sdk.wire import SessionState

__all__ = ["PostgresStore", "advisory_key"]

# The state of a session that takes new calls (a parameter of `undolog_execute_new`).
_ACTIVE = SessionState.ACTIVE.value

# A session-level lock around migrations, so two processes migrating at once take turns.
_MIGRATION_LOCK_KEY = 0x756E646F6C6F67  # "undolog"


def advisory_key(signature: str) -> int:
    """The signed 64-bit advisory lock key of a call signature (its first 8 bytes)."""
    value = int(signature[:16], 16)
    return value - (1 << 64) if value >= 1 << 63 else value


# Per connection attempt: an unreachable server fails the start instead of stalling it.
CONNECT_TIMEOUT_SECONDS = 10.0

# InternalClientError (neither of the other two): e.g. a query on a connection the server
# has just terminated can fail with it instead of ConnectionDoesNotExistError.
_DRIVER_ERRORS = (
    asyncpg.PostgresError,
    asyncpg.InterfaceError,
    asyncpg.InternalClientError,
    OSError,
)


async def _keep(conn: asyncpg.Connection) -> None:
    """Hand a connection back to the pool as it is.

    asyncpg's default reset costs a round trip on every release (RESET ALL, UNLISTEN, ...);
    our connections carry no session state: locks are transaction-scoped, settings are
    `SET LOCAL`, and LISTEN uses a connection of its own, outside the pool.
    """


# The columns a new undo entry is written with (the rest come from its effect's row or
# keep their defaults: `seq`, `last_error`, the claim).
_NEW_UNDO_COLUMNS = (
    "entry_id", "fn_name", "fn_version", "args", "max_retries", "retry_backoff_ms",
    "registered_us", "state", "attempts", "updated_us", "runner",
)  # fmt: skip


def _new_call(
    new: NewCall, replay: tuple[Collection[str], str, str], owner: str | None, owner_only: bool
) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
    """The parameters of `undolog_execute_new` (migrations 4, 7, 9, 10, 20) for one call: its
    own, and those every call shares (`pg_group`). The records travel with the call, so they
    are built before it."""
    e, u, event = new.records()
    replay_states, replay_type, replay_payload = replay
    args = (
        advisory_key(e.call_signature), e.effect_id, e.org_id, e.session_id, e.step_index,
        e.tool_name, e.tool_version, e.tier, e.call_signature, e.args_json, e.state, e.mode,
        e.attempts, e.lease_expires_us, e.executed_us, e.created_us, *event,
        u and u.entry_id, u and u.fn_name, u and u.fn_version, u and u.args_json,
        u and u.max_retries, u and u.retry_backoff_ms, u and u.registered_us,
        u and u.state, u and u.runner, replay_payload, owner, owner_only,
    )  # fmt: skip
    return args, (tuple(replay_states), replay_type, _ACTIVE, SESSION_TOUCH_US)


def _outcome(row: Sequence[Any]) -> tuple[ExecuteNew, EffectRecord | None]:
    outcome: ExecuteNew = row[0]
    if row[0] == "replayed_unlogged":  # served although its event could not be written
        outcome = "replayed"
    found = outcome in ("replayed", "exists")
    return outcome, EFFECT.row(row[1:]) if found else None


def _finish(f: Finish) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
    """The parameters of `undolog_finish_effect` (migration 22) for one call: its own, and
    those every call of a batch shares (`pg_group`)."""
    extra = orjson.dumps(f.extra).decode()
    args = (f.org_id, f.effect_id, f.target, f.result_json, f.error, f.now_us, f.event_type, extra)
    return args, (tuple(f.from_states), f.self_reporting_mode)


_NEW_CALL_SQL = NEW_CALL.single_sql()
_FINISH_SQL = FINISH.single_sql()


class _PostgresQueries(SqlQueries):
    _SKIP_LOCKED = " FOR UPDATE SKIP LOCKED"
    _SKIP_LOCKED_SESSIONS = " FOR UPDATE OF s SKIP LOCKED"

    def __init__(self, conn: asyncpg.Connection) -> None:
        self._conn = conn

    async def lock_org_prune(self, org_id: str, *, wait: bool = False) -> bool:
        """The org's transaction-scoped advisory lock (without `wait`: only if free): two
        pruners never record what they prune of one org at once (each mark's hash is computed
        from the marks before it)."""
        key = advisory_key(hashlib.sha256(f"audit-prune:{org_id}".encode()).hexdigest())
        if wait:
            await self._conn.execute("SELECT pg_advisory_xact_lock($1)", key)
            return True
        return bool(await self._conn.fetchval("SELECT pg_try_advisory_xact_lock($1)", key))

    async def replace_webhook_subscriptions(
        self, subscriptions: Sequence[tuple[str, str, str]]
    ) -> None:
        """As on every store; then the outbox trigger is on only while someone subscribes.
        A plpgsql row trigger costs about 30 µs per event insert (migration 14); the switch
        takes a lock on `events`, so it is made only when the state changes (at a start)."""
        await super().replace_webhook_subscriptions(subscriptions)
        wanted = "O" if subscriptions else "D"
        current = await self._conn.fetchval(
            "SELECT tgenabled::text FROM pg_trigger WHERE tgrelid = 'events'::regclass "
            "AND tgname = 'events_to_webhook_outbox'"
        )
        if current != wanted:
            action = "ENABLE" if subscriptions else "DISABLE"
            await self._conn.execute(
                f"ALTER TABLE events {action} TRIGGER events_to_webhook_outbox"
            )

    async def finish_effect(self, finish: Finish) -> EffectRecord | None:
        """`undolog_finish_effect` alone, on this connection (the store's `finish_effect`
        sends it through its group): the update and its event row in one statement."""
        args, shared = _finish(finish)
        row = await self._conn.fetchrow(_FINISH_SQL, *FINISH.single_args(args, shared))
        self.events_written = row is not None
        return EFFECT.row(row) if row is not None else None

    async def insert_executing_effect(
        self,
        effect: EffectRecord,
        undo: UndoEntryRecord | None,
        event_type: str,
        payload_json: str,
    ) -> bool:
        # One statement: the undo entry and the event are written only if the effect was.
        self.events_written = True
        args: list[Any] = [*EFFECT.values(effect)]
        undo_sql = ""
        if undo is not None:
            values = dict(zip(UNDO.names, UNDO.values(undo), strict=True))
            values["updated_us"] = undo.registered_us
            names = _NEW_UNDO_COLUMNS
            args += [values[n] for n in names]
            undo_sql = (
                ", u AS (INSERT INTO undo_entries (org_id, session_id, effect_id, "
                f"{', '.join(names)}) SELECT org_id, session_id, effect_id, "
                f"{', '.join('?' for _ in names)} FROM ins)"
            )
        args += [event_type, payload_json]
        sql = (
            f"WITH ins AS ({EFFECT.insert('effects')} "
            "ON CONFLICT (org_id, call_signature) DO NOTHING "
            "RETURNING org_id, session_id, effect_id, created_us)"
            f"{undo_sql}, ev AS (INSERT INTO events (org_id, type, session_id, effect_id, "
            "payload, created_us) SELECT org_id, ?, session_id, effect_id, ?, created_us "
            "FROM ins) SELECT count(*) FROM ins"
        )
        row = await self._conn.fetchrow(numbered(sql), *args)
        return bool(row and row[0])

    async def execute_new(
        self,
        new: NewCall,
        replay: tuple[Collection[str], str, str],
        owner: str | None,
        owner_only: bool,
    ) -> tuple[ExecuteNew, EffectRecord | None]:
        """`undolog_execute_new` alone, on this connection (the store's `execute_new` sends
        it through its group of new calls)."""
        args, shared = _new_call(new, replay, owner, owner_only)
        row = await self._conn.fetchrow(_NEW_CALL_SQL, *NEW_CALL.single_args(args, shared))
        assert row is not None
        outcome, effect = _outcome(tuple(row))
        self.events_written = outcome in ("inserted", "replayed")
        return outcome, effect

    async def _fetchrow(self, sql: str, *args: Any) -> Sequence[Any] | None:
        row = await self._conn.fetchrow(numbered(sql), *args)
        return tuple(row) if row is not None else None

    async def _fetch(self, sql: str, *args: Any) -> list[Sequence[Any]]:
        return [tuple(r) for r in await self._conn.fetch(numbered(sql), *args)]

    async def _execute(self, sql: str, *args: Any) -> int:
        status: str = await self._conn.execute(numbered(sql), *args)
        # "INSERT 0 1", "UPDATE 3", "DELETE 0": the row count is the last word.
        tail = status.rsplit(" ", 1)[-1]
        return int(tail) if tail.isdigit() else 0


class PostgresStore(StoreBase):
    dialect = "postgres"

    def __init__(
        self,
        pool: asyncpg.Pool,
        *,
        lock_max_attempts: int = 50,
        lock_retry_ms: int = 10,
        dsn: str = "",
    ) -> None:
        self._pool = pool
        self._dsn = dsn
        self._group = CallGroup(pool, NEW_CALL)
        self._finishes = CallGroup(pool, FINISH)
        self.lock_max_attempts = max(1, lock_max_attempts)
        self.lock_retry_ms = max(0, lock_retry_ms)

    @classmethod
    async def open(
        cls,
        url: str,
        *,
        lock_max_attempts: int = 50,
        lock_retry_ms: int = 10,
        min_size: int = 2,
        max_size: int = 20,
    ) -> PostgresStore:
        dsn = "postgresql://" + url.split("://", 1)[1]
        try:
            pool = await asyncpg.create_pool(
                dsn,
                min_size=min_size,
                max_size=max_size,
                command_timeout=60,
                reset=_keep,
                timeout=CONNECT_TIMEOUT_SECONDS,
            )
        except (TimeoutError, *_DRIVER_ERRORS) as exc:
            raise Database(f"cannot connect to PostgreSQL: {exc}") from exc
        assert pool is not None
        return cls(pool, lock_max_attempts=lock_max_attempts, lock_retry_ms=lock_retry_ms, dsn=dsn)

    async def _lock(self, conn: asyncpg.Connection, signature: str) -> None:
        """Take the signature's transaction-scoped advisory lock, or `AdvisoryLockTimeout`.

        The first attempt does not wait (one round trip when, as usual, nobody holds it).
        The remaining `lock_max_attempts - 1` attempts become one blocking wait of that many
        `lock_retry_ms` under `lock_timeout`: PostgreSQL queues waiters in arrival order,
        which polling would not, and a burst of duplicates does not poll the server.
        """
        key = advisory_key(signature)
        if await conn.fetchval("SELECT pg_try_advisory_xact_lock($1)", key):
            return
        budget_ms = (self.lock_max_attempts - 1) * self.lock_retry_ms
        if budget_ms <= 0:
            raise AdvisoryLockTimeout(signature, self.lock_max_attempts)
        try:
            # `key` is an int we computed: safe to inline; a simple query runs both at once.
            await conn.execute(
                f"SET LOCAL lock_timeout = '{budget_ms}ms'; SELECT pg_advisory_xact_lock({key})"
            )
        except asyncpg.LockNotAvailableError:
            raise AdvisoryLockTimeout(signature, self.lock_max_attempts) from None
        await conn.execute("SET LOCAL lock_timeout = DEFAULT")

    @asynccontextmanager
    async def transaction(self, lock_key: str | None = None) -> AsyncIterator[Queries]:
        try:
            async with self._pool.acquire() as conn, conn.transaction():
                if lock_key is not None:
                    await self._lock(conn, lock_key)
                q = _PostgresQueries(conn)
                yield q
        except _DRIVER_ERRORS as exc:
            raise Database(str(exc)) from exc
        self._committed(q)

    @asynccontextmanager
    async def reader(self) -> AsyncIterator[Queries]:
        try:
            async with self._pool.acquire() as conn:
                q = _PostgresQueries(conn)
                yield q
        except _DRIVER_ERRORS as exc:
            raise Database(str(exc)) from exc
        self._committed(q)

    async def execute_new(
        self,
        new: NewCall,
        replay: tuple[Collection[str], str, str],
        *,
        owner: str | None = None,
        owner_only: bool = False,
    ) -> tuple[ExecuteNew, EffectRecord | None]:
        # In autocommit: the statement is its own transaction (alone, or a batch of calls
        # that waited for one another: `pg_group`), so the advisory locks it takes are
        # released when it returns.
        args, shared = _new_call(new, replay, owner, owner_only)
        key = (new.org_id, new.session_id, new.call_signature)
        try:
            row = await self._group.run(key, args, shared)
        except _DRIVER_ERRORS as exc:
            raise Database(str(exc)) from exc
        assert row is not None  # every way out of the function answers a row
        if row[0] in ("inserted", "replayed"):  # an event was written
            self._events_committed()
        return _outcome(row)

    async def finish_effect(self, finish: Finish) -> EffectRecord | None:
        # In autocommit, as `execute_new`: alone, or in a batch of finishes that waited for
        # one another (`pg_group`), ordered by effect so that batches lock rows in one order.
        args, shared = _finish(finish)
        try:
            row = await self._finishes.run((finish.org_id, finish.effect_id), args, shared)
        except _DRIVER_ERRORS as exc:
            raise Database(str(exc)) from exc
        if row is None:
            return None
        self._events_committed()
        return EFFECT.row(row)

    async def listen(self, channel: str, callback: Callable[[], None]) -> Callable[[], Any]:
        """LISTEN on a dedicated connection; `callback` runs on every notification."""
        try:
            conn = await asyncpg.connect(self._dsn, timeout=10)
            await conn.add_listener(channel, lambda *_: callback())
        except (*_DRIVER_ERRORS, TimeoutError) as exc:
            raise Database(f"cannot LISTEN on {channel}: {exc}") from exc

        async def close() -> None:
            with contextlib.suppress(*_DRIVER_ERRORS):
                await conn.close()

        return close

    async def announce(self, channel: str) -> None:
        try:
            async with self._pool.acquire() as conn:
                await conn.execute("SELECT pg_notify($1, '')", channel)
        except _DRIVER_ERRORS as exc:
            raise Database(str(exc)) from exc

    def autocommit(self) -> AbstractAsyncContextManager[Queries]:
        return self.reader()

    def atomic(self) -> AbstractAsyncContextManager[Queries]:
        return self.reader()

    async def schema_version(self) -> int:
        try:
            async with self._pool.acquire() as conn:
                exists = await conn.fetchval("SELECT to_regclass('undolog_schema_version')")
                if exists is None:
                    return 0
                value = await conn.fetchval("SELECT MAX(version) FROM undolog_schema_version")
        except _DRIVER_ERRORS as exc:
            raise Database(str(exc)) from exc
        return int(value or 0)

    async def writable(self) -> bool:
        """Whether the server this pool reaches takes writes: neither a standby in recovery
        (the primary is gone and the URL has no `target_session_attrs=read-write`, or a
        connection outlived a switchover) nor read-only (`default_transaction_read_only`)."""
        try:
            async with self._pool.acquire() as conn:
                return bool(
                    await conn.fetchval(
                        "SELECT NOT pg_is_in_recovery() "
                        "AND current_setting('transaction_read_only') = 'off'"
                    )
                )
        except _DRIVER_ERRORS as exc:
            raise Database(str(exc)) from exc

    async def autovacuum_on(self) -> bool:
        """Whether the server runs autovacuum, which also keeps the planner's statistics.

        The store's statements are planned once per connection and cached. Without
        statistics (autovacuum off and no ANALYZE), plans made while `effects` was small stay:
        PostgreSQL may then find an effect by its signature through `effects_by_session`,
        reading every effect of the org on each call. An ANALYZE (autovacuum's, or anyone's)
        makes every connection plan again."""
        try:
            async with self._pool.acquire() as conn:
                return bool(await conn.fetchval("SELECT current_setting('autovacuum') = 'on'"))
        except _DRIVER_ERRORS as exc:
            raise Database(str(exc)) from exc

    async def migrate(self) -> int:
        try:
            async with self._pool.acquire() as conn:
                await conn.execute("SELECT pg_advisory_lock($1)", _MIGRATION_LOCK_KEY)
                try:
                    async with conn.transaction():
                        await conn.execute(
                            "CREATE TABLE IF NOT EXISTS undolog_schema_version "
                            "(version INTEGER PRIMARY KEY, applied_us BIGINT NOT NULL)"
                        )
                        current = int(
                            await conn.fetchval("SELECT MAX(version) FROM undolog_schema_version")
                            or 0
                        )
                        for version, sql in load_migrations(self.dialect):
                            if version <= current:
                                continue
                            if has_statements(sql):  # some hold only the history now
                                await conn.execute(sql)
                            await conn.execute(
                                "INSERT INTO undolog_schema_version (version, applied_us) "
                                "VALUES ($1, $2)",
                                version,
                                time.time_ns() // 1000,
                            )
                            current = version
                        # The functions as they are now, whatever the version was: a release
                        # that changes one needs no migration that re-pastes it.
                        await conn.execute(load_functions(self.dialect))
                finally:
                    await conn.execute("SELECT pg_advisory_unlock($1)", _MIGRATION_LOCK_KEY)
        except _DRIVER_ERRORS as exc:
            raise Database(f"migration failed: {exc}") from exc
        return current

    async def close(self) -> None:
        await self._pool.close()


if TYPE_CHECKING:  # mypy checks that the store and its queries meet the protocol
    _store: Store = PostgresStore(cast("asyncpg.Pool", None))
    _queries: Queries = _PostgresQueries(cast("asyncpg.Connection", None))
