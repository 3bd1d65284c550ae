"""Leases of calls in flight: renewed while this process runs them, swept when nobody does.

A run holds its effect under a lease (`--lease-seconds`). While this process runs it — the
hot path, an approved call, an MCP gateway call, or a result whose commit is being retried —
`LeaseKeeper` extends the lease every third of it (one UPDATE per call, no event), so a call
that outlives the lease on a live proxy is still `in_progress` to a duplicate, never lost. Only
a dead process stops renewing: then the lease sweep (`undolog.services.sweeps`, one task per
proxy, safe with many proxies on one PostgreSQL) moves the effect to `in_doubt` without waiting
for a retry (or to `failed` for an `idempotent_upstream` tool: its retry runs it again under
the same key).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import structlog

from undolog_sdk.errors import UndoLogError

if TYPE_CHECKING:
    from undolog.engine import Engine

__all__ = ["LeaseKeeper"]

RunKey = tuple[str, str, int]  # org id, effect id, attempt


@dataclass
class _Held:
    holders: int
    renewed_at: float  # monotonic time of the last renewal the store accepted


class LeaseKeeper:
    """Renews the leases of the runs this process holds, every `lease_seconds / 3`."""

    def __init__(self, engine: Engine, lease_seconds: float) -> None:
        self.engine = engine
        self.lease_seconds = lease_seconds
        self.interval = max(lease_seconds / 3, 0.05)
        self._held: dict[RunKey, _Held] = {}
        self._task: asyncio.Task[None] | None = None

    def acquire(self, org_id: str, effect_id: str, attempt: int) -> RunKey:
        """Start renewing this run's lease (counted: each `acquire` needs its `release`)."""
        key = (org_id, effect_id, attempt)
        held = self._held.get(key)
        if held is None:
            held = self._held[key] = _Held(0, time.monotonic())
        held.holders += 1
        return key

    def release(self, key: RunKey) -> None:
        held = self._held.get(key)
        if held is None:
            return
        held.holders -= 1
        if held.holders <= 0:
            del self._held[key]

    @contextlib.contextmanager
    def hold(self, org_id: str, effect_id: str, attempt: int) -> Iterator[RunKey]:
        """Keep renewing this run's lease until the block ends."""
        key = self.acquire(org_id, effect_id, attempt)
        try:
            yield key
        finally:
            self.release(key)

    def valid_until(self, key: RunKey) -> float:
        """The monotonic time until which the store holds this run's lease for us (as far as
        we know: the last accepted renewal plus a lease)."""
        held = self._held.get(key)
        renewed = held.renewed_at if held else time.monotonic()
        return renewed + self.lease_seconds

    async def renew_all(self) -> None:
        """One round: renew every held run; a run that is no longer ours is dropped."""
        for key in list(self._held):
            org_id, effect_id, attempt = key
            started = time.monotonic()
            try:
                ours = await self.engine.renew_lease(org_id, effect_id, attempt)
            except UndoLogError:
                continue  # the store is down: try again next round; the lease runs down
            held = self._held.get(key)
            if held is None:
                continue
            if ours:  # else settled, in doubt or taken over: the lease runs down
                held.renewed_at = started

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            try:
                await self.renew_all()
            except Exception:  # pragma: no cover - a bug must not stop the renewals
                structlog.get_logger("undolog.proxy").exception("lease_renewal_failed")

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="undolog-lease-keeper")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
