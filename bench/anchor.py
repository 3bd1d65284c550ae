"""The anchors' row of bench/run.py: the same call through DBOS Transact, and the ratios.

The server is dbos_anchor.py, started here in a database of its own on the bench's PostgreSQL
server; bench/README.md, "The anchors' row".
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import asyncpg

HERE = Path(__file__).resolve().parent
ANCHOR = "dbos"  # the scenario's name and its process's CPU column


@dataclass
class Anchor:
    """The DBOS process of the anchors' row, or why there is none (`reason`)."""

    url: str | None = None
    pid: int | None = None
    db: str | None = None
    reason: str | None = None
    child: Any = None  # run.py's Child


async def start_anchor(
    admin: asyncpg.Connection,
    pg_admin_url: str,
    upstream_url: str,
    http: aiohttp.ClientSession,
    spawn: Callable[[str, list[str]], Any],
    port: int,
) -> Anchor:
    """DBOS Transact on the same PostgreSQL server, in a database of its own (dbos_anchor.py).

    Anything that stops it (dbos not installed, the database not created, the process not
    healthy) becomes the row's reason; the run goes on without the row.
    """
    anchor = Anchor()
    try:
        import dbos  # noqa: F401
    except ImportError:
        anchor.reason = "dbos is not installed (pip install -e '.[server]' --group bench)"
        return anchor
    db = f"undolog_bench_{os.getpid()}_dbos"
    try:
        await admin.execute(f'CREATE DATABASE "{db}"')
    except (asyncpg.PostgresError, OSError) as error:
        anchor.reason = f"could not create its database {db}: {type(error).__name__}"
        return anchor
    anchor.db = db
    argv = [sys.executable, str(HERE / "dbos_anchor.py"), "--port", str(port),
            "--database-url", f"{pg_admin_url.rsplit('/', 1)[0]}/{db}",
            "--upstream-url", upstream_url]  # fmt: skip
    anchor.child = spawn(ANCHOR, argv)
    try:
        await anchor.child.wait_healthy(f"http://127.0.0.1:{port}/health", http)
    except RuntimeError as error:
        anchor.reason = f"DBOS did not start: {str(error).splitlines()[-1][:200]}"
        anchor.child.stop()
        anchor.child = None
        return anchor
    anchor.url, anchor.pid = f"http://127.0.0.1:{port}", anchor.child.pid
    return anchor


def anchor_ratios(
    direct: dict[str, Any], new: dict[str, Any], anchor: dict[str, Any] | None
) -> dict[str, float]:
    """UndoLog's new call against DBOS's durable step (below 1: UndoLog is cheaper/faster)."""
    if anchor is None:
        return {}
    dbos_added = anchor["p50_ms"] - direct["p50_ms"]
    ours = new["cpu_ms_per_call"].get("proxy", 0.0) + new["cpu_ms_per_call"].get("postgres", 0.0)
    theirs = anchor["cpu_ms_per_call"].get(ANCHOR, 0.0) + anchor["cpu_ms_per_call"].get(
        "postgres", 0.0
    )
    return {
        "dbos_added_p50_ms": round(dbos_added, 3),
        "undolog_over_dbos_added_p50": round((new["p50_ms"] - direct["p50_ms"]) / dbos_added, 3)
        if dbos_added > 0
        else float("nan"),
        "undolog_over_dbos_throughput": round(new["calls_per_s"] / anchor["calls_per_s"], 2)
        if anchor["calls_per_s"]
        else float("nan"),
        "undolog_over_dbos_cpu": round(ours / theirs, 3) if theirs else float("nan"),
    }


def anchor_missing_row(store: str, concurrency: int, reason: str | None) -> str:
    return f"{store:<9}{concurrency:>4}  {ANCHOR:<7}      -  no row: {reason}"


def print_anchor(ratio_rows: list[dict[str, Any]], anchors: dict[str, Any]) -> None:
    """The ratio UndoLog/DBOS, or why there is none; in every report."""
    print(
        f"\nUndoLog / DBOS Transact (one durable step, same PostgreSQL server):\n"
        f"{'store':<9}{'conc':>4}  {'DBOS added p50':>15}{'UL/DBOS added p50':>19}"
        f"{'UL/DBOS calls/s':>17}{'UL/DBOS CPU':>13}"
    )
    for r in ratio_rows:
        if "dbos_added_p50_ms" in r:
            print(
                f"{r['store']:<9}{r['concurrency']:>4}  {r['dbos_added_p50_ms']:>15.2f}"
                f"{r['undolog_over_dbos_added_p50']:>19.3f}"
                f"{r['undolog_over_dbos_throughput']:>17.2f}{r['undolog_over_dbos_cpu']:>13.3f}"
            )
    for store, anchor in anchors.items():
        if not anchor["running"]:
            print(f"{store:<9}  no ratio: {anchor['reason']}")
