"""The store as the engine sees it.

`Store` (a protocol: two implementations) opens units of work (`transaction`, `reader`,
`autocommit`, `atomic`) that hand out `Queries`, the reads and writes of rows
(store/records.py). Two implementations ship:
SQLite (store/sqlite.py) and PostgreSQL (store/postgres.py), both on the shared SQL in
store/_sql/. The store knows nothing of the engine: it checks no state machine; where a
statement filters on a state, the state is a parameter (the defaults are the wire values).
See docs/architecture.md for the store contract.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Any, ClassVar, Literal, Protocol

from undolog.store._sql import SqlQueries
from undolog.store.records import (
    EffectRecord,
    Finish,
    UndoEntryRecord,
)

__all__ = ["ExecuteNew", "NewCall", "NewRecords", "Queries", "Store"]

# What `Store.execute_new` did: wrote the new call, or replayed it, or found its signature
# taken, its lock busy or its session not active (the engine takes its full path).
# "forbidden": the session is another key's and the caller may use only its own.
ExecuteNew = Literal["inserted", "replayed", "exists", "busy", "closed", "forbidden"]

# A new call's records: its effect, its undo entry (if any) and its event (a type, a payload).
NewRecords = tuple[EffectRecord, UndoEntryRecord | None, tuple[str, str]]


@dataclass(frozen=True, slots=True)
class NewCall:
    """A new call as `Store.execute_new` takes it: the key a store looks it up by, and its
    records, built on demand. A store that reads before it writes (SQLite) builds them only
    when the signature is not taken, so a replay pays nothing for a call it does not make."""

    org_id: str
    session_id: str
    call_signature: str
    records: Callable[[], NewRecords]

    @classmethod
    def of(
        cls, effect: EffectRecord, undo: UndoEntryRecord | None, event: tuple[str, str]
    ) -> NewCall:
        """A new call whose records are already built."""
        built: NewRecords = (effect, undo, event)
        return cls(effect.org_id, effect.session_id, effect.call_signature, lambda: built)


# The reads and writes of one unit of work (one connection, maybe one transaction): one
# implementation, the SQL both stores share (store/_sql), over three dialect primitives that
# each store supplies. It is named here, not mirrored by a protocol: the seam with two
# implementations is `Store`, below.
Queries = SqlQueries


class Store(Protocol):
    """A database behind `Queries`. Open one with `undolog.store.open_store`."""

    dialect: ClassVar[str]

    async def execute_new(
        self,
        new: NewCall,
        replay: tuple[Collection[str], str, str],
        *,
        owner: str | None = None,
        owner_only: bool = False,
    ) -> tuple[ExecuteNew, EffectRecord | None]:
        """Record a new call: the one operation for it, which every store implements its own
        way (PostgreSQL: one round trip, the `undolog_execute_new` function; SQLite: its own
        `BEGIN IMMEDIATE` transaction). The engine asks for every numbered call that the
        decision table would execute if it were new in an active session.

        First of all, with `owner_only`, a session that exists and is not `owner`'s (or has
        no owner) answers "forbidden" with nothing read or written. A session it creates is
        recorded as `owner`'s.

        If an effect has the signature: "replayed" when it is in one of `replay`'s states
        (and `replay`'s event, a type and a payload, is written), else "exists"; both return
        that effect. A store may answer "exists" for a replayable one too: the engine then
        replays it, its event written best-effort on its own (SQLite does). Otherwise, under
        the signature's lock (not waited for: "busy"), and only if the session, touched as
        `touch_session` does, is active ("closed"), insert `new`'s records — its effect with
        its undo entry and event ("inserted"); a store calls `new.records()` only when it
        writes them or must send them (once at most). The engine decides when to ask;
        "exists", "busy" and "closed" send it down its full path, which holds the whole
        decision table.
        """

    async def finish_effect(self, finish: Finish) -> EffectRecord | None:
        """`Queries.finish_effect` as a unit of work of its own: committed (on disk) when it
        returns. A store may send concurrent ones together (PostgreSQL: one statement, one
        transaction for the finishes that wait for one another, `store/pg_group.py`); each
        is what it would be alone. SQLite: `Queries.finish_effect` in `atomic()`."""

    def on_events(self, callback: Callable[[], None]) -> Callable[[], None]:
        """Call `callback` after each commit that wrote events; returns a remover."""

    async def listen(self, channel: str, callback: Callable[[], None]) -> Callable[[], Any]:
        """Be called when another process announces events (PostgreSQL LISTEN); returns an
        async closer. Stores that cannot hear other processes do nothing."""

    async def announce(self, channel: str) -> None:
        """Tell other processes that events were written (PostgreSQL NOTIFY)."""

    def transaction(self, lock_key: str | None = None) -> AbstractAsyncContextManager[Queries]:
        """One write transaction; committed on a clean exit, rolled back on an exception.

        `lock_key` (a call signature) serialises transactions on the same key: PostgreSQL
        takes `pg_advisory_xact_lock` with bounded retries (`AdvisoryLockTimeout`); SQLite's
        `BEGIN IMMEDIATE` already serialises every writer.
        """

    def reader(self) -> AbstractAsyncContextManager[Queries]:
        """Reads outside a transaction (each statement sees committed data)."""

    def atomic(self) -> AbstractAsyncContextManager[Queries]:
        """For one `Queries` call that a dialect does in a single statement: no explicit
        transaction needed there (PostgreSQL). SQLite: a transaction."""

    def autocommit(self) -> AbstractAsyncContextManager[Queries]:
        """Single-statement writes outside an explicit transaction (each commits alone)."""

    async def migrate(self) -> int:
        """Apply pending migrations; return the schema version now in force."""

    async def schema_version(self) -> int: ...

    async def writable(self) -> bool:
        """Whether the store answers and takes writes now (`/ready`): a PostgreSQL standby or
        a read-only database answers reads but does not. Raises `Database` when it does not
        answer at all."""

    async def close(self) -> None: ...
