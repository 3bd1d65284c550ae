"""The store contract for the audit chain's head (migration 15), on SQLite and PostgreSQL:
one head per org, moved only from the head the mover read (docs/audit.md)."""

from __future__ import annotations

import asyncio

import pytest

from tests.store.contract_helpers import NOW, add_org, new_org
from undolog.store import Store
from undolog.store.records import AuditHeadRecord


def head(org: str, hash_: str, count: int) -> AuditHeadRecord:
    return AuditHeadRecord(org, hash_, count * 10, count, NOW + count)


async def test_a_head_is_stored_per_org_and_moved_only_from_the_one_read(store: Store) -> None:
    org, other = new_org(), new_org()
    await add_org(store, org)
    await add_org(store, other)
    async with store.transaction() as q:
        assert await q.get_audit_head(org) is None
        assert await q.put_audit_head(head(org, "a" * 64, 3), None)
        assert not await q.put_audit_head(head(org, "x" * 64, 4), None)  # one exists already
        assert await q.put_audit_head(head(org, "b" * 64, 5), "a" * 64)
        assert not await q.put_audit_head(head(org, "c" * 64, 6), "a" * 64)  # moved meanwhile
    async with store.reader() as q:
        assert await q.get_audit_head(org) == head(org, "b" * 64, 5)
        assert await q.get_audit_head(other) is None


class _Abort(Exception):
    pass


async def test_each_org_s_events_are_numbered_without_gaps_in_commit_order(store: Store) -> None:
    # Migration 24: the audit chain finds a deleted event by the gap it leaves.
    org, other = new_org(), new_org()
    await add_org(store, org)
    await add_org(store, other)
    for n in range(3):
        async with store.transaction() as q:
            await q.insert_event(org, "effect_committed", None, None, f'{{"n": {n}}}', NOW)
            await q.insert_event(other, "effect_committed", None, None, "{}", NOW)
    with pytest.raises(_Abort):  # a rolled-back transaction takes no number
        async with store.transaction() as q:
            await q.insert_event(org, "effect_failed", None, None, "{}", NOW)
            raise _Abort
    async with store.transaction() as q:
        await q.insert_event(org, "effect_committed", None, None, '{"n": 3}', NOW)
    async with store.reader() as q:
        assert await q.last_audit_seq(org) == 4
        assert await q.last_audit_seq(other) == 3
        assert await q.last_audit_seq(new_org()) == 0
        numbered = await q.list_audit_events(org, 0, 4, 10)
        assert [seq for seq, _ in numbered] == [1, 2, 3, 4]
        assert [e.payload_json for _, e in numbered][-1] == '{"n": 3}'
        assert [seq for seq, _ in await q.list_audit_events(org, 1, 3, 1)] == [2]


async def test_concurrent_transactions_of_one_org_take_numbers_as_they_commit(
    store: Store,
) -> None:
    # PostgreSQL numbers at COMMIT (a deferred trigger): the first to insert but last to
    # commit gets the higher number, and neither waits on the other before its commit.
    if store.dialect != "postgres":
        pytest.skip("SQLite has one writer: numbers are taken as rows are written")
    org = new_org()
    await add_org(store, org)
    inserted, committed = asyncio.Event(), asyncio.Event()

    async def first() -> None:
        async with store.transaction() as q:
            await q.insert_event(org, "effect_committed", None, None, '"first"', NOW)
            inserted.set()
            await committed.wait()

    async def second() -> None:
        await inserted.wait()
        async with store.transaction() as q:
            await q.insert_event(org, "effect_committed", None, None, '"second"', NOW)
        committed.set()

    await asyncio.wait_for(asyncio.gather(first(), second()), timeout=30)
    async with store.reader() as q:
        numbered = await q.list_audit_events(org, 0, 10, 10)
    assert [(seq, e.payload_json) for seq, e in numbered] == [(1, '"second"'), (2, '"first"')]
