"""Saga-health metrics: approvals pending by age, effects in doubt, compensations that failed,
time to compensate, time to decide (docs/observability.md).

The two gauges are facts of the store, not of one process: every proxy's approval sweep reads
them from the store each round (`refresh`, two indexed queries grouped by org) and sets them.
So every process reports the same store-wide values; aggregate them with `max`, not `sum`.
The counter and the histograms are per process (sum them), observed where the thing happens.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from undolog.engine.model import now_us
from undolog.store.protocol import Store
from undolog.store.records import ApprovalRecord

__all__ = ["AGE_CUTOFFS", "HealthMetrics"]

# `older_than` label of the pending-approvals gauge, and its cutoff in seconds (cumulative:
# the 5m series counts every approval pending for 5 minutes or more, the 0s series all).
AGE_CUTOFFS = (("0s", 0), ("1m", 60), ("5m", 300), ("15m", 900), ("1h", 3600), ("1d", 86400))

_DECIDE_BUCKETS = (
    1.0, 5.0, 15.0, 30.0, 60.0, 120.0, 300.0, 900.0, 1800.0, 3600.0, 14400.0, 86400.0,
)  # fmt: skip
_COMPENSATE_BUCKETS = (
    0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0,
)  # fmt: skip


@dataclass
class HealthMetrics:
    approvals_pending: Gauge
    effects_in_doubt: Gauge
    compensations_failed: Counter
    compensation_duration: Histogram
    approval_time_to_decide: Histogram
    # Orgs seen by a refresh: set to 0 when their count drops to none (not left stale).
    _orgs: set[str] = field(default_factory=set)

    @classmethod
    def create(cls, r: CollectorRegistry) -> HealthMetrics:
        return cls(
            approvals_pending=Gauge(
                "undolog_proxy_approvals_pending",
                "Pending approvals per org that have waited at least `older_than` "
                "(store-wide, read by every process's sweep: aggregate with max).",
                ["org", "older_than"],
                registry=r,
            ),
            effects_in_doubt=Gauge(
                "undolog_proxy_effects_in_doubt_current",
                "Effects in doubt now per org, waiting for an operator's resolve "
                "(store-wide, read by every process's sweep: aggregate with max).",
                ["org"],
                registry=r,
            ),
            compensations_failed=Counter(
                "undolog_proxy_compensations_failed_total",
                "Undo entries that gave up and need a person: exhausted (every retry "
                "failed) or unknown (the outcome of a non-idempotent compensation is unknown).",
                ["reason"],
                registry=r,
            ),
            compensation_duration=Histogram(
                "undolog_proxy_compensation_duration_seconds",
                "Time to run one compensation the proxy claimed, retries included, by result "
                "(compensated, failed).",
                ["result"],
                buckets=_COMPENSATE_BUCKETS,
                registry=r,
            ),
            approval_time_to_decide=Histogram(
                "undolog_proxy_approval_time_to_decide_seconds",
                "Time from an approval's request to its decision, by final status "
                "(approved, rejected, timed_out, auto_approved).",
                ["status"],
                buckets=_DECIDE_BUCKETS,
                registry=r,
            ),
        )

    def observe_decision(self, approval: ApprovalRecord) -> None:
        """An approval was just decided (by a person or by the sweep)."""
        if approval.decided_us is None:
            return
        waited = max(0, approval.decided_us - approval.created_us) / 1_000_000
        self.approval_time_to_decide.labels(approval.status).observe(waited)

    async def refresh(self, store: Store, clock_us: int | None = None) -> None:
        """Set both gauges from the store (every org at once)."""
        now = now_us() if clock_us is None else clock_us
        async with store.reader() as q:
            pending = await q.pending_approvals_by_age(
                [now - seconds * 1_000_000 for _, seconds in AGE_CUTOFFS]
            )
            in_doubt = await q.effects_in_doubt_by_org()
        self._orgs.update(pending, in_doubt)
        for org in self._orgs:
            counts = pending.get(org, [0] * len(AGE_CUTOFFS))
            for (label, _), count in zip(AGE_CUTOFFS, counts, strict=True):
                self.approvals_pending.labels(org, label).set(count)
            self.effects_in_doubt.labels(org).set(in_doubt.get(org, 0))
