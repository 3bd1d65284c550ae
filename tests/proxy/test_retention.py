"""Retention with a real proxy running: calls keep going while a large prune runs, and the
proxy's own sweep prunes (and counts it in /metrics), on both stores.

Each test has a database of its own (a proxy's retention sweep covers every org of its
database, so the shared one would mix other tests' leftovers into the counts).
"""

from __future__ import annotations

import asyncio
import re
import uuid
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import fresh_pg_database
from tests.proxy.conftest import (
    METRICS_AUTH,
    make_settings,
    new_key,
    role_keys,
)
from tests.store.contract_helpers import NOW
from tests.store.test_mcp_tasks import TASK  # expired by the wall clock: NOW is 2023
from tests.support.retention import bulk_seed
from tests.support.servers import ThreadServer, await_until
from undolog.config import OrgConfig
from undolog.demo.catalog import DEMO_TOOLS
from undolog.engine.retention import PruneCounts, Retention
from undolog.proxy import create_app
from undolog.store import open_store

SESSIONS = 1500  # x 2 effects x 1 event each: 7,500 rows to prune
EFFECTS = 2
BATCH = 50  # 30 batches, each its own transaction


@pytest.fixture(params=["sqlite", "postgres"])
def own_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'retention.db'}"
        return
    with fresh_pg_database("retention") as url:
        yield url


def start_proxy(url: str, upstream: str, org_id: str, key: str, **overrides: Any) -> ThreadServer:
    org = OrgConfig(org_id=org_id, keys=role_keys(key), retention_days=30)
    settings = make_settings(url, upstream, (org,), **overrides)
    server = ThreadServer(create_app(settings), settings=settings).start()
    with httpx.Client(base_url=server.url, headers={"X-Api-Key": key}) as client:
        for name, spec in DEMO_TOOLS.items():
            client.put(f"/tools/{name}", json=spec).raise_for_status()
    return server


def call(session_id: str, step: int) -> dict[str, Any]:
    args = {"table": "notes", "data": {"n": step}}
    return {
        "session_id": session_id,
        "tool_name": "create_record",
        "step_index": step,
        "args": args,
    }


async def test_calls_keep_succeeding_while_a_large_prune_runs(
    own_url: str, demo_upstream: ThreadServer
) -> None:
    org_id, key = f"org-{uuid.uuid4().hex[:12]}", new_key()
    # No sweep during the test (its first round runs at start, before the rows exist).
    # The caller calls as fast as the proxy answers: far above a key's default call quota.
    server = start_proxy(own_url, demo_upstream.url, org_id, key, retention_sweep_seconds=3600,
                         key_calls_per_second=100_000, key_call_burst=100_000)  # fmt: skip
    try:
        await bulk_seed(own_url, org_id, SESSIONS, EFFECTS, at=NOW)
        store = await open_store(own_url)
        answers: list[httpx.Response] = []
        seen_by_batch: list[int] = []  # answers received when each batch had committed
        batches: list[PruneCounts] = []
        pruning = asyncio.Event()
        done = asyncio.Event()

        async def keep_calling() -> None:
            headers = {"X-Api-Key": key}
            async with httpx.AsyncClient(base_url=server.url, headers=headers, timeout=30) as c:
                session_id, step = str(uuid.uuid4()), 0
                while not done.is_set():
                    step += 1
                    new = await c.post("/mcp/tool_call", json=call(session_id, step))
                    replay = await c.post("/mcp/tool_call", json=call(session_id, step))
                    answers.extend([new, replay])
                    if len(answers) >= 4:  # the calls run; now the prune may start
                        pruning.set()

        def on_batch(_: str, counts: PruneCounts) -> None:
            batches.append(counts)
            seen_by_batch.append(len(answers))

        caller = asyncio.create_task(keep_calling())
        try:
            await asyncio.wait_for(pruning.wait(), 30)
            report = await Retention(store).prune(org_id, batch_size=BATCH, on_batch=on_batch)
        finally:
            done.set()
            await caller
            await store.close()
    finally:
        server.stop()
    assert report == {
        org_id: PruneCounts(
            sessions=SESSIONS, effects=SESSIONS * EFFECTS, events=SESSIONS * EFFECTS
        )
    }
    assert len([b for b in batches if b.sessions]) == SESSIONS // BATCH
    # Calls were answered between the prune's first and last batch: it did not hold them.
    assert seen_by_batch[-1] > seen_by_batch[0], seen_by_batch
    bad = [(r.status_code, r.text[:200]) for r in answers if r.status_code != 200]
    assert not bad, bad
    statuses = [r.json()["status"] for r in answers]
    assert set(statuses) == {"executed", "replayed"}
    assert statuses.count("executed") == statuses.count("replayed")


def pruned_metric(text: str) -> dict[str, float]:
    found = re.findall(
        r'^undolog_proxy_pruned_rows_total\{table="(\w+)"\} ([0-9.e+]+)$', text, re.M
    )
    return {table: float(value) for table, value in found}


async def test_the_proxy_sweep_prunes_and_counts_it_in_metrics(
    own_url: str, demo_upstream: ThreadServer
) -> None:
    org_id, key = f"org-{uuid.uuid4().hex[:12]}", new_key()
    store = await open_store(own_url)  # the schema, before the rows
    await store.migrate()
    async with store.transaction() as q:  # MCP tasks past their ttl (any org's go)
        for _ in range(3):
            await q.insert_mcp_task(replace(TASK, task_id=str(uuid.uuid4()), org_id=org_id))
    await store.close()
    await bulk_seed(own_url, org_id, 40, 2, at=NOW)
    server = start_proxy(own_url, demo_upstream.url, org_id, key, retention_sweep_seconds=0.1)
    try:
        with httpx.Client(base_url=server.url, headers=METRICS_AUTH) as client:

            def metric() -> dict[str, float]:
                return pruned_metric(client.get("/metrics").text)

            await await_until(
                lambda: metric().get("events") == 80.0 and metric().get("mcp_tasks") == 3.0,
                what="the sweep's pruned rows",
                within=30,
            )
            assert metric() == {"sessions": 40.0, "effects": 80.0, "events": 80.0, "mcp_tasks": 3.0}
    finally:
        server.stop()
