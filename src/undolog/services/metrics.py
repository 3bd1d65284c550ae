"""Prometheus metric families of the proxy, with the reference's names and labels.

Each app gets its own registry, so two apps in one process (tests) do not collide.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import prometheus_client
from prometheus_client import CollectorRegistry, generate_latest

from undolog.services.health import HealthMetrics

__all__ = ["Counter", "Gauge", "Histogram", "ProxyMetrics"]

_LATENCY_BUCKETS = (
    0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
)  # fmt: skip


class _CachedLabels:
    """`labels(...)` answered from a dict of this family's own, past prometheus_client's.

    prometheus_client's `labels` converts every value with `str`, builds a tuple and takes a
    lock on each call; the proxy asks for a labelled child five times per tool call, with
    the same few values. A child found once is kept here under the values as given (only
    when all are plain `str`, so that the key is exactly the label the library would make),
    and dropped again by `remove`, `remove_by_labels` and `clear`, which drop the library's.
    """

    _children: dict[tuple[object, ...], Any]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._children = {}
        super().__init__(*args, **kwargs)

    def labels(self, *labelvalues: Any, **labelkwargs: Any) -> Any:
        try:
            return self._children[labelvalues]  # keyword labels are never stored: a miss
        except (KeyError, TypeError):  # TypeError: an unhashable value, left to the library
            pass
        child = super().labels(*labelvalues, **labelkwargs)  # type: ignore[misc]
        if not labelkwargs and all(type(value) is str for value in labelvalues):
            self._children[labelvalues] = child
        return child

    def remove(self, *labelvalues: Any) -> None:
        self._children.clear()
        super().remove(*labelvalues)  # type: ignore[misc]

    def remove_by_labels(self, labels: dict[str, str]) -> None:
        self._children.clear()
        super().remove_by_labels(labels)  # type: ignore[misc]

    def clear(self) -> None:
        self._children.clear()
        super().clear()  # type: ignore[misc]


class Counter(_CachedLabels, prometheus_client.Counter):
    """A `prometheus_client.Counter` whose labelled children are cached."""


class Gauge(_CachedLabels, prometheus_client.Gauge):
    """A `prometheus_client.Gauge` whose labelled children are cached."""


class Histogram(_CachedLabels, prometheus_client.Histogram):
    """A `prometheus_client.Histogram` whose labelled children are cached."""


@dataclass
class ProxyMetrics:
    registry: CollectorRegistry
    http_requests: Counter
    http_duration: Histogram
    engine_rpc_duration: Histogram
    engine_rpc_errors: Counter
    engine_rpc_retries: Counter
    executor_duration: Histogram
    sse_subscribers: Gauge
    sse_events_dropped: Counter
    approval_decisions: Counter
    approval_decision_duration: Histogram
    effects_in_doubt: Counter
    held_results: Counter
    pruned_rows: Counter
    tier_mismatches: Counter
    health: HealthMetrics  # saga health: services/health.py

    @classmethod
    def create(cls) -> ProxyMetrics:
        r = CollectorRegistry(auto_describe=True)
        return cls(
            registry=r,
            http_requests=Counter(
                "undolog_proxy_http_requests_total",
                "Completed HTTP requests by route and status code.",
                ["route", "status"],
                registry=r,
            ),
            http_duration=Histogram(
                "undolog_proxy_http_request_duration_seconds",
                "HTTP request duration per route.",
                ["route"],
                buckets=_LATENCY_BUCKETS,
                registry=r,
            ),
            engine_rpc_duration=Histogram(
                "undolog_proxy_engine_rpc_duration_seconds",
                "Engine call duration.",
                ["method"],
                buckets=_LATENCY_BUCKETS,
                registry=r,
            ),
            engine_rpc_errors=Counter(
                "undolog_proxy_engine_rpc_errors_total",
                "Engine calls that returned an error.",
                ["method"],
                registry=r,
            ),
            engine_rpc_retries=Counter(
                "undolog_proxy_engine_rpc_retries_total",
                "Engine calls retried after a transient failure.",
                ["method"],
                registry=r,
            ),
            executor_duration=Histogram(
                "undolog_proxy_executor_duration_seconds",
                "Upstream tool executor duration.",
                ["result"],
                buckets=_LATENCY_BUCKETS,
                registry=r,
            ),
            sse_subscribers=Gauge(
                "undolog_proxy_sse_subscribers",
                "Active SSE subscribers per organisation.",
                ["org"],
                registry=r,
            ),
            sse_events_dropped=Counter(
                "undolog_proxy_sse_events_dropped_total",
                "SSE events dropped because a subscriber channel was full.",
                ["org"],
                registry=r,
            ),
            approval_decisions=Counter(
                "undolog_proxy_approval_decisions_total",
                "Approval decisions by action and outcome.",
                ["action", "result"],
                registry=r,
            ),
            approval_decision_duration=Histogram(
                "undolog_proxy_approval_decision_duration_seconds",
                "Approval decision latency.",
                ["action"],
                buckets=_LATENCY_BUCKETS,
                registry=r,
            ),
            effects_in_doubt=Counter(
                "undolog_proxy_effects_in_doubt_total",
                "Effects moved to in_doubt: outcome_unknown (a timeout, a lost connection, "
                "a broken answer), lease_expired (the sweeper), compensation_unknown.",
                ["reason"],
                registry=r,
            ),
            held_results=Counter(
                "undolog_proxy_held_results_total",
                "Results whose commit failed: held (spooled, retried in the background), "
                "committed (later, by this run), recovered (from the spool, after a restart), "
                "not_run (recorded while the store's connection was lost, never sent: failed).",
                ["outcome"],
                registry=r,
            ),
            pruned_rows=Counter(
                "undolog_proxy_pruned_rows_total",
                "Rows deleted by retention (docs/retention.md), by table: sessions, effects, "
                "undo_entries, approvals, events.",
                ["table"],
                registry=r,
            ),
            tier_mismatches=Counter(
                "undolog_proxy_tier_mismatches_total",
                "Calls whose code declared another tier (or compensation) than the registry "
                "holds; they ran under the stricter tier (docs/sdk.md).",
                ["declared", "registered"],
                registry=r,
            ),
            health=HealthMetrics.create(r),
        )

    def render(self) -> bytes:
        return generate_latest(self.registry)
