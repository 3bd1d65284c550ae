"""bench/run.py's machine figures: what each report records of the machine itself, so that
runs on different machines (or one machine on a slow day) are told apart."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

from run import machine_speed


def test_the_machine_figures_are_measured_and_the_probe_file_goes(tmp_path: Path) -> None:
    speed = machine_speed(tmp_path)
    assert set(speed) == {"python_loop_ms", "fdatasync_p50_us"}
    assert all(value > 0 for value in speed.values())
    assert list(tmp_path.iterdir()) == []  # nothing left in the bench's work folder
