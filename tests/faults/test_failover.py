"""PostgreSQL failover, for real: a primary and a synchronous streaming standby, both started by
the test; the primary's postmaster is killed (-9) under 16 clients calling in a loop, and the
standby is promoted.

The proxy runs on a multi-host URL with `target_session_attrs=read-write`: its connections
go to whichever server accepts writes. While none does (the primary is dead, the standby not
yet promoted) `/ready` answers 503 `store_unavailable` and calls fail with answers a client
retries; once the standby is promoted the clients' retries settle every call. Invariants, from
evidence that outlives every process (the counting tool server's fsync'd log, replays, rows):
no call runs twice, every result a client received is replayed by the new primary, nothing
stays `executing`. The seconds from the kill to the first success after the promotion are
reported with the counts.

Synchronous replication (`synchronous_standby_names`, `synchronous_commit = on`) is what makes
"lost = 0" hold: a commit is acknowledged only once the standby has it. With asynchronous
replication the same test can lose acknowledged results (docs/deploy.md, "PostgreSQL failover").

PostgreSQL refuses to run as root: as root the servers run as the `postgres` OS user (runuser),
in a temporary directory it owns, on free ports, sockets in that directory.
"""

from __future__ import annotations

import asyncio
import contextlib
import glob
import os
import pwd
import random
import shutil
import signal
import subprocess
import tempfile
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import asyncpg
import httpx
import pytest

from tests.faults.harness import (
    DEADLINE,
    IN_DOUBT,
    LEASE_SECONDS,
    RETRY_PAUSE,
    SETTLED,
    TOOL_SPECS,
    TRANSIENT_CODES,
    TRANSPORT_ERROR,
    Call,
    Cluster,
    new_session,
)
from tests.support.servers import ProcessServer, await_until, free_port, wait_until

pytestmark = [pytest.mark.slow, pytest.mark.postgres]

CLIENTS = 16
AFTER_PROMOTION = 2
"""Calls each client settles once the standby is promoted, before the clients stop."""
PG_START_TIMEOUT = 60.0
STANDBY = "standby1"


def _pg_bin() -> Path | None:
    """The newest installed PostgreSQL server binaries (Debian's layout), or `PG_BIN`."""
    wanted = ("initdb", "pg_ctl", "pg_basebackup", "postgres")
    given = os.environ.get("PG_BIN")
    found = [given] if given else sorted(
        glob.glob("/usr/lib/postgresql/*/bin"), key=lambda p: int(Path(p).parent.name)
    )  # fmt: skip
    for candidate in reversed(found):
        if all((Path(candidate) / name).exists() for name in wanted):
            return Path(candidate)
    return None


def _unavailable(message: str) -> None:
    if os.environ.get("CI"):
        pytest.fail(message + " (CI must run the failover test)")
    pytest.skip(message)


@dataclass
class PgPair:
    """A primary and its streaming standby, each a postmaster of its own."""

    bin: Path
    root: Path
    as_postgres: list[str]
    primary_port: int = field(default_factory=free_port)
    standby_port: int = field(default_factory=free_port)

    @property
    def primary(self) -> Path:
        return self.root / "primary"

    @property
    def standby(self) -> Path:
        return self.root / "standby"

    @property
    def url(self) -> str:
        """The proxy's multi-host URL: whichever server accepts writes."""
        return self.any_url + "?target_session_attrs=read-write"

    @property
    def any_url(self) -> str:
        """The same hosts, any of which will do: after the kill, the standby (read-only)."""
        return (
            f"postgresql://postgres@127.0.0.1:{self.primary_port},127.0.0.1:{self.standby_port}"
            "/postgres"
        )

    def run(self, tool: str, *args: str) -> None:
        subprocess.run(
            [*self.as_postgres, str(self.bin / tool), *args],
            check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=120,
        )  # fmt: skip

    def pg_ctl(self, data: Path, *args: str) -> None:
        self.run("pg_ctl", "-D", str(data), "-l", str(data) + ".log", *args)

    def append(self, path: Path, lines: list[str]) -> None:
        with path.open("a", encoding="utf-8") as f:
            f.write("\n".join(lines) + "\n")

    def start(self) -> None:
        self.run("initdb", "-D", str(self.primary), "-U", "postgres", "--auth=trust",
                 "--no-sync", "--no-instructions")  # fmt: skip
        # initdb's pg_hba.conf already trusts replication connections from 127.0.0.1.
        self.append(self.primary / "postgresql.conf", [
            f"port = {self.primary_port}",
            "listen_addresses = '127.0.0.1'",
            f"unix_socket_directories = '{self.root}'",
            "wal_level = replica",
            "max_wal_senders = 4",
            f"synchronous_standby_names = '{STANDBY}'",
            "synchronous_commit = on",
            "shared_buffers = 16MB",
            "max_connections = 60",
            # A killed process loses nothing the kernel already has; only a machine crash
            # would, and this test kills processes. Keeps initdb and the test quick.
            "fsync = off",
        ])  # fmt: skip
        self.pg_ctl(self.primary, "-w", "-t", str(int(PG_START_TIMEOUT)), "start")
        self.run("pg_basebackup", "-D", str(self.standby), "-h", "127.0.0.1",
                 "-p", str(self.primary_port), "-U", "postgres", "-X", "stream", "-R",
                 "--no-sync")  # fmt: skip
        self.append(self.standby / "postgresql.auto.conf", [
            f"port = {self.standby_port}",
            f"primary_conninfo = 'host=127.0.0.1 port={self.primary_port} user=postgres "
            f"application_name={STANDBY}'",
            # Once promoted it has no standby of its own: waiting for one would hang commits.
            "synchronous_standby_names = ''",
        ])  # fmt: skip
        self.pg_ctl(self.standby, "-w", "-t", str(int(PG_START_TIMEOUT)), "start")
        wait_until(self._in_sync, timeout=PG_START_TIMEOUT, what="the standby to be in sync")

    def _in_sync(self) -> bool:
        async def ask() -> object:
            conn = await asyncpg.connect(
                f"postgresql://postgres@127.0.0.1:{self.primary_port}/postgres", timeout=10
            )
            try:
                return await conn.fetchval(
                    "SELECT sync_state FROM pg_stat_replication WHERE application_name = $1",
                    STANDBY,
                )
            finally:
                await conn.close()

        return asyncio.run(ask()) == "sync"

    def kill_primary(self) -> None:
        """kill -9 the primary's postmaster: no shutdown, no last WAL record."""
        pid = int((self.primary / "postmaster.pid").read_text().split()[0])
        os.kill(pid, signal.SIGKILL)

    def promote(self) -> None:
        self.pg_ctl(self.standby, "-w", "-t", str(int(PG_START_TIMEOUT)), "promote")

    def stop(self) -> None:
        for data in (self.standby, self.primary):
            if (data / "postmaster.pid").exists():
                with contextlib.suppress(subprocess.SubprocessError):
                    self.pg_ctl(data, "-m", "immediate", "stop")
        # The primary's backends die with their postmaster; nothing is left to stop.


@pytest.fixture
def pg_pair() -> Iterator[PgPair]:
    bin_dir = _pg_bin()
    if bin_dir is None:
        _unavailable("no PostgreSQL server binaries (initdb, pg_ctl, pg_basebackup) installed")
    assert bin_dir is not None
    if os.geteuid() == 0:
        try:
            owner = pwd.getpwnam("postgres")
        except KeyError:
            _unavailable("running as root and there is no `postgres` user to run PostgreSQL")
        if shutil.which("runuser") is None:
            _unavailable("running as root without `runuser` to run PostgreSQL as `postgres`")
        as_postgres = ["runuser", "-u", "postgres", "--"]
    elif pwd.getpwuid(os.geteuid()).pw_name == "postgres":
        owner, as_postgres = pwd.getpwuid(os.geteuid()), []
    else:
        pytest.skip("starting PostgreSQL servers needs root (to run them as `postgres`) or the "
                    "`postgres` user")  # fmt: skip
    root = Path(tempfile.mkdtemp(prefix="undolog-failover-"))
    os.chown(root, owner.pw_uid, owner.pw_gid)
    pair = PgPair(bin_dir, root, as_postgres)
    try:
        try:
            pair.start()
        except subprocess.CalledProcessError as exc:
            pytest.fail(f"{exc.cmd[len(as_postgres)]} failed: {exc.stderr.decode()[-2000:]}")
        yield pair
    finally:
        pair.stop()
        shutil.rmtree(root, ignore_errors=True)


@dataclass
class Clock:
    """When the failover's steps happened (`time.monotonic()`), and each 200 after them."""

    killed: float = 0.0
    promoting: float = 0.0
    promoted: float = 0.0
    first_success: float = 0.0
    """The first 200 to a try sent once the promotion began."""
    not_ready: list[str] = field(default_factory=list)
    """`/ready`'s answers between the kill and the promotion, then once after."""
    reading: list[str] = field(default_factory=list)
    """The same, of the proxy whose URL lets it connect to a read-only server."""


async def _is(answer: Awaitable[str], expected: str) -> bool:
    return await answer == expected


async def settle(client: httpx.AsyncClient, server: ProcessServer, call: Call, clock: Clock) -> str:
    """Retry `call` until a final answer (`Cluster.settle`'s policy), noting the first 200 to
    a try sent after the promotion began."""
    deadline = time.monotonic() + DEADLINE
    said = TRANSPORT_ERROR
    while True:
        sent = time.monotonic()
        try:
            response = await client.post(server.url + "/mcp/tool_call", json=call.body)
        except httpx.TransportError:
            said = call.note(None)
        else:
            said = call.note(response)
        if said.startswith("200") and clock.promoting and sent >= clock.promoting:
            clock.first_success = clock.first_success or time.monotonic()
        if said in SETTLED:
            return said
        if said != TRANSPORT_ERROR and said.split()[-1] not in TRANSIENT_CODES:
            return said
        if time.monotonic() > deadline:
            return said
        await asyncio.sleep(RETRY_PAUSE)


def test_a_primary_killed_under_16_clients_fails_over_to_its_synchronous_standby(
    pg_pair: PgPair,
    cluster_on: Callable[[str], Cluster],
    fault_report: Callable[..., str],
    tmp_path: Path,
) -> None:
    cluster = cluster_on(pg_pair.url)
    # A second proxy on the same hosts without `target_session_attrs`: once the primary is
    # gone its connections land on the standby, which answers but takes no writes.
    anyhost = cluster_on(pg_pair.any_url)
    # 16 clients retrying through the outage would exhaust a key's default quota (a 429 is
    # final for a client): the quota is not under test.
    spools = {name: tmp_path / f"spool-{name}" for name in ("failover", "any")}
    for spool in spools.values():
        spool.mkdir()
    [server] = cluster.spawn(
        "failover", UNDOLOG_KEY_CALLS_PER_SECOND="100000", UNDOLOG_KEY_CALL_BURST="100000",
        UNDOLOG_SPOOL_DIR=str(spools["failover"]),
    )  # fmt: skip
    cluster.register(server, TOOL_SPECS)
    [reading] = anyhost.spawn("any", UNDOLOG_SPOOL_DIR=str(spools["any"]))
    rng = random.Random(f"failover/{cluster.org_id}")
    clock = Clock()
    calls: list[Call] = []
    after: dict[int, int] = {}  # per client: calls settled that began after the promotion
    sessions = [new_session() for _ in range(CLIENTS)]
    stop = asyncio.Event()

    async def ready(client: httpx.AsyncClient, on: ProcessServer = server) -> str:
        try:
            response = await client.get(on.url + "/ready")
        except httpx.TransportError:
            return TRANSPORT_ERROR
        return f"{response.status_code} {response.json().get('code', 'ok')}"

    async def run() -> None:
        limits = httpx.Limits(max_connections=CLIENTS + 2, max_keepalive_connections=CLIENTS)
        async with httpx.AsyncClient(
            headers=cluster.headers, timeout=DEADLINE, limits=limits
        ) as client:

            async def one_client(n: int) -> None:
                step = 0
                while not stop.is_set():
                    step += 1
                    call = Call(sessions[n], step, rng.choice(["write", "iwrite"]))
                    calls.append(call)
                    began = time.monotonic()
                    await settle(client, server, call, clock)
                    if clock.promoted and began >= clock.promoted and call.settled:
                        after[n] = after.get(n, 0) + 1

            async def failover() -> None:
                try:
                    await await_until(
                        lambda: sum(1 for c in calls if c.settled) >= 2 * CLIENTS,
                        within=DEADLINE, what="the clients to get going",
                    )  # fmt: skip
                    for on in (server, reading):  # polled: one answer may time out under load
                        await await_until(
                            lambda on=on: _is(ready(client, on), "200 ok"),
                            within=DEADLINE, what="both proxies to be ready",
                        )  # fmt: skip
                    clock.killed = time.monotonic()
                    pg_pair.kill_primary()

                    async def not_ready() -> bool:
                        clock.not_ready.append(await ready(client))
                        return clock.not_ready[-1] == "503 store_unavailable"

                    # No writable server: the standby answers, read-only, and is refused.
                    await await_until(not_ready, within=DEADLINE, what="/ready to fail")

                    async def reading_not_ready() -> bool:
                        clock.reading.append(await ready(client, reading))
                        return clock.reading[-1] == "503 store_unavailable"

                    await await_until(
                        reading_not_ready, within=DEADLINE, what="/ready on the standby to fail"
                    )
                    clock.promoting = time.monotonic()
                    await asyncio.to_thread(pg_pair.promote)
                    clock.promoted = time.monotonic()
                    await await_until(
                        lambda: all(after.get(n, 0) >= AFTER_PROMOTION for n in range(CLIENTS)),
                        within=DEADLINE, what="every client to settle calls on the new primary",
                    )  # fmt: skip
                finally:
                    stop.set()

            await asyncio.gather(failover(), *(one_client(n) for n in range(CLIENTS)))
            for on, answers in ((server, clock.not_ready), (reading, clock.reading)):

                async def ready_again(on: ProcessServer = on, answers: list[str] = answers) -> bool:
                    answers.append(await ready(client, on))
                    return answers[-1] == "200 ok"

                # On the new primary; polled: one answer may time out under load.
                with contextlib.suppress(TimeoutError):
                    await await_until(ready_again, within=DEADLINE, what="/ready again")

    asyncio.run(run())
    cluster.wait_upstream_idle()

    duplicates = cluster.duplicates(sessions)
    lost = cluster.lost(server, calls)
    stuck = cluster.stuck(sessions, within=LEASE_SECONDS + 3.0)
    recovery = clock.first_success - clock.killed
    retried = Counter(said for c in calls for said, _ in c.answers if not said.startswith("200"))
    felt = sum(retried.values())
    in_doubt = sum(1 for c in calls if c.last == IN_DOUBT)
    line = fault_report(store="postgres", point="failover", trials=len(calls),
                        duplicates=duplicates, lost=len(lost), stuck=stuck,
                        recovery=recovery)  # fmt: skip
    print(
        f"{line} (kill to promote "
        f"{clock.promoting - clock.killed:.2f}, "
        f"promote took {clock.promoted - clock.promoting:.2f}, "
        f"promote to first success {clock.first_success - clock.promoting:.2f}; "
        f"answers retried {dict(retried)}, {in_doubt} calls in doubt)"
    )
    assert felt >= 1  # the clients did call through the outage
    assert [c.answers for c in calls if not c.settled] == []
    assert duplicates == 0, cluster.log.lines()
    assert lost == []
    assert stuck == 0
    assert "503 store_unavailable" in clock.not_ready
    assert clock.not_ready[-1] == "200 ok"
    assert "503 store_unavailable" in clock.reading, clock.reading
    assert clock.reading[-1] == "200 ok"
    assert clock.first_success > 0
