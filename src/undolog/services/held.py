"""Results the proxy holds but could not commit: written down, answered, committed later.

When the tool has answered and the commit still fails after its quick retries (the store is
down), the result is not dropped. It is written first to the spool (`held-results.jsonl` under
`--spool-dir`, one JSON line per effect, fsync'd); only then is it answered, with the header
`X-UndoLog-Commit: pending`. A result that cannot be written down either (the spool's disk is
full or unwritable) lives only in memory: the caller is told the call is in doubt, with that
reason, never `200` — the proxy still tries to commit it, and a retry replays it if it did.

A held result is committed in the background for as long as this process lives, however long
the store stays away: its lease is renewed whenever the store answers, and if the lease ran out
meanwhile (the sweeper put the effect `in_doubt`), the proxy, which knows the result, settles
the effect with it. Each settled result gets a `committed` line in the spool. A process that
starts reads its spool and settles what an earlier run left there (an effect already settled
is left alone), then rewrites the spool with only what is still pending. Each process has a
spool of its own: `--workers N` gives worker i the folder `worker-i` under `--spool-dir`.

The same spool and loop settle the runs the proxy knows it never sent: when the connection to
the store is lost while a new run's intent is being recorded (`IntentLost`), the intent may
have committed, but the tool was never called. A `not_run` line is written, and once the store
answers the effect is recorded `failed` (`NOT_RUN`), so the agent's retry runs it once instead
of finding it in progress, then in doubt.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

from undolog.engine.model import now_us
from undolog_sdk.errors import NotFound, UndoLogError
from undolog_sdk.wire import EffectState

if TYPE_CHECKING:
    from undolog.engine import Decision, Engine
    from undolog.services.lease import LeaseKeeper
    from undolog.services.metrics import ProxyMetrics

__all__ = ["NOT_RUN", "SPOOL_FILE", "HeldResults", "spool_problem"]

SPOOL_FILE = "held-results.jsonl"
_PROBE_FILE = ".undolog-spool-probe"
_MAX_BACKOFF_S = 2.0
_MAX_CONFLICTS = 5
_PENDING = ("held", "not_run")
NOT_RUN = (
    "not run: the store's connection was lost while this call was being recorded, and it was "
    "never sent to the tool; a retry runs it"
)


def _append_line(path: Path, line: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, line)
        os.fsync(fd)
    finally:
        os.close(fd)


def spool_problem(spool_dir: str) -> str | None:
    """Why no line can be written and fsync'd to the spool in `spool_dir` (made if missing),
    or None: a probe file is written there, and the spool file opened for appending."""
    probe = Path(spool_dir) / f"{_PROBE_FILE}-{os.getpid()}"  # processes may share a folder
    try:
        probe.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.write(fd, b"probe\n")
            os.fsync(fd)
        finally:
            os.close(fd)
        probe.unlink()
        os.close(os.open(probe.parent / SPOOL_FILE, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600))
    except OSError as exc:
        return (exc.strerror or type(exc).__name__).lower()
    return None


@dataclass(frozen=True)
class _Held:
    """One result to settle: the effect's run and what it answered."""

    org_id: str
    effect_id: str
    attempt: int
    result_json: str | None  # None: the run was never sent to the tool (`not_run`)
    undoable: bool


def _pending(path: Path) -> tuple[list[dict[str, Any]], int]:
    """The `held` lines of the spool with no `committed` line after them, and how many lines
    could not be read (a line cut short by a crash)."""
    if not path.exists():
        return [], 0
    held: dict[str, dict[str, Any]] = {}
    unreadable = 0
    for raw in path.read_bytes().splitlines():
        try:
            record = orjson.loads(raw)
            effect_id = record["effect_id"]
        except (orjson.JSONDecodeError, KeyError, TypeError):
            unreadable += 1
            continue
        if record.get("status") in _PENDING:
            held[effect_id] = record
        else:
            held.pop(effect_id, None)
    return list(held.values()), unreadable


def _rewrite(path: Path, records: list[dict[str, Any]]) -> None:
    """Replace the spool by `records` (fsync'd, then renamed over it)."""
    if not path.exists():
        return
    fresh = path.with_name(path.name + ".new")
    fd = os.open(fresh, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, b"".join(orjson.dumps(r) + b"\n" for r in records))
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(fresh, path)


class HeldResults:
    """The spool file and the background commits of held results (one task per result)."""

    def __init__(
        self,
        spool_dir: str,
        *,
        engine: Engine,
        leases: LeaseKeeper,
        metrics: ProxyMetrics,
        backoff_ms: int,
    ) -> None:
        self.path = Path(spool_dir) / SPOOL_FILE
        self.engine = engine
        self.leases = leases
        self.metrics = metrics
        self.backoff_ms = backoff_ms
        self._lock = asyncio.Lock()
        self._tasks: set[asyncio.Task[None]] = set()

    async def spool(self, record: dict[str, Any]) -> bool:
        """Append one JSON line, fsync'd; False (logged by the caller) if it cannot be written."""
        line = orjson.dumps(record) + b"\n"
        async with self._lock:
            try:
                await asyncio.to_thread(_append_line, self.path, line)
            except OSError:
                return False
        return True

    async def writable(self) -> bool:
        """Whether a line can be written and fsync'd in the spool's folder now (`/ready`)."""
        return await asyncio.to_thread(spool_problem, str(self.path.parent)) is None

    async def hold(self, decision: Decision, result_json: str, undoable: bool, log: Any) -> bool:
        """Write down a result whose commit failed and keep committing it in the background.
        False when it could not be written down: it lives only in this process's memory, so
        the caller must not be told it is recorded."""
        org_id, effect_id = decision.tool.org_id, decision.effect_id
        record = {
            "status": "held",
            "org_id": org_id,
            "effect_id": effect_id,
            "tool_name": decision.tool.name,
            "attempt": decision.attempt,
            "undoable": undoable,
            "result": orjson.loads(result_json),
            "held_us": now_us(),
        }
        spooled = await self.spool(record)
        if not spooled:
            log.error("held_result_not_spooled", spool=str(self.path))
        self.metrics.held_results.labels("held").inc()
        log.warning("held_result", spool=str(self.path), spooled=spooled)
        held = _Held(org_id, effect_id, decision.attempt, result_json, undoable)
        self._keep_committing(held, log, outcome=EffectState.COMMITTED.value)
        return spooled

    async def not_run(self, org_id: str, effect_id: str, attempt: int, log: Any) -> None:
        """Record as `failed` (never sent: `NOT_RUN`) a run whose intent may have committed
        while its answer was lost, once the store answers again; a retry then runs it."""
        record = {"status": "not_run", "org_id": org_id, "effect_id": effect_id,
                  "attempt": attempt, "held_us": now_us()}  # fmt: skip
        if not await self.spool(record):
            log.error("not_run_not_spooled", spool=str(self.path))
        log.warning("intent_lost", effect_id=effect_id)
        held = _Held(org_id, effect_id, attempt, None, False)
        self._keep_committing(held, log, outcome="not_run")

    async def recover(self, log: Any) -> int:
        """Settle what an earlier run of this process left in its spool, in the background;
        the spool is rewritten with only those entries. The number of entries found."""
        try:
            records, unreadable = await asyncio.to_thread(_pending, self.path)
            if records or unreadable:
                await asyncio.to_thread(_rewrite, self.path, records)
        except OSError as exc:
            log.error("spool_not_read", spool=str(self.path), error=exc.strerror)
            return 0
        if unreadable:
            log.warning("spool_lines_unreadable", spool=str(self.path), lines=unreadable)
        for record in records:
            held = _Held(
                record["org_id"],
                record["effect_id"],
                int(record.get("attempt", 1)),
                None
                if record["status"] == "not_run"
                else orjson.dumps(record.get("result")).decode(),
                bool(record.get("undoable", True)),
            )
            bound = log.bind(org_id=held.org_id, effect_id=held.effect_id)
            self._keep_committing(
                held, bound, outcome="recovered" if held.result_json is not None else "not_run"
            )
        if records:
            log.warning("spool_recovering", spool=str(self.path), results=len(records))
        return len(records)

    def _keep_committing(self, held: _Held, log: Any, *, outcome: str) -> None:
        key = self.leases.acquire(held.org_id, held.effect_id, held.attempt)
        task = asyncio.create_task(self._settle_until_done(key, held, log, outcome))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _settle_until_done(
        self, key: tuple[str, str, int], held: _Held, log: Any, outcome: str
    ) -> None:
        delay = self.backoff_ms / 1000
        conflicts = 0
        try:
            while True:
                await asyncio.sleep(delay)
                delay = min(delay * 2, _MAX_BACKOFF_S)
                try:
                    settled_here = await self._settle(held)
                except NotFound:
                    # Not this store's effect (a spool moved to a proxy on another database):
                    # the line stays in the spool, for the operator or the right proxy.
                    log.error("held_result_effect_not_found", spool=str(self.path))
                    return
                except UndoLogError as exc:
                    if exc.retryable:  # the store is still away
                        continue
                    conflicts += 1  # the effect moved between the read and the write
                    if conflicts < _MAX_CONFLICTS:
                        continue
                    log.error("held_result_not_settled", error=exc.code, spool=str(self.path))
                    return
                if settled_here:
                    self.metrics.held_results.labels(outcome).inc()
                    log.info("held_result_committed")
                    status = EffectState.COMMITTED.value
                else:  # settled meanwhile (an operator, another run): left as it is
                    log.warning("held_result_settled_elsewhere")
                    status = "settled_elsewhere"
                await self.spool({"status": status, "org_id": held.org_id,
                                  "effect_id": held.effect_id, "settled_us": now_us()})  # fmt: skip
                return
        finally:
            self.leases.release(key)

    async def _settle(self, held: _Held) -> bool:
        """Record the held result (or that the run never ran): while the run is the effect's
        under its lease, commit (or fail) it; if the lease ran out meanwhile, resolve it so (the
        proxy knows what happened). False when the effect was settled some other way, or never
        recorded. Raises a retryable `UndoLogError` while the store is away."""
        try:
            effect = await self.engine.get_effect(held.org_id, held.effect_id)
        except NotFound:
            if held.result_json is None:  # the lost intent never committed: nothing to record
                return False
            raise  # a result for an effect this store does not hold: kept for the operator
        lease = effect.lease_expires_us
        orphan = lease is None or lease <= now_us()
        if effect.state == EffectState.EXECUTING and effect.attempts == held.attempt:
            if held.result_json is None:
                await self.engine.fail(held.org_id, held.effect_id, NOT_RUN)
                return True
            if not orphan:
                await self.engine.commit(
                    held.org_id, held.effect_id, held.result_json, undoable=held.undoable
                )
                return True
        elif effect.state != EffectState.IN_DOUBT or effect.attempts != held.attempt:
            return False
        await self.engine.resolve(
            held.org_id,
            held.effect_id,
            outcome=(EffectState.COMMITTED.value if held.result_json is not None else "failed"),
            result_json=held.result_json,
            error=NOT_RUN if held.result_json is None else None,
            by="undolog (held result)",
            undoable=held.undoable,
        )
        return True

    async def close(self) -> None:
        """Stop retrying (at shutdown): what is not committed stays in the spool."""
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
