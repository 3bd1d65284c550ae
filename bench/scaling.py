"""New calls/s on PostgreSQL with 1 and N proxy processes (`undolog serve --workers N`).

Called by `run.py --workers 1,2`. Every worker count gets its own `undolog serve --workers N`
on its own fresh database, all started before measuring; the rounds then take the
configurations in turn (the order rotating), so drift on a shared machine hits them alike,
while the ones not being measured sit idle. Each round is `calls[c]` new calls (intercept →
upstream → commit) from `c` callers, each in its own session, as run.py's `new` scenario; the
proxy's CPU is the supervisor's and its workers' together, PostgreSQL's is its backends'.
Rows carry `"workers": N` and the store label `pg-wN`.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp
import asyncpg
import run as bench
from report import format_row

from undolog.supervisor import WORKER_HEADER_ENV

__all__ = ["measure_workers"]


def descendants(pid: int) -> list[int]:
    """`pid` and every process below it (Linux /proc children lists)."""
    found, todo = [], [pid]
    while todo:
        current = todo.pop()
        found.append(current)
        try:
            text = Path(f"/proc/{current}/task/{current}/children").read_text()
        except OSError:
            continue
        todo += [int(child) for child in text.split()]
    return found


async def _start(
    count: int, database_url: str, upstream_url: str, workdir: Path, http: aiohttp.ClientSession
) -> tuple[bench.Child, str]:
    config = workdir / f"org-w{count}.toml"
    config.write_text(
        bench.UNLIMITED_KEY
        + f'[[orgs]]\nid = "{bench.ORG}"\n[[orgs.keys]]\nname = "bench"\nrole = "admin"\n'
        f'key = "{bench.API_KEY}"\n'
    )
    port = bench.free_port()
    # Workers name themselves in a header (test-only, the same for every count), so the
    # measuring starts once each of them serves.
    os.environ[WORKER_HEADER_ENV] = "1"
    proxy = bench.Child(
        f"proxy-w{count}",
        [sys.executable, "-m", "undolog", "serve", "--workers", str(count),
         "--database-url", database_url, "--upstream-url", upstream_url, "--port", str(port),
         "--config", str(config), "--log-level", "warning",
         "--metrics-token", bench.METRICS_TOKEN,
         # The configurations take turns: keep the idle one's connections open meanwhile.
         "--keep-alive-timeout-seconds", "600"],
        workdir,
    )  # fmt: skip
    del os.environ[WORKER_HEADER_ENV]
    url = f"http://127.0.0.1:{port}"
    await proxy.wait_healthy(url + "/health", http)
    seen: set[str] = set() if count > 1 else {"0"}  # one: served in-process, no supervisor
    deadline = time.monotonic() + 120
    while len(seen) < count and time.monotonic() < deadline:
        # A new connection each time: the kernel hands it to whichever worker accepts first.
        async with aiohttp.ClientSession() as fresh, fresh.get(url + "/health") as response:
            seen.add(response.headers["x-undolog-worker"].split("/")[0])
    if len(seen) < count:
        raise RuntimeError(f"only {len(seen)} of {count} workers answered")
    async with http.put(
        url + "/tools/echo",
        json={"tier": "compensable", "compensation": {"fn_name": "echo"}},
        headers={"X-Api-Key": bench.API_KEY},
    ) as response:
        if response.status != 200:
            raise RuntimeError(f"PUT /tools/echo: {response.status} {await response.text()}")
    return proxy, url


async def measure_workers(
    counts: list[int],
    concurrency: int,
    plan: bench.Plan,
    upstream_url: str,
    upstream_pid: int,
    workdir: Path,
    http: aiohttp.ClientSession,
    admin_url: str,
) -> list[dict[str, Any]]:
    """One `new`-call row per worker count, measured at `concurrency` callers."""
    admin = await asyncpg.connect(admin_url)
    databases: list[str] = []
    proxies: dict[int, tuple[bench.Child, bench.Bench, str]] = {}
    try:
        for count in counts:
            name = f"undolog_bench_w{count}_{os.getpid()}"
            await admin.execute(f'CREATE DATABASE "{name}"')
            databases.append(name)
            url = f"{admin_url.rsplit('/', 1)[0]}/{name}"
            proxy, proxy_url = await _start(count, url, upstream_url, workdir, http)
            proxies[count] = (proxy, bench.Bench(http, upstream_url, proxy_url, None), name)
            print(f"== pg-w{count}: supervisor pid {proxy.pid}, "
                  f"processes {descendants(proxy.pid)}", flush=True)  # fmt: skip
        callers = {count: [bench.Caller() for _ in range(concurrency)] for count in counts}
        for count, (_, runner, database) in proxies.items():
            await runner.chunk("new", callers[count], plan.warmup[concurrency], None)
            await bench.analyze(admin_url, database)
        tallies = {count: bench.Tally() for count in counts}
        for r in range(plan.rounds):
            order = counts[r % len(counts) :] + counts[: r % len(counts)]
            for count in order:
                proxy, runner, database = proxies[count]
                tally = tallies[count]
                pids = {
                    "loadgen": [os.getpid()],
                    "upstream": [upstream_pid],
                    "proxy": descendants(proxy.pid),
                    "postgres": await bench.postgres_backend_pids(admin, [database]),
                }
                before = bench.cpu_snapshot(pids)
                await runner.chunk("new", callers[count], plan.calls[concurrency], tally)
                pids["postgres"] = await bench.postgres_backend_pids(admin, [database])
                delta = bench.cpu_delta(before, bench.cpu_snapshot(pids))
                machine = delta.pop("machine")[0]
                for key, (ticks, kernel) in delta.items():
                    tally.cpu_ticks[key] += ticks
                    tally.sys_ticks[key] += kernel
                tally.cpu_ticks["other"] += machine - sum(t for t, _ in delta.values())
        rows = []
        for count in counts:
            row = bench.summarise(f"pg-w{count}", concurrency, "new", tallies[count])
            row["workers"] = count
            rows.append(row)
            print(format_row(row), flush=True)
        return rows
    finally:
        for proxy, _, _ in proxies.values():
            proxy.stop()
        for name in databases:
            await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await admin.close()


def report_lines(rows: list[dict[str, Any]]) -> list[str]:
    """`N workers: X new calls/s (Yx one worker)` per row."""
    base = next((r["calls_per_s"] for r in rows if r["workers"] == 1), None)
    lines = []
    for row in rows:
        ratio = f" ({row['calls_per_s'] / base:.2f}x one worker)" if base else ""
        lines.append(
            f"{row['workers']} worker(s), {row['concurrency']} sessions: "
            f"{row['calls_per_s']:.0f} new calls/s, p50 {row['p50_ms']:.2f} ms{ratio}"
        )
    return lines
