"""bench/floor.py, the floor's row of the bench: a forwarder that keeps nothing hands back
exactly what the upstream answers, and the report's floor ratios (bench/report.py)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import httpx

from tests.support.servers import ThreadServer
from undolog.demo.tools import create_demo_tools_app

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

from floor import Forwarder
from report import floor_ratios, ratios


def test_the_forwarder_hands_back_what_the_upstream_answers() -> None:
    upstream = ThreadServer(create_demo_tools_app()).start()
    forwarder = ThreadServer(Forwarder(upstream.url)).start()
    body = {"args": {"text": "hello", "n": 7}, "session_id": "s", "effect_id": "e"}
    try:
        direct = httpx.post(upstream.url + "/tools/echo", json=body, timeout=10)
        forwarded = httpx.post(forwarder.url + "/tools/echo", json=body, timeout=10)
        missing = httpx.post(forwarder.url + "/tools/no-such-tool", json=body, timeout=10)
        health = httpx.get(forwarder.url + "/health", timeout=10)
    finally:
        forwarder.stop()
        upstream.stop()
    assert direct.status_code == forwarded.status_code == 200
    assert forwarded.json() == direct.json() and b'"success":true' in forwarded.content
    assert missing.status_code == 404  # the upstream's status, not the forwarder's
    assert health.status_code == 200


def row(scenario: str, p50: float, per_s: float) -> dict[str, Any]:
    return {"store": "sqlite", "concurrency": 32, "scenario": scenario, "p50_ms": p50,
            "calls_per_s": per_s}  # fmt: skip


def test_the_floor_ratios_compare_the_floor_with_direct_and_the_new_call_with_the_floor() -> None:
    direct, forward = row("direct", 8.0, 4000), row("forward", 40.0, 1600)
    new = row("new", 80.0, 400)
    assert floor_ratios(direct, forward, new) == {
        "forward_added_p50_ms": 32.0,
        "forward_over_direct_throughput": 0.4,
        "new_over_forward_throughput": 0.25,
    }
    assert floor_ratios(direct, None, new) == {}  # a report without the floor's row
    (ratio,) = ratios([direct, forward, new, row("replay", 20.0, 1000)])
    assert ratio["new_over_forward_throughput"] == 0.25
