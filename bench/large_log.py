"""UndoLog benchmark: does a call get slower as the effect log grows? (issue 14, point 3)

For each store, one database per log size (`--log-sizes 10000,1000000`) is seeded with that
many committed effects of finished sessions of the bench org, each with its undo entry and its
event, as a long-running deployment that keeps everything would hold. One proxy per database
then serves the same calls as bench/run.py's `new` (intercept, upstream, commit) and `replay`
(answered from the log) scenarios, one caller, rounds interleaved across the sizes so that
drift on a shared machine hits all of them alike. The report gives p50/p99 per size and the
ratio of each size's p50 to the smallest size's (the target: within 1.2x).

Seeding is done by the database itself: PostgreSQL `INSERT ... SELECT generate_series`,
SQLite a recursive CTE, each table in one statement of one transaction, then `ANALYZE`.

Run alone: `.venv/bin/python bench/large_log.py [--log-sizes 10000,1000000] [--quick]`;
it writes `bench/results/large_log.json` (`--no-save`: not).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
import asyncpg

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # bench/run.py's processes, callers and percentiles

from run import (  # noqa: E402
    API_KEY,
    CLK_TCK,
    DEFAULT_PG_ADMIN_URL,
    METRICS_TOKEN,
    ORG,
    UNLIMITED_KEY,
    Bench,
    Caller,
    Child,
    Tally,
    cpu_delta,
    cpu_snapshot,
    free_port,
    percentile,
    postgres_backend_pids,
)

RESULTS = HERE / "results" / "large_log.json"
SCENARIOS = ("new", "replay")
EFFECTS_PER_SESSION = 10
TARGET_RATIO = 1.2
SEEDED_AT_US = 1_700_000_000_000_000  # the seeded rows' times (long past: finished work);
# sessions end a microsecond apart, as real ones do (no two at the very same time)

# One statement per table; `{n}` effects, numbered 1..n, EFFECTS_PER_SESSION per session.
# Ids and signatures are distinct per number and never collide with the bench's own (UUIDs,
# BLAKE3 hex), which are random as real ones are.
_PG_SEED = (
    "INSERT INTO sessions (org_id, session_id, state, last_step, created_us, updated_us) "
    "SELECT $1, 'seed-session-' || s, 'completed', {per}, $2, $2 + s "
    "FROM generate_series(1, ceil({n}::numeric / {per})::bigint) AS s",
    "INSERT INTO effects (effect_id, org_id, session_id, step_index, tool_name, tool_version, "
    "tier, call_signature, args, state, mode, attempts, result, executed_us, finished_us, "
    "created_us, updated_us) "
    "SELECT 'seed-effect-' || i, $1, 'seed-session-' || ((i - 1) / {per} + 1), "
    "(i - 1) % {per} + 1, 'echo', '1.0.0', 'compensable', lpad(to_hex(i), 64, '0'), "
    "'{{\"text\":\"hello\",\"n\":' || i || '}}', 'committed', 'proxy', 1, "
    '\'{{"success":true,"output":{{"text":"hello"}},"error":null}}\', $2, $2, $2, $2 '
    "FROM generate_series(1, {n}) AS i",
    "INSERT INTO undo_entries (entry_id, org_id, session_id, effect_id, fn_name, fn_version, "
    "args, max_retries, retry_backoff_ms, registered_us, state, attempts, updated_us) "
    "SELECT 'seed-undo-' || i, $1, 'seed-session-' || ((i - 1) / {per} + 1), "
    "'seed-effect-' || i, 'echo', '1.0.0', '{{}}', 3, 100, $2, 'pending', 0, $2 "
    "FROM generate_series(1, {n}) AS i",
    "INSERT INTO events (org_id, type, session_id, effect_id, payload, created_us) "
    "SELECT $1, 'effect_committed', 'seed-session-' || ((i - 1) / {per} + 1), "
    "'seed-effect-' || i, '{{}}', $2 FROM generate_series(1, {n}) AS i",
)
_SQLITE_SEQ = "WITH RECURSIVE seq(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM seq WHERE i < {n}) "
_SQLITE_SEED = (
    _SQLITE_SEQ + "INSERT INTO sessions (org_id, session_id, state, last_step, created_us, "
    "updated_us) SELECT ?1, 'seed-session-' || i, 'completed', {per}, ?2, ?2 + i FROM seq "
    "WHERE (i - 1) % {per} = 0",
    _SQLITE_SEQ + "INSERT INTO effects (effect_id, org_id, session_id, step_index, tool_name, "
    "tool_version, tier, call_signature, args, state, mode, attempts, result, executed_us, "
    "finished_us, created_us, updated_us) "
    "SELECT 'seed-effect-' || i, ?1, 'seed-session-' || ((i - 1) / {per} * {per} + 1), "
    "(i - 1) % {per} + 1, 'echo', '1.0.0', 'compensable', printf('%064x', i), "
    "'{{\"text\":\"hello\",\"n\":' || i || '}}', 'committed', 'proxy', 1, "
    '\'{{"success":true,"output":{{"text":"hello"}},"error":null}}\', ?2, ?2, ?2, ?2 '
    "FROM seq",
    _SQLITE_SEQ + "INSERT INTO undo_entries (entry_id, org_id, session_id, effect_id, fn_name, "
    "fn_version, args, max_retries, retry_backoff_ms, registered_us, state, attempts, "
    "updated_us) SELECT 'seed-undo-' || i, ?1, 'seed-session-' || ((i - 1) / {per} * {per} + 1), "
    "'seed-effect-' || i, 'echo', '1.0.0', '{{}}', 3, 100, ?2, 'pending', 0, ?2 FROM seq",
    _SQLITE_SEQ + "INSERT INTO events (org_id, type, session_id, effect_id, payload, "
    "created_us) SELECT ?1, 'effect_committed', 'seed-session-' || ((i - 1) / {per} * {per} + 1), "
    "'seed-effect-' || i, '{{}}', ?2 FROM seq",
)


async def migrate(url: str) -> None:
    from undolog.store import open_store

    store = await open_store(url)
    try:
        await store.migrate()
    finally:
        await store.close()


async def seed(url: str, effects: int) -> float:
    """Write `effects` committed effects (with sessions, undo entries, events); seconds taken."""
    started = time.perf_counter()
    await migrate(url)
    if url.startswith("sqlite"):
        import sqlite3

        with sqlite3.connect(url.removeprefix("sqlite:///")) as conn:
            for sql in _SQLITE_SEED:
                conn.execute(sql.format(n=effects, per=EFFECTS_PER_SESSION), (ORG, SEEDED_AT_US))
            conn.commit()
            conn.execute("ANALYZE")
    else:
        conn = await asyncpg.connect(url)
        try:
            async with conn.transaction():
                for sql in _PG_SEED:
                    statement = sql.format(n=effects, per=EFFECTS_PER_SESSION)
                    await conn.execute(statement, ORG, SEEDED_AT_US)
            await conn.execute("VACUUM ANALYZE")
        finally:
            await conn.close()
    seeded = await count_effects(url)
    if seeded < effects:
        raise RuntimeError(f"seeded {seeded} effects, expected {effects}")
    return time.perf_counter() - started


async def count_effects(url: str) -> int:
    if url.startswith("sqlite"):
        import sqlite3

        with sqlite3.connect(url.removeprefix("sqlite:///")) as conn:
            return int(conn.execute("SELECT COUNT(*) FROM effects").fetchone()[0])
    conn = await asyncpg.connect(url)
    try:
        return int(await conn.fetchval("SELECT COUNT(*) FROM effects"))
    finally:
        await conn.close()


def start_proxy(url: str, upstream_url: str, workdir: Path, name: str) -> tuple[Child, str]:
    config = workdir / f"{name}.toml"
    config.write_text(
        UNLIMITED_KEY + f'[[orgs]]\nid = "{ORG}"\n[[orgs.keys]]\nname = "bench"\nrole = "admin"\n'
        f'key = "{API_KEY}"\n'
    )
    port = free_port()
    argv = [
        sys.executable, "-m", "undolog", "serve", "--database-url", url, "--upstream-url",
        upstream_url, "--port", str(port), "--config", str(config), "--log-level", "warning",
        "--metrics-token", METRICS_TOKEN,
    ]  # fmt: skip
    return Child(name, argv, workdir), f"http://127.0.0.1:{port}"


def summary(tally: Tally) -> dict[str, Any]:
    values = sorted(tally.latencies)
    calls = max(1, len(values))
    return {
        "calls": len(values),
        "errors": tally.errors,
        "p50_ms": round(percentile(values, 50) * 1000, 3),
        "p99_ms": round(percentile(values, 99) * 1000, 3),
        # CPU per call of the proxy and of its PostgreSQL backends (/proc, clock ticks): less
        # sensitive to a busy machine than wall time.
        "cpu_ms_per_call": {
            name: round(ticks * 1000 / CLK_TCK / calls, 3)
            for name, ticks in sorted(tally.cpu_ticks.items())
        },
    }


async def measure_store(
    store: str,
    sizes: list[int],
    urls: dict[int, str],
    rounds: int,
    calls: int,
    upstream_url: str,
    workdir: Path,
    http: aiohttp.ClientSession,
    pg: tuple[asyncpg.Connection, dict[int, str]] | None,
) -> list[dict[str, Any]]:
    proxies: dict[int, tuple[Child, Bench]] = {}
    try:
        for size in sizes:
            child, proxy_url = start_proxy(urls[size], upstream_url, workdir, f"{store}-{size}")
            proxies[size] = (child, Bench(http, upstream_url, proxy_url))
            await child.wait_healthy(proxy_url + "/health", http)
            async with http.put(
                proxy_url + "/tools/echo",
                json={"tier": "compensable", "compensation": {"fn_name": "echo"}},
                headers={"X-Api-Key": API_KEY},
            ) as response:
                response.raise_for_status()
        callers = {size: [Caller()] for size in sizes}
        tallies = {(size, s): Tally() for size in sizes for s in SCENARIOS}
        for size in sizes:  # warm-up: connections, caches; commits calls for the replays
            for scenario in SCENARIOS:
                await proxies[size][1].chunk(scenario, callers[size], calls // 2, None)
        for r in range(rounds):
            order = sizes[r % len(sizes) :] + sizes[: r % len(sizes)]
            for size in order:
                for scenario in SCENARIOS if r % 2 == 0 else SCENARIOS[::-1]:
                    child, bench = proxies[size]
                    tally = tallies[(size, scenario)]
                    backends = await postgres_backend_pids(pg[0], pg[1][size]) if pg else []
                    pids = {"proxy": [child.pid]} | ({"postgres": backends} if pg else {})
                    before = cpu_snapshot(pids)
                    await bench.chunk(scenario, callers[size], calls, tally)
                    delta = cpu_delta(before, cpu_snapshot(pids))
                    for name in pids:
                        tally.cpu_ticks[name] += delta[name][0]
        rows = []
        for scenario in SCENARIOS:
            base = summary(tallies[(sizes[0], scenario)])
            for size in sizes:
                row: dict[str, Any] = {"store": store, "scenario": scenario, "log_effects": size}
                row |= summary(tallies[(size, scenario)])
                ratio = round(row["p50_ms"] / base["p50_ms"], 3)
                row["p50_vs_smallest"] = ratio
                row["within_target"] = ratio <= TARGET_RATIO
                rows.append(row)
                cpu = " ".join(f"{k} {v:.2f}" for k, v in row["cpu_ms_per_call"].items())
                print(
                    f"  {store:<8} {scenario:<6} {size:>9,} effects: p50 {row['p50_ms']:7.3f} ms"
                    f"  p99 {row['p99_ms']:7.3f} ms  x{ratio:.2f} of smallest"
                    f"  cpu ms/call: {cpu}  ({row['calls']} calls, {row['errors']} errors)",
                    flush=True,
                )
        return rows
    finally:
        for child, _ in proxies.values():
            child.stop()


async def main(args: argparse.Namespace) -> int:
    sizes = sorted(int(s) for s in args.log_sizes.split(","))
    stores = args.stores.split(",")
    rounds, calls = (4, 50) if args.quick else (args.rounds, args.calls)
    workdir = Path(tempfile.mkdtemp(prefix="undolog-bench-log-"))
    loadavg_before = os.getloadavg()
    upstream_port = free_port()
    upstream = Child(
        "upstream",
        [sys.executable, "-m", "undolog", "demo-tools", "--port", str(upstream_port)],
        workdir,
    )
    admin: asyncpg.Connection | None = None
    databases: list[str] = []
    rows: list[dict[str, Any]] = []
    seeding: dict[str, float] = {}
    try:
        connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=60)
        timeout = aiohttp.ClientTimeout(total=60)
        async with aiohttp.ClientSession(connector=connector, timeout=timeout) as http:
            upstream_url = f"http://127.0.0.1:{upstream_port}"
            await upstream.wait_healthy(upstream_url + "/health", http)
            for store in stores:
                urls: dict[int, str] = {}
                names: dict[int, str] = {}
                for size in sizes:
                    if store == "sqlite":
                        urls[size] = f"sqlite:///{workdir / f'log-{size}.db'}"
                    elif store == "postgres":
                        if admin is None:
                            admin = await asyncpg.connect(args.pg_admin_url)
                        name = f"undolog_bench_log_{os.getpid()}_{size}"
                        await admin.execute(f'CREATE DATABASE "{name}"')
                        databases.append(name)
                        names[size] = name
                        urls[size] = f"{args.pg_admin_url.rsplit('/', 1)[0]}/{name}"
                    else:
                        raise SystemExit(f"unknown store {store!r}: expected sqlite or postgres")
                    seconds = await seed(urls[size], size)
                    seeding[f"{store}/{size}"] = round(seconds, 1)
                    print(f"seeded {store} with {size:,} effects in {seconds:.1f} s", flush=True)
                pg = (admin, names) if admin is not None and names else None
                rows += await measure_store(
                    store, sizes, urls, rounds, calls, upstream_url, workdir, http, pg
                )
    finally:
        upstream.stop()
        if admin is not None:
            for name in databases:
                await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            await admin.close()
        shutil.rmtree(workdir, ignore_errors=True)
    report = {
        "log_sizes": sizes,
        "rounds": rounds,
        "calls_per_round": calls,
        "concurrency": 1,
        "target_p50_ratio": TARGET_RATIO,
        "seeding_s": seeding,
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "loadavg_before": loadavg_before,
            "loadavg_after": os.getloadavg(),
        },
        "rows": rows,
    }
    if not args.no_save:
        RESULTS.parent.mkdir(parents=True, exist_ok=True)
        RESULTS.write_text(json.dumps(report, indent=1) + "\n")
        print(f"written {RESULTS.relative_to(HERE.parent)}")
    return 1 if any(r["errors"] for r in rows) else 0


def options(
    log_sizes: str, stores: str, pg_admin_url: str, *, quick: bool = False, no_save: bool = False
) -> argparse.Namespace:
    """This module's arguments, for bench/run.py's `--log-sizes`."""
    return argparse.Namespace(
        log_sizes=log_sizes, stores=stores, rounds=20, calls=50, quick=quick,
        pg_admin_url=pg_admin_url, no_save=no_save,
    )  # fmt: skip


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--log-sizes", default="10000,1000000", help="comma-separated effect counts to seed"
    )
    parser.add_argument("--stores", default="sqlite,postgres", help="comma-separated")
    parser.add_argument("--rounds", type=int, default=20, help="interleaved rounds")
    parser.add_argument("--calls", type=int, default=50, help="calls per round and scenario")
    parser.add_argument("--quick", action="store_true", help="4 rounds of 50 calls")
    parser.add_argument(
        "--pg-admin-url",
        default=os.environ.get("UNDOLOG_BENCH_PG_URL", DEFAULT_PG_ADMIN_URL),
        help="a database on the server where the bench databases are created and dropped",
    )
    parser.add_argument("--no-save", action="store_true", help="do not write the results file")
    return parser.parse_args()


if __name__ == "__main__":
    arguments = parse_args()
    try:
        import uvloop
    except ImportError:
        sys.exit(asyncio.run(main(arguments)))
    sys.exit(uvloop.run(main(arguments)))
