"""The stores' shared behaviour (event listeners, defaults) and their migrations.

The protocol the engine depends on is store/protocol.py; the SQL both stores share is
store/_sql/. A dialect subclasses `StoreBase` and binds `SqlQueries` to its connections.
"""

from __future__ import annotations

import abc
import re
from collections.abc import Callable, Collection
from contextlib import AbstractAsyncContextManager
from importlib import resources
from typing import Any, ClassVar

from undolog.store.protocol import ExecuteNew, NewCall, Queries
from undolog.store.records import EffectRecord, Finish

__all__ = ["StoreBase", "load_migrations"]


class StoreBase(abc.ABC):
    """What both stores share (the `Store` protocol's behaviour that is not SQL)."""

    dialect: ClassVar[str]

    @abc.abstractmethod
    async def execute_new(
        self,
        new: NewCall,
        replay: tuple[Collection[str], str, str],
        *,
        owner: str | None = None,
        owner_only: bool = False,
    ) -> tuple[ExecuteNew, EffectRecord | None]:
        """Record a new call, each store its own way (see `Store.execute_new`)."""

    async def finish_effect(self, finish: Finish) -> EffectRecord | None:
        """`Queries.finish_effect` in its own `atomic()` unit (see `Store.finish_effect`)."""
        async with self.atomic() as q:
            return await q.finish_effect(finish)

    def on_events(self, callback: Callable[[], None]) -> Callable[[], None]:
        """Call `callback` after each commit that wrote events; returns a remover."""
        listeners: list[Callable[[], None]] = self.__dict__.setdefault("_event_listeners", [])
        listeners.append(callback)
        return lambda: listeners.remove(callback) if callback in listeners else None

    def _committed(self, q: Queries) -> None:
        if q.events_written:
            self._events_committed()

    def _events_committed(self) -> None:
        """Events were committed: tell the listeners."""
        for callback in list(self.__dict__.get("_event_listeners", ())):
            callback()

    async def listen(self, channel: str, callback: Callable[[], None]) -> Callable[[], Any]:
        """Be called when another process announces events (PostgreSQL LISTEN); returns an
        async closer. Stores that cannot hear other processes do nothing."""

        async def close() -> None:
            return None

        return close

    async def announce(self, channel: str) -> None:
        """Tell other processes that events were written (PostgreSQL NOTIFY)."""
        return None

    @abc.abstractmethod
    def transaction(self, lock_key: str | None = None) -> AbstractAsyncContextManager[Queries]:
        """One write transaction; committed on a clean exit, rolled back on an exception.

        `lock_key` (a call signature) serialises transactions on the same key: PostgreSQL
        takes `pg_advisory_xact_lock` with bounded retries (`AdvisoryLockTimeout`); SQLite's
        `BEGIN IMMEDIATE` already serialises every writer.
        """

    @abc.abstractmethod
    def reader(self) -> AbstractAsyncContextManager[Queries]:
        """Reads outside a transaction (each statement sees committed data)."""

    def atomic(self) -> AbstractAsyncContextManager[Queries]:
        """For one `Queries` call that a dialect does in a single statement: no explicit
        transaction needed there (PostgreSQL). By default, a transaction."""
        return self.transaction()

    @abc.abstractmethod
    def autocommit(self) -> AbstractAsyncContextManager[Queries]:
        """Single-statement writes outside an explicit transaction (each commits alone)."""

    @abc.abstractmethod
    async def migrate(self) -> int:
        """Apply pending migrations; return the schema version now in force."""

    @abc.abstractmethod
    async def schema_version(self) -> int: ...

    async def writable(self) -> bool:
        """By default a store that answers takes writes (SQLite: a file this process opened
        for writing)."""
        await self.schema_version()
        return True

    @abc.abstractmethod
    async def close(self) -> None: ...


_MIGRATION_NAME = re.compile(r"^(\d{4})_[a-z0-9_]+\.sql$")


def has_statements(sql: str) -> bool:
    """Whether a migration holds any SQL besides comments (a driver refuses an empty query)."""
    return any(line.strip() and not line.lstrip().startswith("--") for line in sql.splitlines())


def load_functions(dialect: str) -> str:
    """The dialect's stored functions as they are now (`functions/<dialect>.sql`), applied by
    every migrate after the numbered migrations; "" for a dialect without any."""
    item = resources.files("undolog.store").joinpath("functions", f"{dialect}.sql")
    return item.read_text(encoding="utf-8") if item.is_file() else ""


def load_migrations(dialect: str) -> list[tuple[int, str]]:
    """The numbered SQL migrations shipped for a dialect, in order."""
    folder = resources.files("undolog.store").joinpath("migrations", dialect)
    found = []
    for item in folder.iterdir():
        match = _MIGRATION_NAME.match(item.name)
        if match:
            found.append((int(match.group(1)), item.read_text(encoding="utf-8")))
    return sorted(found)
