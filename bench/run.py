"""UndoLog benchmark: a direct call to the demo `echo` tool vs the same call through UndoLog.

Three processes, so no two of them share an event loop: the demo tool server (the upstream),
the proxy (`undolog serve`), and this script, the load generator (aiohttp with a keep-alive
pool, uvloop when installed; not httpx's pooled AsyncClient, see DESIGN.md). For each store
(SQLite in a fresh temp file, PostgreSQL in a fresh database dropped at the end) and for 1 and
32 concurrent callers it measures three scenarios, interleaved round by round so that drift on
a shared machine hits all of them alike:

- `direct`: POST /tools/echo on the upstream;
- `forward`: the same request through `bench/floor.py`, a Python forwarder on the proxy's
  stack that keeps nothing: the floor of any Python proxy on this machine;
- `new`: POST /mcp/tool_call through UndoLog, a new call (each caller has its own session
  and takes the next step every call), so intercept + upstream + commit;
- `replay`: the same body as an already committed call, answered from the effect log.

Besides latency and throughput it records, per scenario, the CPU each process burns per call
(from /proc) and the proxy's own histograms (deltas of /metrics around each measured chunk),
which is where the time goes. Run `.venv/bin/python bench/run.py [--quick]`; see README.md.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import platform
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import asyncpg
import orjson
from anchor import ANCHOR, Anchor, anchor_missing_row, start_anchor
from proxy_profile import profile_parts
from report import format_row, print_report, ratios, short_series

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results" / "latest.json"
SCENARIOS = ("direct", "forward", "new", "replay")
API_KEY = "ul_bench_" + uuid.uuid4().hex
METRICS_TOKEN = "bench_metrics_" + uuid.uuid4().hex  # /metrics on the main port needs it
ORG = "bench"
# The load generator is one key that means to flood: its quotas (services/quotas.py) are lifted
# far past any rate measured, while their check still runs on every call.
UNLIMITED_KEY = (
    "[server]\nkey_calls_per_second = 1e9\nkey_call_burst = 1000000000\n"
    "key_sessions_per_minute = 1000000000\n"
)
CLK_TCK = os.sysconf("SC_CLK_TCK")
DEFAULT_PG_ADMIN_URL = "postgresql://postgres@127.0.0.1:5432/test"


@dataclass(frozen=True)
class Plan:
    """How much to measure: `rounds` interleaved rounds of `calls[c]` calls per scenario."""

    rounds: int
    calls: dict[int, int]
    warmup: dict[int, int]


FULL = Plan(rounds=5, calls={1: 300, 32: 1280}, warmup={1: 150, 32: 640})
QUICK = Plan(rounds=2, calls={1: 60, 32: 320}, warmup={1: 40, 32: 128})


# -- processes ---------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def cpu_ticks(pid: int) -> tuple[int, int]:
    """(utime, stime) of a process in clock ticks ((0, 0) if it is gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0, 0
    fields = stat.rsplit(")", 1)[1].split()
    return int(fields[11]), int(fields[12])


def machine_busy_ticks() -> int:
    """Busy clock ticks of all cores together (everything but idle and iowait), /proc/stat."""
    fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return sum(fields) - fields[3] - fields[4]


def machine_speed(workdir: Path) -> dict[str, float]:
    """Two figures of the machine itself, so that runs on different machines (or one machine
    on a slow day: a shared host's steal time) can be told apart: a fixed piece of pure Python
    (best of 5, ms; lower is faster) and the median of 200 `fdatasync`s of an 8 kB write in the
    work folder (µs; every durable commit waits for one)."""
    best = float("inf")
    for _ in range(5):
        began = time.perf_counter()
        total = 0
        for i in range(1_000_000):
            total += i
        best = min(best, time.perf_counter() - began)
    waits = []
    block = b"\0" * 8192
    fd = os.open(workdir / "fsync-probe", os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        for _ in range(200):
            os.pwrite(fd, block, 0)
            began = time.perf_counter()
            os.fdatasync(fd)
            waits.append(time.perf_counter() - began)
    finally:
        os.close(fd)
        (workdir / "fsync-probe").unlink()
    return {
        "python_loop_ms": round(best * 1000, 1),
        "fdatasync_p50_us": round(statistics.median(waits) * 1e6, 1),
    }


def uses_uvloop(pid: int) -> bool:
    try:
        return "uvloop" in Path(f"/proc/{pid}/maps").read_text()
    except OSError:
        return False


class Child:
    """A server subprocess we started; stopped by its own pid only."""

    def __init__(self, name: str, argv: list[str], log_dir: Path) -> None:
        self.name = name
        self.log_path = log_dir / f"{name}.log"
        self._log = self.log_path.open("wb")
        self.proc = subprocess.Popen(argv, stdout=self._log, stderr=subprocess.STDOUT)

    @property
    def pid(self) -> int:
        return self.proc.pid

    async def wait_healthy(self, url: str, http: aiohttp.ClientSession) -> None:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited: {self.log_path.read_text()[-2000:]}")
            with contextlib.suppress(aiohttp.ClientError, OSError):
                async with http.get(url) as response:
                    if response.status == 200:
                        return
            await asyncio.sleep(0.1)
        raise RuntimeError(f"{self.name} did not become healthy: {self.log_path.read_text()}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()


# -- metrics -----------------------------------------------------------------------------------

_SAMPLE = re.compile(r"^(undolog_proxy_\w+?)_(sum|count)\{([^}]*)\} (\S+)$", re.M)


def parse_histograms(text: str) -> dict[str, float]:
    """`{"<family>{<labels>}_sum": value, ..._count: ...}` for the proxy's histograms."""
    out = {}
    for name, kind, labels, value in _SAMPLE.findall(text):
        out[f"{name}{{{labels}}}_{kind}"] = float(value)
    return out


def histogram_means(totals: dict[str, float]) -> dict[str, dict[str, float]]:
    """{series: {"count": n, "mean_ms": m}} from accumulated _sum/_count values."""
    means = {}
    for key, count in totals.items():
        if not key.endswith("_count") or count <= 0:
            continue
        series = key[: -len("_count")]
        means[series] = {
            "count": count,
            "mean_ms": round(totals.get(series + "_sum", 0.0) / count * 1000, 3),
        }
    return means


# -- load generator ----------------------------------------------------------------------------


def percentile(sorted_values: list[float], q: float) -> float:
    if not sorted_values:
        return float("nan")
    # Nearest rank: the smallest value with at least q% of the values at or below it.
    index = max(0, math.ceil(q / 100 * len(sorted_values)) - 1)
    return sorted_values[index]


@dataclass
class Caller:
    """One concurrent caller: its own session; remembers its committed calls for replays."""

    session_id: str = field(default_factory=lambda: str(uuid.uuid4()))
    step: int = 0
    committed: list[bytes] = field(default_factory=list)
    replay_at: int = 0

    def new_call(self) -> bytes:
        self.step += 1
        return orjson.dumps(
            {
                "session_id": self.session_id,
                "tool_name": "echo",
                "step_index": self.step,
                "args": {"text": "hello", "n": self.step},
            }
        )

    def direct_call(self) -> bytes:
        self.step += 1
        return orjson.dumps(
            {
                "args": {"text": "hello", "n": self.step},
                "session_id": self.session_id,
                "effect_id": str(uuid.uuid4()),
            }
        )

    def anchor_call(self) -> bytes:
        self.step += 1
        return orjson.dumps({"args": {"text": "hello", "n": self.step}, "call_id": uuid.uuid4()})

    def replay_call(self) -> bytes:
        body = self.committed[self.replay_at % len(self.committed)]
        self.replay_at += 1
        return body


@dataclass
class Tally:
    """What one (store, concurrency, scenario) accumulated over its rounds."""

    latencies: list[float] = field(default_factory=list)
    seconds: float = 0.0
    errors: int = 0
    cpu_ticks: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    sys_ticks: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    histograms: dict[str, float] = field(default_factory=lambda: defaultdict(float))


class Bench:
    def __init__(
        self,
        http: aiohttp.ClientSession,
        upstream: str,
        proxy: str,
        anchor: str | None,
        floor: str | None = None,  # bench/floor.py, for the `forward` scenario
    ) -> None:
        self.http = http
        self.upstream = upstream
        self.floor = floor
        self.proxy = proxy
        self.anchor = anchor
        self.proxy_headers = {"X-Api-Key": API_KEY, "Content-Type": "application/json"}
        self.direct_headers = {"Content-Type": "application/json"}

    async def _caller(
        self, scenario: str, caller: Caller, n: int, latencies: list[float] | None
    ) -> int:
        errors = 0
        for _ in range(n):
            if scenario in ("direct", "forward"):
                url, body, headers, expect = (
                    (self.upstream if scenario == "direct" else str(self.floor)) + "/tools/echo",
                    caller.direct_call(),
                    self.direct_headers,
                    b'"success":true',
                )
            elif scenario == ANCHOR:
                url, body, headers, expect = (
                    f"{self.anchor}/echo",
                    caller.anchor_call(),
                    self.direct_headers,
                    b'"success":true',
                )
            elif scenario == "new":
                url, body, headers, expect = (
                    self.proxy + "/mcp/tool_call",
                    caller.new_call(),
                    self.proxy_headers,
                    b'"status":"executed"',
                )
            else:
                url, body, headers, expect = (
                    self.proxy + "/mcp/tool_call",
                    caller.replay_call(),
                    self.proxy_headers,
                    b'"status":"replayed"',
                )
            started = time.perf_counter()
            async with self.http.post(url, data=body, headers=headers) as response:
                answer = await response.read()
            elapsed = time.perf_counter() - started
            if response.status != 200 or expect not in answer:
                errors += 1
                if errors == 1:
                    print(f"  ! {scenario}: HTTP {response.status} {answer[:200]!r}", flush=True)
                continue
            if scenario == "new":
                caller.committed.append(body)
            if latencies is not None:
                latencies.append(elapsed)
        return errors

    async def chunk(
        self, scenario: str, callers: list[Caller], total: int, tally: Tally | None
    ) -> None:
        """`total` calls split over `callers`, all running at once; recorded into `tally`."""
        per_caller = max(1, total // len(callers))
        latencies = tally.latencies if tally is not None else None
        started = time.perf_counter()
        errors = await asyncio.gather(
            *(self._caller(scenario, c, per_caller, latencies) for c in callers)
        )
        elapsed = time.perf_counter() - started
        if tally is not None:
            tally.seconds += elapsed
            tally.errors += sum(errors)

    async def scrape(self) -> dict[str, float]:
        auth = {"Authorization": f"Bearer {METRICS_TOKEN}"}
        async with self.http.get(self.proxy + "/metrics", headers=auth) as response:
            return parse_histograms(await response.text())


async def analyze(admin_url: str, database: str) -> None:
    """Give the planner statistics of a database the warm-up filled, as autovacuum would.

    The proxy's connections plan the store's statements (and cache the plans) on their first
    calls, when the tables are empty: without statistics PostgreSQL may then look an effect up
    by its signature through `effects_by_session` (org alone) rather than the signature's
    unique index, reading every effect of the org on each call, until an ANALYZE invalidates
    the cached plans. A server with autovacuum off (as this machine's PostgreSQL runs) never
    does that, and PostgreSQL's CPU per call then grows with the table.
    """
    conn = await asyncpg.connect(f"{admin_url.rsplit('/', 1)[0]}/{database}")
    try:
        await conn.execute("ANALYZE")
    finally:
        await conn.close()


async def postgres_backend_pids(admin: asyncpg.Connection | None, dbs: list[str]) -> list[int]:
    """The backends connected to the bench's databases (UndoLog's and the anchor's)."""
    if admin is None or not dbs:
        return []
    rows = await admin.fetch("SELECT pid FROM pg_stat_activity WHERE datname = ANY($1)", dbs)
    return [int(r["pid"]) for r in rows]


Snapshot = dict[str, dict[int, tuple[int, int]]]


def cpu_snapshot(pids: dict[str, list[int]]) -> Snapshot:
    snapshot = {name: {pid: cpu_ticks(pid) for pid in group} for name, group in pids.items()}
    snapshot["machine"] = {0: (machine_busy_ticks(), 0)}
    return snapshot


def cpu_delta(before: Snapshot, after: Snapshot) -> dict[str, tuple[int, int]]:
    """{name: (all ticks, kernel ticks)} spent between two snapshots."""
    out = {}
    for name, group in after.items():
        total = kernel = 0
        for pid, (user, sys_) in group.items():
            # A PostgreSQL backend that appeared during the chunk counts from zero.
            user0, sys0 = before.get(name, {}).get(pid, (0, 0))
            total += user + sys_ - user0 - sys0
            kernel += sys_ - sys0
        out[name] = (total, kernel)
    return out


async def measure_store(
    store: str,
    database_url: str,
    plan: Plan,
    concurrencies: list[int],
    upstream_url: str,
    upstream_pid: int,
    floor: Child,
    floor_url: str,
    workdir: Path,
    http: aiohttp.ClientSession,
    admin: asyncpg.Connection | None,
    pg_admin_url: str | None,
    pg_db: str | None,
    py_spy: Path | None,
    anchor: Anchor | None,
) -> dict[str, Any]:
    running = anchor is not None and anchor.url is not None
    scenarios = (*SCENARIOS, ANCHOR) if running else SCENARIOS
    dbs = [d for d in (pg_db, anchor.db if anchor else None) if d]
    config = workdir / f"org-{store}.toml"
    config.write_text(
        UNLIMITED_KEY + f'[[orgs]]\nid = "{ORG}"\n[[orgs.keys]]\nname = "bench"\nrole = "admin"\n'
        f'key = "{API_KEY}"\n'
    )
    port = free_port()
    proxy = Child(
        f"proxy-{store}",
        [
            sys.executable,
            "-m",
            "undolog",
            "serve",
            "--workers",  # one process: its pid is the proxy's CPU (scaling.py runs more)
            "1",
            "--database-url",
            database_url,
            "--upstream-url",
            upstream_url,
            "--port",
            str(port),
            "--config",
            str(config),
            "--log-level",
            "warning",
            "--metrics-token",
            METRICS_TOKEN,
        ],
        workdir,
    )
    proxy_url = f"http://127.0.0.1:{port}"
    spy = None
    try:
        await proxy.wait_healthy(proxy_url + "/health", http)
        async with http.put(
            proxy_url + "/tools/echo",
            json={"tier": "compensable", "compensation": {"fn_name": "echo"}},
            headers={"X-Api-Key": API_KEY},
        ) as response:
            if response.status != 200:
                raise RuntimeError(f"PUT /tools/echo: {response.status} {await response.text()}")
        bench = Bench(http, upstream_url, proxy_url, anchor.url if anchor else None, floor_url)
        tallies: dict[tuple[int, str], Tally] = {}
        print(f"\n== {store}: proxy pid {proxy.pid}, uvloop in proxy: {uses_uvloop(proxy.pid)}")
        for concurrency in concurrencies:
            callers = [Caller() for _ in range(concurrency)]
            # Warm-up (connections, pools, caches); it also commits calls for the replays.
            for scenario in scenarios:
                await bench.chunk(scenario, callers, plan.warmup[concurrency], None)
            if pg_admin_url is not None:  # the plans a server with autovacuum would have
                for database in dbs:
                    await analyze(pg_admin_url, database)
            if py_spy is not None and spy is None:
                spy = start_py_spy(proxy.pid, py_spy / f"proxy-{store}.txt", workdir)
            for scenario in scenarios:
                tallies[(concurrency, scenario)] = Tally()
            for r in range(plan.rounds):
                k = r % len(scenarios)
                order = scenarios[k:] + scenarios[:k]
                for scenario in order:
                    tally = tallies[(concurrency, scenario)]
                    pids = {
                        "loadgen": [os.getpid()],
                        "upstream": [upstream_pid],
                        "floor": [floor.pid],
                        "proxy": [proxy.pid],
                        "postgres": await postgres_backend_pids(admin, dbs),
                    }
                    if anchor is not None and anchor.pid is not None:
                        pids[ANCHOR] = [anchor.pid]
                    metrics_before = await bench.scrape()
                    cpu_before = cpu_snapshot(pids)
                    await bench.chunk(scenario, callers, plan.calls[concurrency], tally)
                    pids["postgres"] = await postgres_backend_pids(admin, dbs)
                    delta = cpu_delta(cpu_before, cpu_snapshot(pids))
                    machine = delta.pop("machine")[0]
                    for name, (ticks, kernel) in delta.items():
                        tally.cpu_ticks[name] += ticks
                        tally.sys_ticks[name] += kernel
                    # Kernel threads, PostgreSQL's own background processes and anything else
                    # running on the machine: the part no pid above accounts for.
                    tally.cpu_ticks["other"] += machine - sum(t for t, _ in delta.values())
                    metrics_after = await bench.scrape()
                    for key, value in metrics_after.items():
                        tally.histograms[key] += value - metrics_before.get(key, 0.0)
            for scenario in scenarios:
                row = summarise(store, concurrency, scenario, tallies[(concurrency, scenario)])
                print(format_row(row), flush=True)
            if anchor is not None and not running:
                print(anchor_missing_row(store, concurrency, anchor.reason), flush=True)
        if spy is not None:
            stop_child(spy)
        recording = py_spy / f"proxy-{store}.txt" if py_spy is not None else None
        totals = await bench.scrape()
        return {
            "proxy_profile": profile_parts(recording) if recording and recording.exists() else {},
            "rows": [
                summarise(store, c, s, tallies[(c, s)]) for c in concurrencies for s in scenarios
            ],
            "anchor": None if anchor is None else {"running": running, "reason": anchor.reason},
            "metrics_means_whole_run": histogram_means(totals),
            "proxy_uvloop": uses_uvloop(proxy.pid),
        }
    finally:
        if spy is not None:
            stop_child(spy)
        proxy.stop()


def start_py_spy(pid: int, out: Path, workdir: Path) -> subprocess.Popen[bytes] | None:
    exe = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    if not Path(exe).exists():
        print("  (py-spy not installed: no profile)")
        return None
    out.parent.mkdir(parents=True, exist_ok=True)
    log = (workdir / "py-spy.log").open("ab")
    return subprocess.Popen(
        # --gil: only samples holding the GIL, i.e. Python at work rather than waiting.
        [exe, "record", "--pid", str(pid), "--format", "raw", "--gil", "--rate", "250",
         "-o", str(out)],
        stdout=log,
        stderr=subprocess.STDOUT,
    )  # fmt: skip


def stop_child(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


# -- reporting ---------------------------------------------------------------------------------


def summarise(store: str, concurrency: int, scenario: str, tally: Tally) -> dict[str, Any]:
    values = sorted(tally.latencies)
    n = len(values)
    cpu = {
        name: round(ticks / CLK_TCK / max(n, 1) * 1000, 3)
        for name, ticks in tally.cpu_ticks.items()
    }
    return {
        "store": store,
        "concurrency": concurrency,
        "scenario": scenario,
        "calls": n,
        "errors": tally.errors,
        "p50_ms": round(percentile(values, 50) * 1000, 3),
        "p99_ms": round(percentile(values, 99) * 1000, 3),
        "mean_ms": round(sum(values) / max(n, 1) * 1000, 3),
        "calls_per_s": round(n / tally.seconds, 1) if tally.seconds else 0.0,
        "cpu_ms_per_call": cpu,
        "kernel_cpu_ms_per_call": {
            name: round(ticks / CLK_TCK / max(n, 1) * 1000, 3)
            for name, ticks in tally.sys_ticks.items()
        },
        "cpu_utilisation": {
            name: round(ticks / CLK_TCK / tally.seconds, 2) if tally.seconds else 0.0
            for name, ticks in tally.cpu_ticks.items()
        },
        "machine_busy_cores": (
            round(sum(tally.cpu_ticks.values()) / CLK_TCK / tally.seconds, 2)
            if tally.seconds
            else 0.0
        ),
        "proxy_histogram_means": histogram_means(dict(tally.histograms)),
    }


# -- main --------------------------------------------------------------------------------------


async def main(args: argparse.Namespace) -> int:
    # SIGTERM (a `timeout`, a CI limit) cancels the run, so that the `finally` below stops the
    # servers and drops the bench's databases (UndoLog's and the anchor's).
    main_task = asyncio.current_task()
    assert main_task is not None
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, main_task.cancel)
    plan = QUICK if args.quick else FULL
    if args.rounds:
        plan = Plan(args.rounds, plan.calls, plan.warmup)
    concurrencies = [int(c) for c in args.concurrency.split(",")]
    stores = args.stores.split(",")
    workdir = Path(tempfile.mkdtemp(prefix="undolog-bench-"))
    loadavg_before = os.getloadavg()
    speed = machine_speed(workdir)
    print(
        f"machine: pure Python {speed['python_loop_ms']} ms (lower is faster), fdatasync "
        f"p50 {speed['fdatasync_p50_us']} µs: compare runs of one machine state only"
    )
    started = time.perf_counter()
    connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=60)
    timeout = aiohttp.ClientTimeout(total=60)
    results: dict[str, Any] = {}
    scaling_rows: list[dict[str, Any]] = []
    admin: asyncpg.Connection | None = None
    pg_db: str | None = None
    anchor: Anchor | None = None
    upstream_port = free_port()
    upstream = Child(
        "upstream",
        [sys.executable, "-m", "undolog", "demo-tools", "--port", str(upstream_port)],
        workdir,
    )
    upstream_url = f"http://127.0.0.1:{upstream_port}"
    floor_port = free_port()
    floor = Child(
        "floor",
        [sys.executable, str(HERE / "floor.py"), "--port", str(floor_port), "--upstream",
         upstream_url],
        workdir,
    )  # fmt: skip
    floor_url = f"http://127.0.0.1:{floor_port}"
    try:
        async with aiohttp.ClientSession(connector=connector, timeout=timeout) as http:
            await upstream.wait_healthy(upstream_url + "/health", http)
            await floor.wait_healthy(floor_url + "/health", http)
            for store in stores:
                if store == "sqlite":
                    url = f"sqlite:///{workdir / 'bench.db'}"
                elif store == "postgres":
                    admin = await asyncpg.connect(args.pg_admin_url)
                    pg_db = f"undolog_bench_{os.getpid()}"
                    await admin.execute(f'CREATE DATABASE "{pg_db}"')
                    base = args.pg_admin_url.rsplit("/", 1)[0]
                    url = f"{base}/{pg_db}"
                    anchor = Anchor(reason="left out (--no-anchor)")
                    if not args.no_anchor:

                        def spawn(name: str, argv: list[str]) -> Child:
                            return Child(name, argv, workdir)

                        anchor = await start_anchor(
                            admin, args.pg_admin_url, upstream_url, http, spawn, free_port()
                        )
                else:
                    raise SystemExit(f"unknown store {store!r}: expected sqlite or postgres")
                results[store] = await measure_store(
                    store, url, plan, concurrencies, upstream_url, upstream.pid, floor,
                    floor_url, workdir, http,
                    admin if store == "postgres" else None,
                    args.pg_admin_url if store == "postgres" else None,
                    pg_db if store == "postgres" else None,
                    Path(args.py_spy) if args.py_spy else None,
                    anchor if store == "postgres" else None,
                )  # fmt: skip
            if args.workers:  # new calls/s with 1 and N proxy processes (bench/scaling.py)
                import scaling

                counts = [int(n) for n in args.workers.split(",")]
                print(f"\n== PostgreSQL, --workers {args.workers}, {max(concurrencies)} callers")
                scaling_rows = await scaling.measure_workers(
                    counts, max(concurrencies), plan, upstream_url, upstream.pid, workdir, http,
                    args.pg_admin_url,
                )  # fmt: skip
    finally:
        upstream.stop()
        floor.stop()
        if anchor is not None and anchor.child is not None:
            anchor.child.stop()
        if admin is not None:
            if anchor is not None and anchor.db is not None:
                await admin.execute(f'DROP DATABASE IF EXISTS "{anchor.db}" WITH (FORCE)')
            if pg_db is not None:
                await admin.execute(f'DROP DATABASE IF EXISTS "{pg_db}" WITH (FORCE)')
            await admin.close()
        if not args.keep_workdir:
            shutil.rmtree(workdir, ignore_errors=True)
    rows = [row for store in stores for row in results[store]["rows"]]
    ratio_rows = ratios(rows)
    anchors = {s: results[s]["anchor"] for s in stores if results[s].get("anchor")}
    verdicts = print_report(rows, ratio_rows, anchors)
    print("\nProxy histogram means over each whole store run (incl. warm-up), ms:")
    for store in stores:
        means = results[store]["metrics_means_whole_run"]
        for series, m in sorted(means.items()):
            if "engine_rpc" in series or "executor" in series:
                name = short_series(series)
                print(f"  {store:<9} {name:<40} mean {m['mean_ms']:7.3f} n={m['count']:.0f}")
    profiles = {s: results[s]["proxy_profile"] for s in stores if results[s]["proxy_profile"]}
    if profiles:
        print("\nWhere the proxy's CPU goes (py-spy: share of the samples holding the GIL):")
        for store, shares in profiles.items():
            print(f"  {store:<9} " + "  ".join(f"{k} {v:.0%}" for k, v in shares.items()))
    if scaling_rows:
        import scaling

        verdicts += scaling.report_lines(scaling_rows)
        print(
            "\nWorkers (PostgreSQL, new calls):\n  " + "\n  ".join(verdicts[-len(scaling_rows) :])
        )
    elapsed = time.perf_counter() - started
    report = {
        "mode": "quick" if args.quick else "full",
        "plan": {"rounds": plan.rounds, "calls_per_round": plan.calls, "warmup": plan.warmup},
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "platform": platform.platform(),
            "speed": speed,
            "loadavg_before": loadavg_before,
            "loadavg_after": os.getloadavg(),
            "loadgen_uvloop": "uvloop" in type(asyncio.get_running_loop()).__module__,
            "proxy_uvloop": {s: results[s]["proxy_uvloop"] for s in stores},
        },
        "elapsed_s": round(elapsed, 1),
        "rows": rows,
        "workers_rows": scaling_rows,
        "ratios": ratio_rows,
        "anchor": anchors,
        "targets": verdicts,
        "proxy_metrics_whole_run": {s: results[s]["metrics_means_whole_run"] for s in stores},
        "proxy_profile": profiles,
    }
    if not args.no_save:
        RESULTS.parent.mkdir(parents=True, exist_ok=True)
        RESULTS.write_text(json.dumps(report, indent=1) + "\n")
        print(f"\nwritten {RESULTS.relative_to(HERE.parent)} ({elapsed:.0f} s in all)")
    status = 1 if any(r["errors"] for r in rows) else 0
    if args.log_sizes:  # the growing-log run (bench/large_log.py), after this one
        import large_log

        print("\n== a call against a large log (bench/large_log.py)")
        log_args = large_log.options(
            args.log_sizes, args.stores, args.pg_admin_url, quick=args.quick, no_save=args.no_save
        )
        status |= await large_log.main(log_args)
    return status


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="a fast smoke run")
    parser.add_argument("--stores", default="sqlite,postgres", help="comma-separated")
    parser.add_argument("--concurrency", default="1,32", help="comma-separated caller counts")
    parser.add_argument("--rounds", type=int, default=0, help="override the plan's rounds")
    parser.add_argument(
        "--pg-admin-url",
        default=os.environ.get("UNDOLOG_BENCH_PG_URL", DEFAULT_PG_ADMIN_URL),
        help="a database on the server where the bench database is created and dropped",
    )
    parser.add_argument(
        "--workers",
        default="",
        help="comma-separated worker counts (e.g. 1,2): new calls/s on PostgreSQL with "
        "`undolog serve --workers N` for each, at the largest --concurrency (bench/scaling.py)",
    )
    parser.add_argument(
        "--no-anchor", action="store_true", help="leave out the DBOS row (anchors' row)"
    )
    parser.add_argument("--py-spy", metavar="DIR", help="record the proxy with py-spy (raw)")
    parser.add_argument("--keep-workdir", action="store_true", help="keep logs and SQLite file")
    parser.add_argument("--no-save", action="store_true", help="do not write results/latest.json")
    parser.add_argument(
        "--log-sizes",
        metavar="N,M",
        help="then measure calls against logs of N and M effects (bench/large_log.py)",
    )
    return parser.parse_args()


if __name__ == "__main__":
    arguments = parse_args()
    try:
        import uvloop
    except ImportError:
        sys.exit(asyncio.run(main(arguments)))
    sys.exit(uvloop.run(main(arguments)))
