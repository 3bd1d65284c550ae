"""The store contract for the audit chain's head (migration 15), on SQLite and PostgreSQL:
one head per org, moved only from the head the mover read (docs/audit.md)."""

from __future__ import annotations

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
