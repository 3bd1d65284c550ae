"""bench/targets.py and bench/anchor.py's ratios on rows shaped as bench/run.py makes them:
every issue-14 target says PASS or MISS with its shortfall, and the UndoLog/DBOS ratios."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

from anchor import anchor_ratios
from targets import check_targets


def row(store: str, c: int, scenario: str, p50: float, p99: float, per_s: float,
        **cpu: float) -> dict[str, Any]:  # fmt: skip
    return {"store": store, "concurrency": c, "scenario": scenario, "p50_ms": p50,
            "p99_ms": p99, "calls_per_s": per_s, "cpu_ms_per_call": cpu,
            "cpu_utilisation": {"other": 0.1}}  # fmt: skip


def ratio(store: str, c: int, new_over_replay: float, replay_over_new: float) -> dict[str, Any]:
    return {"store": store, "concurrency": c, "new_over_replay_p50": new_over_replay,
            "replay_over_new_throughput": replay_over_new}  # fmt: skip


def run(pg_new_1: tuple[float, float], pg_new_32_cpu: tuple[float, float], pg_new_32: float,
        sqlite_new_32: float) -> list[str]:  # fmt: skip
    rows = [
        row("postgres", 1, "direct", 0.5, 1.0, 1800),
        row("postgres", 1, "new", *pg_new_1, 300),
        row("postgres", 32, "direct", 8, 17, 3000),
        row("postgres", 32, "new", 40, 80, pg_new_32, proxy=pg_new_32_cpu[0],
            postgres=pg_new_32_cpu[1]),
        row("sqlite", 32, "direct", 8, 17, 3600),
        row("sqlite", 32, "new", 40, 80, sqlite_new_32),
    ]  # fmt: skip
    ratios = [ratio("postgres", 1, 2.5, 2.4), ratio("postgres", 32, 2.1, 1.9),
              ratio("sqlite", 32, 3.0, 3.0)]  # fmt: skip
    return check_targets(rows, ratios)


def verdicts(lines: list[str]) -> list[str]:
    return [line.split(":")[0] for line in lines if not line.startswith("NOTE")]


def test_targets_met_say_pass() -> None:
    lines = run((3.0, 8.0), (0.7, 0.5), 1000, 800)
    assert verdicts(lines) == [
        "PASS postgres c=1", "PASS postgres c=1", "PASS postgres c=1",
        "PASS postgres c=32", "PASS postgres c=32", "PASS postgres",
        "MISS postgres c=32",  # replay 1.9x in calls/s at 32
        "PASS sqlite c=32", "PASS sqlite", "PASS sqlite c=32",
    ]  # fmt: skip


def test_targets_missed_say_by_how_much() -> None:
    lines = run((4.5, 15.0), (1.1, 0.8), 600, 500)
    text = "\n".join(lines)
    assert "MISS postgres c=1: added p50 4.00 ms (target <= 3.0 ms, over by 1.00 ms)" in text
    assert "MISS postgres c=1: new call p99 15.00 ms = 3.33x its p50 4.50 ms" in text
    assert "p99 over by 1.50 ms" in text
    assert "MISS postgres c=32: proxy + PostgreSQL CPU 1.90 ms per new call" in text
    assert "over by 0.60 ms" in text
    assert "MISS postgres c=32: 600 new calls/s = 0.200x direct 3000 calls/s" in text
    assert "short by 300 calls/s" in text
    assert "MISS sqlite c=32: 500 new calls/s = 1.28x the baseline 392" in text
    assert "short by 284 calls/s" in text


def test_the_anchor_ratios_compare_added_latency_throughput_and_cpu() -> None:
    direct = row("postgres", 1, "direct", 0.5, 1.0, 1800)
    new = row("postgres", 1, "new", 4.5, 9.0, 200, proxy=1.5, postgres=1.0)
    dbos = row("postgres", 1, "dbos", 12.5, 30.0, 70, dbos=8.0, postgres=2.0)
    assert anchor_ratios(direct, new, dbos) == {
        "dbos_added_p50_ms": 12.0,
        "undolog_over_dbos_added_p50": pytest.approx(0.333, abs=1e-3),
        "undolog_over_dbos_throughput": 2.86,
        "undolog_over_dbos_cpu": 0.25,
    }
    assert anchor_ratios(direct, new, None) == {}
