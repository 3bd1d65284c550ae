"""The event broker's high-water mark while nobody listens: kept from the events' ids alone,
with the same hole detection as when it hands events out (the stream itself is tested
end to end in tests/proxy/test_events.py)."""

from __future__ import annotations

import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from undolog.services.events import EventBroker
from undolog.services.metrics import ProxyMetrics
from undolog.store import EventRecord
from undolog.store._sql import SqlQueries
from undolog.store.sqlite import SqliteStore

NOW = 1_700_000_000_000_000


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[SqliteStore]:
    store = await SqliteStore.open(f"sqlite:///{tmp_path / 'events.db'}")
    await store.migrate()
    async with store.autocommit() as q:
        await q.ensure_org_exists("org-a", NOW)
    try:
        yield store
    finally:
        await store.close()


async def _events(store: SqliteStore, n: int) -> list[int]:
    ids = []
    async with store.autocommit() as q:
        for i in range(n):
            ids.append(await q.insert_event("org-a", "effect_replayed", None, None, f"{i}", NOW))
    return ids


class _Counted(EventBroker):
    """Counts what each advance read: whole events or ids."""

    rows_read = 0
    ids_read = 0

    async def _read_since(self) -> list[EventRecord] | list[int] | None:
        found = await super()._read_since()
        if found:
            if isinstance(found[0], int):
                self.ids_read += len(found)
            else:
                self.rows_read += len(found)
        return found


async def test_with_nobody_listening_the_mark_advances_on_the_ids_alone(store: SqliteStore) -> None:
    broker = _Counted(store, ProxyMetrics.create())
    ids = await _events(store, 3)
    await broker.catch_up()
    assert broker.hwm == ids[-1]
    assert (broker.ids_read, broker.rows_read) == (3, 0)


async def test_with_a_subscriber_the_events_are_read_and_handed_out(store: SqliteStore) -> None:
    broker = _Counted(store, ProxyMetrics.create())
    sub = broker.subscribe("org-a")
    assert sub is not None
    ids = await _events(store, 2)
    await broker.catch_up()
    assert broker.hwm == ids[-1]
    assert (broker.ids_read, broker.rows_read) == (0, 2)
    assert [sub.queue.get_nowait().event_id for _ in ids] == ids


async def test_a_subscriber_that_comes_while_the_ids_are_read_gets_the_events(
    store: SqliteStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    broker = EventBroker(store, ProxyMetrics.create())
    ids = await _events(store, 2)
    read_ids = SqlQueries.list_event_ids_since
    subs = []

    async def subscribing(q: SqlQueries, after_id: int, limit: int) -> list[int]:
        found = await read_ids(q, after_id, limit)
        subs.append(broker.subscribe("org-a"))  # arrives before the mark moves
        return found

    monkeypatch.setattr(SqlQueries, "list_event_ids_since", subscribing)
    await broker.catch_up()
    assert broker.hwm == ids[-1]
    sub = subs[0]
    assert sub is not None
    assert [sub.queue.get_nowait().event_id for _ in ids] == ids


@pytest.mark.parametrize("grace", [0.0, 60.0])
async def test_with_nobody_listening_a_hole_is_waited_for_as_with_listeners(
    store: SqliteStore, grace: float
) -> None:
    broker = EventBroker(store, ProxyMetrics.create(), gap_grace_seconds=grace)
    first, hole, last = await _events(store, 3)
    conn = sqlite3.connect(store.path)  # the middle one goes: a hole in the ids
    try:
        with conn:
            conn.execute("DELETE FROM events WHERE event_id = ?", (hole,))
    finally:
        conn.close()
    await broker.catch_up()
    assert broker.hwm == (last if grace == 0.0 else first)
