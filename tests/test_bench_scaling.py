"""bench/run.py and bench/scaling.py: after the warm-up, the bench's database is analyzed, so
that the measured rounds run on the plans a database with autovacuum would have (an effect
found by its signature through the signature's unique index, not by reading the org's
effects)."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import asyncpg
import pytest

from tests.conftest import fresh_pg_database
from tests.store.contract_helpers import make_effect
from undolog.store import NewCall, open_store

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

from run import analyze

SIGNATURE_LOOKUP = "SELECT * FROM effects WHERE org_id = $1 AND call_signature = $2"


@pytest.fixture
def fresh_pg() -> Iterator[str]:
    with fresh_pg_database("scaling") as url:
        yield url


async def _lookup_index(conn: asyncpg.Connection) -> str:
    """The index the generic plan of the signature lookup (as a pooled connection caches it
    after a few calls) scans."""
    await conn.execute("SET plan_cache_mode = force_generic_plan")
    await conn.execute(f"PREPARE lookup(text, text) AS {SIGNATURE_LOOKUP}")
    plan = "\n".join(r[0] for r in await conn.fetch("EXPLAIN EXECUTE lookup('o', 's')"))
    await conn.execute("DEALLOCATE lookup")
    return plan


async def test_a_warmed_up_database_is_analyzed_and_finds_effects_by_their_signature(
    fresh_pg: str,
) -> None:
    org = "org-scaling"
    store = await open_store(fresh_pg)
    try:
        for _ in range(200):
            effect = make_effect(org)
            await store.execute_new(
                NewCall.of(effect, None, ("effect_intercepted", "{}")),
                (("committed",), "effect_replayed", "{}"),
            )
    finally:
        await store.close()
    admin, database = fresh_pg.rsplit("/", 1)
    await analyze(f"{admin}/postgres", database)
    conn = await asyncpg.connect(fresh_pg)
    try:
        analyzed = await conn.fetchval(
            "SELECT last_analyze IS NOT NULL FROM pg_stat_user_tables WHERE relname = 'effects'"
        )
        assert analyzed
        assert "effects_org_id_call_signature_key" in await _lookup_index(conn)
    finally:
        await conn.close()
