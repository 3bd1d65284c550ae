"""The background sweeps each proxy runs, until cancelled: expired approvals, expired leases,
and retention (finished sessions past their org's `retention_days`, docs/retention.md).

No error ends a sweep: a dead sweeper would leave every later approval pending forever, or
orphaned calls invisible. Both are safe to run in many processes on one PostgreSQL.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from undolog.engine.retention import PruneCounts, Retention
from undolog.services import approvals
from undolog_sdk.errors import UndoLogError
from undolog_sdk.wire import EffectState

if TYPE_CHECKING:
    from undolog.runtime import Runtime

__all__ = [
    "prune_once",
    "sweep_approvals_forever",
    "sweep_leases_forever",
    "sweep_retention_forever",
]


async def sweep_approvals_forever(runtime: Runtime, interval_seconds: float) -> None:
    """Time out expired approvals (or auto-approve and run them), until cancelled.

    No error ends the loop: a sweeper that died would leave every later approval pending
    forever. One failed run does not keep the others of its round from running.
    """
    while True:
        try:
            results = await runtime.approvals.sweep()
        except UndoLogError as exc:  # the store is down: try again next round
            runtime.log.warning("approval_sweep_failed", error=exc.message)
            results = []
        except Exception:
            runtime.log.exception("approval_sweep_failed")
            results = []
        try:  # the saga-health gauges: store-wide, read each round (services/health.py)
            await runtime.metrics.health.refresh(runtime.store)
        except UndoLogError as exc:
            runtime.log.warning("health_gauges_failed", error=exc.message)
        except Exception:
            runtime.log.exception("health_gauges_failed")
        for result in results:
            approval = result.approval
            runtime.metrics.health.observe_decision(approval)
            runtime.log.info(
                "approval_swept",
                org_id=approval.org_id,
                approval_id=approval.approval_id,
                status=approval.status,
            )
            if result.run is None:
                continue
            try:
                await approvals.apply_policy(runtime, result)
            except Exception:
                runtime.log.exception("approval_run_failed", approval_id=approval.approval_id)
        await asyncio.sleep(interval_seconds)


async def sweep_leases_forever(runtime: Runtime, interval_seconds: float) -> None:
    """Move `executing` effects whose lease expired to `in_doubt`, every `interval_seconds`,
    until cancelled. No error ends the loop (a dead sweeper would leave orphans invisible)."""
    while True:
        try:
            moved = await runtime.engine.sweep_expired()
        except UndoLogError as exc:  # the store is down: try again next round
            runtime.log.warning("lease_sweep_failed", error=exc.message)
            moved = []
        except Exception:
            runtime.log.exception("lease_sweep_failed")
            moved = []
        for effect in moved:
            if effect.state == EffectState.IN_DOUBT:
                runtime.metrics.effects_in_doubt.labels("lease_expired").inc()
            runtime.log.warning(
                "effect_in_doubt" if effect.state == EffectState.IN_DOUBT else "effect_failed",
                reason="lease_expired",
                org_id=effect.org_id,
                session_id=effect.session_id,
                effect_id=effect.effect_id,
                tool_name=effect.tool_name,
            )
        await asyncio.sleep(interval_seconds)


async def prune_once(runtime: Runtime, retention: Retention, batch_size: int) -> PruneCounts:
    """One retention round over every org that has one, then every org's expired MCP tasks;
    counts each committed batch in `undolog_proxy_pruned_rows_total` as it goes. Returns
    what retention let go, all orgs together."""

    def counted(org_id: str, counts: PruneCounts) -> None:
        for table, rows in counts.as_dict().items():
            if rows:
                runtime.metrics.pruned_rows.labels(table).inc(rows)

    report = await retention.prune(batch_size=batch_size, on_batch=counted)
    tasks = await retention.expire_tasks(batch_size=batch_size)
    if tasks:
        runtime.metrics.pruned_rows.labels("mcp_tasks").inc(tasks)
        runtime.log.info("mcp_tasks_expired", rows=tasks)
    total = PruneCounts()
    for org_id, counts in report.items():
        total += counts
        if counts.total:
            runtime.log.info("retention_pruned", org_id=org_id, **counts.as_dict())
    return total


async def sweep_retention_forever(
    runtime: Runtime, interval_seconds: float, batch_size: int
) -> None:
    """Prune what orgs' retention lets go, every `interval_seconds`, until cancelled.

    Batches of `batch_size` sessions, each its own short transaction, so calls never wait
    for more than one batch. Safe in many processes on one PostgreSQL (a batch skips the
    sessions another pruner holds). No error ends the loop.
    """
    retention = Retention(runtime.store)
    while True:
        try:
            await prune_once(runtime, retention, batch_size)
        except UndoLogError as exc:  # the store is down: try again next round
            runtime.log.warning("retention_sweep_failed", error=exc.message)
        except Exception:
            runtime.log.exception("retention_sweep_failed")
        await asyncio.sleep(interval_seconds)
