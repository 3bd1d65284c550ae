"""The Grafana dashboard in deploy/grafana/undolog.json against a real proxy's /metrics.

Every metric a panel or variable queries must be one the running server exposes (its HELP
and TYPE lines are there before any sample is), so that a renamed metric breaks this test
rather than a panel (docs/observability.md, "Dashboard").
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from tests.proxy.conftest import METRICS_AUTH, ProxyHarness

DASHBOARD = Path(__file__).resolve().parents[2] / "deploy" / "grafana" / "undolog.json"
METRIC = re.compile(r"\bundolog_[a-z0-9_]+\b")
SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "gauge": ("",)}


def dashboard() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    return data


def queries(data: dict[str, Any]) -> list[str]:
    """Every PromQL text: the panels' targets and the template variables' queries."""
    found = [t["expr"] for p in data["panels"] for t in p.get("targets", [])]
    for variable in data["templating"]["list"]:
        query = variable.get("query")
        if isinstance(query, dict):
            found.append(query["query"])
    return found


def exposed(proxy: ProxyHarness) -> set[str]:
    """The sample names the server's families can have (with their type's suffixes)."""
    text = httpx.get(f"{proxy.url}/metrics", headers=METRICS_AUTH, timeout=10).text
    names = set()
    for family in text_string_to_metric_families(text):
        for suffix in SUFFIXES.get(family.type, ("",)):
            names.add(family.name + suffix)
    return names


def test_every_metric_the_dashboard_queries_is_exposed_by_a_running_server(
    proxy: ProxyHarness,
) -> None:
    used = {name for query in queries(dashboard()) for name in METRIC.findall(query)}
    assert len(used) >= 15, used  # the saga-health ones and the existing ones
    missing = used - exposed(proxy)
    assert not missing, f"queried by the dashboard but not in /metrics: {sorted(missing)}"
    for health in (
        "undolog_proxy_approvals_pending",
        "undolog_proxy_effects_in_doubt_current",
        "undolog_proxy_compensations_failed_total",
        "undolog_proxy_compensation_duration_seconds_bucket",
        "undolog_proxy_approval_time_to_decide_seconds_bucket",
    ):
        assert health in used, health


def test_the_dashboard_is_well_formed() -> None:
    data = dashboard()
    assert data["uid"] == "undolog-proxy" and data["title"] == "UndoLog"
    ids = [p["id"] for p in data["panels"]]
    assert len(ids) == len(set(ids))
    for panel in data["panels"]:
        if panel["type"] == "row":
            continue
        assert panel["targets"], panel["title"]
        assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
        for target in panel["targets"]:
            expr = target["expr"]
            for left, right in ("()", "[]", "{}"):
                assert expr.count(left) == expr.count(right), expr
    names = [v["name"] for v in data["templating"]["list"]]
    assert names == ["datasource", "org"]
