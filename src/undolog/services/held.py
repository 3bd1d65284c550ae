"""Results the proxy holds but could not commit: answered, spooled, committed later.

When the tool has answered and the commit still fails after its quick retries (the store is
down), the result is not dropped. It is written first to the spool (`held-results.jsonl` under
`--spool-dir`, one JSON line per effect, fsync'd), then answered to the caller with the header
`X-UndoLog-Commit: pending`, and the commit is retried in the background for as long as the
run's lease holds (the lease keeps being renewed whenever the store answers). If it commits, a
`committed` line follows in the spool; if the lease runs out first, the effect becomes
`in_doubt` (the sweeper) and an operator resolves it with the spooled result
(`POST /effects/{id}/resolve`).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

from undolog.engine.model import now_us
from undolog_sdk.errors import UndoLogError
from undolog_sdk.wire import EffectState

if TYPE_CHECKING:
    from undolog.engine import Decision, Engine
    from undolog.services.lease import LeaseKeeper
    from undolog.services.metrics import ProxyMetrics

__all__ = ["SPOOL_FILE", "HeldResults"]

SPOOL_FILE = "held-results.jsonl"
_MAX_BACKOFF_S = 2.0


def _append_line(path: Path, line: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, line)
        os.fsync(fd)
    finally:
        os.close(fd)


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

    async def hold(self, decision: Decision, result_json: str, undoable: bool, log: Any) -> None:
        """Spool a result whose commit failed and keep committing it in the background."""
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
        if not await self.spool(record):
            log.error("held_result_not_spooled", spool=str(self.path))
        self.metrics.held_results.labels("held").inc()
        log.warning("held_result", spool=str(self.path))
        key = self.leases.acquire(org_id, effect_id, decision.attempt)
        task = asyncio.create_task(self._keep_committing(key, result_json, undoable, log))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _keep_committing(
        self, key: tuple[str, str, int], result_json: str, undoable: bool, log: Any
    ) -> None:
        org_id, effect_id, _ = key
        delay = self.backoff_ms / 1000
        try:
            while True:
                await asyncio.sleep(delay)
                delay = min(delay * 2, _MAX_BACKOFF_S)
                try:
                    await self.engine.commit(org_id, effect_id, result_json, undoable=undoable)
                except UndoLogError as exc:
                    if not exc.retryable:  # settled meanwhile (an operator resolved it)
                        log.warning("held_result_settled_elsewhere", error=exc.code)
                        return
                    if time.monotonic() >= self.leases.valid_until(key):
                        break
                    continue
                self.metrics.held_results.labels(EffectState.COMMITTED).inc()
                log.info("held_result_committed")
                await self.spool({"status": EffectState.COMMITTED, "org_id": org_id,
                                  "effect_id": effect_id, "committed_us": now_us()})  # fmt: skip
                return
            self.metrics.held_results.labels("given_up").inc()
            log.error("held_result_given_up", spool=str(self.path))
        finally:
            self.leases.release(key)

    async def close(self) -> None:
        """Stop retrying (at shutdown): what is not committed stays in the spool."""
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
