"""SQLite: `execute_new`'s signature read runs in the loop's thread, on a connection of its
own that never waits for a lock; a busy answer sends the read to the reader's thread instead.

That read is a point lookup on an index: run inline it costs the proxy a third of a trip to
the reader's thread (the thread hand-off, its wake-ups and the loop's callback).
"""

from __future__ import annotations

import sqlite3
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiosqlite
import pytest

from tests.store.contract_helpers import make_effect, make_undo
from tests.store.test_sqlite_group_commit import sqlite_store
from undolog.store import NewCall
from undolog.store.sqlite import SqliteStore
from undolog_sdk.errors import Database

REPLAY = (("committed",), "effect_replayed", '{"stage":"replayed"}')
INTERCEPTED = ("effect_intercepted", '{"stage":"executing"}')
__all__ = ["sqlite_store"]  # the fixture, used here


@pytest.fixture
def reader_hops(
    sqlite_store: SqliteStore, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Counter[str]]:
    """Trips to the reader's thread (every aiosqlite operation goes through `_execute`)."""
    counted: Counter[str] = Counter()
    execute = aiosqlite.Connection._execute
    reader = sqlite_store._reader

    async def counting(self: aiosqlite.Connection, fn: Any, *args: Any, **kwargs: Any) -> Any:
        if self is reader:
            counted["reader"] += 1
        return await execute(self, fn, *args, **kwargs)

    monkeypatch.setattr(aiosqlite.Connection, "_execute", counting)
    yield counted


class _Failing:
    """A connection whose every statement fails with one SQLite error."""

    def __init__(self, message: str, code: int) -> None:
        self.message, self.code, self.statements = message, code, 0

    def execute(self, sql: str, args: Any = ()) -> Any:
        self.statements += 1
        error = sqlite3.OperationalError(self.message)
        error.sqlite_errorcode = self.code
        raise error

    def close(self) -> None:
        pass


async def _new_call(store: SqliteStore, org_id: str) -> tuple[str, Any]:
    effect = make_effect(org_id)
    outcome, _ = await store.execute_new(NewCall.of(effect, make_undo(effect), INTERCEPTED), REPLAY)
    again, seen = await store.execute_new(
        NewCall.of(effect, make_undo(effect), INTERCEPTED), REPLAY
    )
    assert outcome == "inserted"
    return again, seen


async def test_the_signature_read_sees_an_answered_write_without_a_trip_to_the_reader(
    sqlite_store: SqliteStore, reader_hops: Counter[str]
) -> None:
    again, seen = await _new_call(sqlite_store, "org-inline")
    assert again == "exists" and seen is not None and seen.org_id == "org-inline"
    assert reader_hops == {}


async def test_a_busy_inline_read_is_read_again_in_the_readers_thread(
    sqlite_store: SqliteStore, reader_hops: Counter[str]
) -> None:
    inline = sqlite_store._inline
    busy = _Failing("database is locked", sqlite3.SQLITE_BUSY)
    sqlite_store._inline = busy  # type: ignore[assignment]
    try:
        again, seen = await _new_call(sqlite_store, "org-busy")
    finally:
        sqlite_store._inline = inline
    assert again == "exists" and seen is not None and seen.org_id == "org-busy"
    assert busy.statements == 2 and reader_hops == {"reader": 2}


async def test_another_inline_read_error_is_the_stores_error_with_no_second_read(
    sqlite_store: SqliteStore, reader_hops: Counter[str]
) -> None:
    inline = sqlite_store._inline
    sqlite_store._inline = _Failing("disk I/O error", sqlite3.SQLITE_IOERR)  # type: ignore[assignment]
    try:
        with pytest.raises(Database, match="disk I/O error"):
            await _new_call(sqlite_store, "org-ioerr")
    finally:
        sqlite_store._inline = inline
    assert reader_hops == {}


async def test_the_inline_connection_is_read_only_and_closed_with_the_store(tmp_path: Path) -> None:
    store = await SqliteStore.open(f"sqlite:///{tmp_path / 'inline.db'}")
    inline = store._inline
    assert inline is not None
    with pytest.raises(sqlite3.OperationalError, match="readonly"):
        inline.execute("CREATE TABLE t (x)")
    await store.close()
    with pytest.raises(sqlite3.ProgrammingError):
        inline.execute("SELECT 1")


async def test_an_in_memory_store_reads_in_its_connections_thread() -> None:
    store = await SqliteStore.open("sqlite:///:memory:")
    try:
        await store.migrate()
        assert store._inline is None
        again, _ = await _new_call(store, "org-memory")
        assert again == "exists"
    finally:
        await store.close()
