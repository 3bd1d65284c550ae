"""The fault suite's report, a plugin of the whole run (`pytest_plugins` in tests/conftest.py).

Each trial attaches its counts to its test (`fault_report`, tests/faults/conftest.py); they come
back with the test's reports — from pytest-xdist's workers too, where the summary could not see
them otherwise — and are summed here, per case and store, in the terminal summary and, with
`--faults-report PATH`, as JSON.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

COUNTS = ("calls", "duplicates", "lost", "stuck")


def _fields(line: str) -> dict[str, str]:
    return dict(part.split("=", 1) for part in line.split()[1:])


def case_totals(lines: list[str]) -> dict[tuple[str, str], dict[str, float]]:
    """(store, point) -> the counts summed over its trials, and the highest recovery time."""
    totals: dict[tuple[str, str], dict[str, float]] = {}
    for line in lines:
        fields = _fields(line)
        total = totals.setdefault((fields["store"], fields["point"]), {"trials": 0})
        total["trials"] += 1
        for name in COUNTS:
            total[name] = total.get(name, 0) + int(fields[name])
        if "recovery_s" in fields:
            total["recovery_s"] = max(total.get("recovery_s", 0.0), float(fields["recovery_s"]))
    return totals


class FaultReport:
    """The lines of one run, in the process that writes the summary."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.lines: list[str] = []

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.when == "teardown":  # every test has one, failed or not: it carries them
            self.lines += [str(v) for name, v in report.user_properties if name == "faults"]

    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        lines = self.lines
        if not lines:
            return
        terminalreporter.section("fault suite")
        for line in lines:
            terminalreporter.write_line(line)
        totals = case_totals(lines)
        for (store, point), total in sorted(totals.items()):
            recovery = f" max_recovery_s={total['recovery_s']:.2f}" if "recovery_s" in total else ""
            terminalreporter.write_line(
                f"faults case: store={store} point={point} trials={int(total['trials'])} "
                + " ".join(f"{name}={int(total[name])}" for name in COUNTS)
                + recovery
            )
        for store in sorted({store for store, _ in totals}):
            summed = [sum(int(t[name]) for (s, _), t in totals.items() if s == store)
                      for name in COUNTS]  # fmt: skip
            terminalreporter.write_line(
                f"faults total: store={store} "
                + " ".join(f"{name}={n}" for name, n in zip(COUNTS, summed, strict=True))
            )
        path = self.config.getoption("faults_report", None)
        if path:
            report = [
                {"store": store, "point": point, **total}
                for (store, point), total in sorted(totals.items())
            ]
            Path(path).write_text(json.dumps({"cases": report, "lines": lines}, indent=2) + "\n")


def pytest_configure(config: pytest.Config) -> None:
    config.pluginmanager.register(FaultReport(config), "undolog-fault-report")
