"""bench/run.py's report: a row per scenario, the ratios between scenarios (direct, the
floor, new, replay, the anchor), and the tables printed at the end of a run."""

from __future__ import annotations

import re
from typing import Any

from anchor import ANCHOR, anchor_missing_row, anchor_ratios, print_anchor
from targets import check_targets

__all__ = ["HEADER", "floor_ratios", "format_row", "print_report", "ratios", "short_series"]


def format_row(row: dict[str, Any]) -> str:
    cpu = row["cpu_ms_per_call"]
    cpu_text = " ".join(f"{k}={v:.2f}" for k, v in cpu.items() if v)
    return (
        f"{row['store']:<9}{row['concurrency']:>4}  {row['scenario']:<7}{row['calls']:>7}"
        f"{row['p50_ms']:>9.2f}{row['p99_ms']:>9.2f}{row['calls_per_s']:>10.0f}"
        f"{row['errors']:>6}{row['machine_busy_cores']:>7.2f}   {cpu_text}"
    )


HEADER = (
    f"{'store':<9}{'conc':>4}  {'scenario':<7}{'calls':>7}{'p50 ms':>9}{'p99 ms':>9}"
    f"{'calls/s':>10}{'errs':>6}{'cores':>7}   CPU ms per call by process"
)


def ratios(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    by = {(r["store"], r["concurrency"], r["scenario"]): r for r in rows}
    out = []
    for store, concurrency in sorted({(r["store"], r["concurrency"]) for r in rows}):
        direct = by[(store, concurrency, "direct")]
        forward = by.get((store, concurrency, "forward"))
        new = by[(store, concurrency, "new")]
        replay = by[(store, concurrency, "replay")]
        out.append(
            {
                "store": store,
                "concurrency": concurrency,
                "added_p50_ms": round(new["p50_ms"] - direct["p50_ms"], 3),
                "new_over_direct_p50": round(new["p50_ms"] / direct["p50_ms"], 2),
                "new_over_direct_throughput": round(new["calls_per_s"] / direct["calls_per_s"], 3),
                "new_over_replay_p50": round(new["p50_ms"] / replay["p50_ms"], 2),
                "replay_over_new_throughput": round(replay["calls_per_s"] / new["calls_per_s"], 2),
                "direct_over_new_throughput": round(direct["calls_per_s"] / new["calls_per_s"], 1),
                **anchor_ratios(direct, new, by.get((store, concurrency, ANCHOR))),
                **floor_ratios(direct, forward, new),
            }
        )
    return out


def floor_ratios(
    direct: dict[str, Any], forward: dict[str, Any] | None, new: dict[str, Any]
) -> dict[str, float]:
    """The floor's row against the direct call, and UndoLog's new call against the floor."""
    if forward is None:
        return {}
    return {
        "forward_added_p50_ms": round(forward["p50_ms"] - direct["p50_ms"], 3),
        "forward_over_direct_throughput": round(forward["calls_per_s"] / direct["calls_per_s"], 3),
        "new_over_forward_throughput": round(new["calls_per_s"] / forward["calls_per_s"], 3),
    }


def print_report(
    rows: list[dict[str, Any]], ratio_rows: list[dict[str, Any]], anchors: dict[str, Any]
) -> list[str]:
    print("\n" + HEADER)
    for row in rows:
        print(format_row(row))
    for store, anchor in anchors.items():
        if not anchor["running"]:
            for c in sorted({r["concurrency"] for r in rows if r["store"] == store}):
                print(anchor_missing_row(store, c, anchor["reason"]))
    print(
        f"\n{'store':<9}{'conc':>4}  {'added p50 ms':>12}{'new/direct thr':>16}"
        f"{'new/replay p50':>16}{'replay/new thr':>16}{'direct/new thr':>16}"
    )
    for r in ratio_rows:
        print(
            f"{r['store']:<9}{r['concurrency']:>4}  {r['added_p50_ms']:>12.2f}"
            f"{r['new_over_direct_throughput']:>16.3f}{r['new_over_replay_p50']:>16.2f}"
            f"{r['replay_over_new_throughput']:>16.2f}{r['direct_over_new_throughput']:>16.1f}"
        )
    print_anchor(ratio_rows, anchors)
    floors = [r for r in ratio_rows if "forward_over_direct_throughput" in r]
    if floors:
        print(
            "\nThe floor (bench/floor.py: a Python forwarder keeping nothing, same stack):\n"
            f"{'store':<9}{'conc':>4}  {'floor added p50 ms':>18}{'floor/direct thr':>18}"
            f"{'new/floor thr':>15}"
        )
        for r in floors:
            print(
                f"{r['store']:<9}{r['concurrency']:>4}  {r['forward_added_p50_ms']:>18.2f}"
                f"{r['forward_over_direct_throughput']:>18.3f}"
                f"{r['new_over_forward_throughput']:>15.3f}"
            )
    print("\nWhere the proxy's time goes (means of its histograms over each scenario, ms):")
    for row in rows:
        if row["scenario"] in ("direct", "forward", ANCHOR):
            continue
        means = row["proxy_histogram_means"]
        parts = [
            f"{short_series(series)}={m['mean_ms']:.2f}"
            for series, m in sorted(means.items())
            if "tool_call" in series or "engine_rpc" in series or "executor" in series
        ]
        print(f"  {row['store']:<9}{row['concurrency']:>3} {row['scenario']:<7} " + " ".join(parts))
    print("\nKernel share of each process's CPU (syscalls: loopback TCP, fsync), ms per call:")
    for row in rows:
        cpu, kernel = row["cpu_ms_per_call"], row["kernel_cpu_ms_per_call"]
        parts = [f"{name}={kernel[name]:.2f}/{cpu[name]:.2f}" for name in kernel if cpu.get(name)]
        print(f"  {row['store']:<9}{row['concurrency']:>3} {row['scenario']:<7} " + " ".join(parts))
    return check_targets(rows, ratio_rows)


def short_series(series: str) -> str:
    series = series.replace("undolog_proxy_", "").replace("_duration_seconds", "")
    return re.sub(r'\{(?:\w+)="([^"]*)"\}', r"[\1]", series).replace("/mcp/tool_call", "tool_call")
