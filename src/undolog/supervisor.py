"""`undolog serve --workers N`: N proxy processes on one port, and the process that keeps them.

The supervisor (the process `undolog serve` starts as) prepares the store once — migrations,
the config's orgs, keys and tools — binds the listening socket once, then starts N workers
(`multiprocessing`'s *spawn*: fresh interpreters, no state copied by fork). Every worker
accepts connections from that one inherited socket and is a whole proxy: its own event loop,
store pool, event broker (LISTEN/NOTIFY), sweeps, and connection caps (`proxy/server.py`
counts a worker's own connections, so `--max-connections` holds per process). Everything the
workers must agree on comes from the supervisor: the store was prepared before any of them
started, and a dashboard secret is drawn once when none is configured (a sign-in on one
worker is valid on every other).

Life cycle (docs/deploy.md):

- a worker that dies after it served (killed -9, out of memory, a crash) is started again,
  under the same index;
- a worker that exits before it serves (the store is unreachable, a port is taken) stops the
  others and the supervisor exits 1: a start that fails would fail again, and the process
  manager above (systemd, Kubernetes) should see it;
- SIGTERM or SIGINT (Ctrl-C) stops every worker gracefully (SIGTERM to each, then SIGKILL to
  what is left after `SHUTDOWN_GRACE_SECONDS`); the supervisor then exits 0;
- a worker whose supervisor vanished (killed -9) shuts itself down.

SQLite runs in one process only (`worker_count` refuses more): see `SQLITE_ONE_PROCESS`.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import multiprocessing
import os
import secrets
import signal
import socket
from dataclasses import dataclass
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess

import structlog

from undolog.config import Settings

__all__ = [
    "MAX_WORKERS",
    "SHUTDOWN_GRACE_SECONDS",
    "SQLITE_ONE_PROCESS",
    "WORKER_HEADER_ENV",
    "StartFailed",
    "available_cores",
    "supervise",
    "worker_count",
]

MAX_WORKERS = 64
SHUTDOWN_GRACE_SECONDS = 30.0
# Test-only: workers started with this env var set to 1 name themselves in an
# `X-UndoLog-Worker: <index>/<pid>` response header (`undolog.worker`), so a test can see
# the calls spread.
WORKER_HEADER_ENV = "UNDOLOG_TEST_WORKER_HEADER"
SQLITE_ONE_PROCESS = (
    "--workers above 1 needs PostgreSQL: SQLite has one writer per file, so more processes "
    "add no throughput, only contention (a writer of another process waits in SQLite's "
    "sleep-and-retry busy handler and can fail with 'database is locked'), and events reach "
    "other processes by polling only; use --database-url postgresql://... for several workers"
)

_log = structlog.get_logger("undolog.supervisor")


class StartFailed(Exception):
    """The supervisor could not start serving; the message is for the operator."""


def available_cores() -> int:
    """The cores this process may run on (its CPU affinity, not the machine's count)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def worker_count(settings: Settings, cores: int | None = None) -> int:
    """How many processes `undolog serve` runs: `settings.workers`, or by default one per core
    on PostgreSQL and one on SQLite.

    Raises:
        ValueError: fewer than 1 or more than `MAX_WORKERS`, or more than 1 on SQLite.
    """
    sqlite = settings.database_url.lower().startswith("sqlite")
    if settings.workers is None:
        return 1 if sqlite else min(MAX_WORKERS, max(1, cores or available_cores()))
    if not 1 <= settings.workers <= MAX_WORKERS:
        raise ValueError(f"setting 'workers' must be between 1 and {MAX_WORKERS}")
    if settings.workers > 1 and sqlite:
        raise ValueError(SQLITE_ONE_PROCESS)
    return settings.workers


def _listen(host: str, port: int) -> socket.socket:
    """The one listening socket every worker accepts from (bound as uvicorn binds)."""
    family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
    sock = socket.create_server((host, port), family=family, backlog=2048)
    sock.set_inheritable(True)
    return sock


def _worker_settings(settings: Settings, index: int) -> Settings:
    """A worker's settings: a separate /metrics listener takes `metrics_port + index`."""
    if settings.metrics_port is None or index == 0:
        return settings
    return dataclasses.replace(settings, metrics_port=settings.metrics_port + index)


async def _prepare(settings: Settings) -> None:
    from undolog.runtime import prepare_store
    from undolog.store import open_store

    store = await open_store(settings.database_url, pool_size=settings.db_pool_size)
    try:
        await prepare_store(store, settings)
    finally:
        await store.close()


async def supervise(settings: Settings, count: int) -> int:
    """Prepare the store, listen, run `count` workers until a signal stops them.

    Returns the exit code: 0 after SIGTERM/SIGINT, 1 when a worker failed to start.

    Raises:
        StartFailed: the store could not be prepared or the port could not be bound.
    """
    from undolog.preflight import port_problem
    from undolog_sdk.errors import UndoLogError

    if settings.metrics_port is not None:
        for index in range(1, count):
            port = settings.metrics_port + index
            problem = port_problem(settings.metrics_host, port)
            if problem:
                raise StartFailed(
                    f"the /metrics listener of worker {index} cannot listen on "
                    f"{settings.metrics_host}:{port}: {problem}"
                )
    try:
        await _prepare(settings)
    except UndoLogError as exc:
        raise StartFailed(exc.message) from None
    except ValueError as exc:
        raise StartFailed(str(exc)) from None
    try:
        sock = _listen(settings.host, settings.port)
    except OSError as exc:
        raise StartFailed(
            f"cannot listen on {settings.host}:{settings.port}: {exc.strerror or exc}"
        ) from None
    host, port = sock.getsockname()[:2]
    _log.info("serving", url=f"http://{host}:{port}", workers=count, pid=os.getpid())
    if settings.ui_secret is None:  # one secret for all: a sign-in is valid on every worker
        settings = dataclasses.replace(settings, ui_secret=secrets.token_urlsafe(32))
    try:
        return await _Pool(settings, count, sock).run()
    finally:
        sock.close()


@dataclass(eq=False)
class _Worker:
    index: int
    process: BaseProcess
    ready: Connection  # the supervisor's end of the worker's "serving" pipe
    serving: bool = False


class _Pool:
    """The workers and the loop that watches them (all on the supervisor's event loop)."""

    def __init__(self, settings: Settings, count: int, sock: socket.socket) -> None:
        self.settings = settings
        self.count = count
        self.sock = sock
        self.context = multiprocessing.get_context("spawn")
        self.workers: dict[int, _Worker] = {}
        self.events: asyncio.Queue[tuple[str, _Worker | None]] = asyncio.Queue()
        self.stopping = False
        self.exit_code = 0
        self.header = os.environ.get(WORKER_HEADER_ENV) == "1"

    async def run(self) -> int:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.events.put_nowait, ("stop", None))
        try:
            for index in range(self.count):
                self._start(index)
            while self.workers:
                kind, worker = await self.events.get()
                if kind == "stop":
                    self._stop(0)
                elif kind == "ready" and worker is not None:
                    self._ready(worker)
                elif kind == "exit" and worker is not None:
                    self._exited(worker)
        finally:
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.remove_signal_handler(sig)
            for worker in list(self.workers.values()):  # only on an error of the loop itself
                worker.process.kill()
                self._forget(worker)
        return self.exit_code

    def _start(self, index: int) -> None:
        from undolog.worker import worker_main

        loop = asyncio.get_running_loop()
        ours, theirs = self.context.Pipe(duplex=False)
        process = self.context.Process(
            target=worker_main,
            args=(_worker_settings(self.settings, index), index, self.sock, theirs, self.header),
            name=f"undolog-worker-{index}",
        )
        process.start()
        theirs.close()
        worker = _Worker(index, process, ours)
        self.workers[index] = worker
        loop.add_reader(ours.fileno(), self._on_ready_pipe, worker)
        loop.add_reader(process.sentinel, self.events.put_nowait, ("exit", worker))

    def _on_ready_pipe(self, worker: _Worker) -> None:
        asyncio.get_running_loop().remove_reader(worker.ready.fileno())
        try:
            worker.ready.recv_bytes()
        except (EOFError, OSError):  # it exited before it served: its sentinel says so
            return
        self.events.put_nowait(("ready", worker))

    def _ready(self, worker: _Worker) -> None:
        worker.serving = True
        _log.info("worker_serving", worker=worker.index, pid=worker.process.pid)

    def _exited(self, worker: _Worker) -> None:
        if self.workers.get(worker.index) is not worker:
            return
        worker.process.join()
        self._forget(worker)
        code = worker.process.exitcode
        if self.stopping:
            return
        if not worker.serving:
            _log.error("worker_failed_to_start", worker=worker.index, exit_code=code)
            self._stop(1)
            return
        _log.warning("worker_died", worker=worker.index, pid=worker.process.pid, exit_code=code)
        self._start(worker.index)

    def _forget(self, worker: _Worker) -> None:
        loop = asyncio.get_running_loop()
        loop.remove_reader(worker.process.sentinel)
        loop.remove_reader(worker.ready.fileno())
        worker.ready.close()
        self.workers.pop(worker.index, None)

    def _stop(self, exit_code: int) -> None:
        if self.stopping:
            return
        self.stopping = True
        self.exit_code = exit_code
        _log.info("workers_stopping", workers=len(self.workers))
        for worker in self.workers.values():
            with contextlib.suppress(ProcessLookupError):
                worker.process.terminate()  # SIGTERM: uvicorn's graceful shutdown
        asyncio.get_running_loop().call_later(SHUTDOWN_GRACE_SECONDS, self._kill_left)

    def _kill_left(self) -> None:
        for worker in self.workers.values():
            _log.warning("worker_killed", worker=worker.index, pid=worker.process.pid)
            with contextlib.suppress(ProcessLookupError):
                worker.process.kill()
