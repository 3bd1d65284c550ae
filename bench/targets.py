"""The targets of issue 14 ("Fast enough to forget it is there"), checked on one run's rows.

Each line is PASS or MISS with the shortfall; bench/README.md, "Targets", says what each one
means. The rows and ratios are bench/run.py's (`summarise`, `ratios`).
"""

from __future__ import annotations

import os
from typing import Any

# On PostgreSQL with 32 sessions: CPU of the proxy and of PostgreSQL's backends per new call.
TARGET_PG_CPU_MS_PER_NEW = 1.3
# On PostgreSQL with 32 sessions: new calls/s as a share of direct calls/s.
TARGET_PG_NEW_OVER_DIRECT = 0.30
# On PostgreSQL with 1 caller: the latency UndoLog adds at p50, and the new call's p99 / p50.
TARGET_PG_ADDED_P50_MS = 3.0
TARGET_PG_P99_OVER_P50 = 3.0
# Every store: a replay is this many times cheaper than a new call (p50; and calls/s at 32).
TARGET_REPLAY_FACTOR = 2.0
# SQLite new calls/s at 32 sessions before issue 14: 392 calls/s, bench/results/latest.json of
# commit 88f4a7b (a full run on a quiet machine). The target is twice that.
SQLITE_NEW_PER_S_BASELINE = 392.0
TARGET_SQLITE_NEW_FACTOR = 2.0


def _verdict(ok: bool) -> str:
    return "PASS" if ok else "MISS"


def _postgres(by: dict[tuple[str, int, str], dict[str, Any]], c: int) -> list[str]:
    lines = []
    new, direct = by[("postgres", c, "new")], by[("postgres", c, "direct")]
    if c == 1:
        added = new["p50_ms"] - direct["p50_ms"]
        over = added - TARGET_PG_ADDED_P50_MS
        lines.append(
            f"{_verdict(over <= 0)} postgres c=1: added p50 {added:.2f} ms "
            f"(target <= {TARGET_PG_ADDED_P50_MS} ms"
            + (f", over by {over:.2f} ms)" if over > 0 else ")")
        )
        spread = new["p99_ms"] / new["p50_ms"]
        lines.append(
            f"{_verdict(spread <= TARGET_PG_P99_OVER_P50)} postgres c=1: new call p99 "
            f"{new['p99_ms']:.2f} ms = {spread:.2f}x its p50 {new['p50_ms']:.2f} ms "
            f"(target <= {TARGET_PG_P99_OVER_P50:.0f}x"
            + (
                f", p99 over by {new['p99_ms'] - TARGET_PG_P99_OVER_P50 * new['p50_ms']:.2f} ms)"
                if spread > TARGET_PG_P99_OVER_P50
                else ")"
            )
        )
    if c == 32:
        cpu = new["cpu_ms_per_call"]
        spent = cpu.get("proxy", 0.0) + cpu.get("postgres", 0.0)
        over = spent - TARGET_PG_CPU_MS_PER_NEW
        lines.append(
            f"{_verdict(over <= 0)} postgres c=32: proxy + PostgreSQL CPU {spent:.2f} ms per new "
            f"call (proxy {cpu.get('proxy', 0.0):.2f}, postgres {cpu.get('postgres', 0.0):.2f}; "
            f"target <= {TARGET_PG_CPU_MS_PER_NEW} ms"
            + (f", over by {over:.2f} ms)" if over > 0 else ")")
        )
        share = new["calls_per_s"] / direct["calls_per_s"] if direct["calls_per_s"] else 0.0
        short = TARGET_PG_NEW_OVER_DIRECT * direct["calls_per_s"] - new["calls_per_s"]
        lines.append(
            f"{_verdict(share >= TARGET_PG_NEW_OVER_DIRECT)} postgres c=32: "
            f"{new['calls_per_s']:.0f} new calls/s = {share:.3f}x direct "
            f"{direct['calls_per_s']:.0f} calls/s (target >= {TARGET_PG_NEW_OVER_DIRECT:.2f}x"
            + (f", short by {short:.0f} calls/s)" if share < TARGET_PG_NEW_OVER_DIRECT else ")")
        )
    return lines


def _sqlite(by: dict[tuple[str, int, str], dict[str, Any]]) -> list[str]:
    new = by[("sqlite", 32, "new")]["calls_per_s"]
    goal = TARGET_SQLITE_NEW_FACTOR * SQLITE_NEW_PER_S_BASELINE
    return [
        f"{_verdict(new >= goal)} sqlite c=32: {new:.0f} new calls/s = "
        f"{new / SQLITE_NEW_PER_S_BASELINE:.2f}x the baseline {SQLITE_NEW_PER_S_BASELINE:.0f} "
        f"(target >= {TARGET_SQLITE_NEW_FACTOR:.0f}x = {goal:.0f}"
        + (f", short by {goal - new:.0f} calls/s)" if new < goal else ")")
    ]


def check_targets(rows: list[dict[str, Any]], ratio_rows: list[dict[str, Any]]) -> list[str]:
    """The verdict lines, printed and returned (they go into latest.json)."""
    by = {(r["store"], r["concurrency"], r["scenario"]): r for r in rows}
    lines = []
    for r in ratio_rows:
        store, c = r["store"], r["concurrency"]
        if store == "postgres":
            lines.extend(_postgres(by, c))
        if store == "sqlite" and c == 32:
            lines.extend(_sqlite(by))
        if c == 32:
            new = by[(store, c, "new")]["calls_per_s"]
            direct = by[(store, c, "direct")]["calls_per_s"]
            lines.append(
                f"{_verdict(direct >= 3 * new)} {store}: load generator not the bottleneck: "
                f"direct {direct:.0f} calls/s = {direct / new:.1f}x the proxy's new calls"
            )
        replay_ok = r["new_over_replay_p50"] >= TARGET_REPLAY_FACTOR and (
            c == 1 or r["replay_over_new_throughput"] >= TARGET_REPLAY_FACTOR
        )
        lines.append(
            f"{_verdict(replay_ok)} {store} c={c}: replay cheaper than a new call by "
            f"{r['new_over_replay_p50']:.2f}x at p50, {r['replay_over_new_throughput']:.2f}x "
            f"in calls/s (target >= {TARGET_REPLAY_FACTOR:.0f}x)"
        )
    others = [r["cpu_utilisation"].get("other", 0.0) for r in rows]
    if others:
        lines.append(
            f"NOTE other processes + kernel used {sum(others) / len(others):.2f} of "
            f"{os.cpu_count()} cores on average while measuring (max {max(others):.2f}); "
            "on a shared machine that slows every scenario"
        )
    print("\nTargets:")
    for line in lines:
        print("  " + line)
    return lines
