"""Stores: one protocol (`Store`/`Queries`, store/protocol.py), a SQLite and a PostgreSQL
implementation on shared SQL (store/_sql/)."""

from __future__ import annotations

from undolog.store.protocol import NewCall, Queries, Store
from undolog.store.records import (
    ApprovalRecord,
    EffectRecord,
    EventRecord,
    Finish,
    OrgRecord,
    SessionRecord,
    ToolRecord,
    UndoEntryRecord,
)

__all__ = [
    "ApprovalRecord",
    "EffectRecord",
    "EventRecord",
    "Finish",
    "NewCall",
    "OrgRecord",
    "Queries",
    "SessionRecord",
    "Store",
    "ToolRecord",
    "UndoEntryRecord",
    "open_store",
]


async def open_store(
    url: str, *, lock_max_attempts: int = 50, lock_retry_ms: int = 10, pool_size: int = 20
) -> Store:
    """Open the store a URL names: `sqlite:///path.db` or `postgresql://user@host/db`.

    `pool_size`: the most PostgreSQL connections this store holds at once (LISTEN takes one
    more; docs/deploy.md); SQLite ignores it.
    """
    scheme = url.split("://", 1)[0].lower() if "://" in url else ""
    if scheme == "sqlite":
        from undolog.store.sqlite import SqliteStore

        return await SqliteStore.open(url)
    if scheme in ("postgres", "postgresql"):
        from undolog.store.postgres import PostgresStore

        return await PostgresStore.open(
            url,
            lock_max_attempts=lock_max_attempts,
            lock_retry_ms=lock_retry_ms,
            min_size=min(2, pool_size),
            max_size=pool_size,
        )
    raise ValueError(f"unsupported database URL {url!r}: use sqlite:///... or postgresql://...")
