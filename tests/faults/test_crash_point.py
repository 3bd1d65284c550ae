"""The crash-point hook itself: off unless armed, exits like kill -9 at the armed hit."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from undolog.faults import CRASH_EXIT_CODE, ENV_VAR

_SCRIPT = """
import sys
from undolog.faults import crash_point
for i in range(1, 4):
    crash_point("mid_rollback")  # never armed here
    print(f"hit {i}", flush=True)
    try:
        crash_point("after_commit")
    finally:
        print("cleanup ran", flush=True)
"""


def _run(value: str | None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != ENV_VAR}
    if value is not None:
        env[ENV_VAR] = value
    return subprocess.run(
        [sys.executable, "-c", _SCRIPT], env=env, capture_output=True, text=True, timeout=60,
        check=False,
    )  # fmt: skip


def test_unset_the_points_do_nothing() -> None:
    done = _run(None)
    assert done.returncode == 0, done.stderr
    assert done.stdout.count("hit") == 3


def test_an_armed_point_exits_137_at_its_first_hit_without_cleanup() -> None:
    done = _run("after_commit")
    assert done.returncode == CRASH_EXIT_CODE
    assert done.stdout.splitlines() == ["hit 1"]  # no `finally`: a kill -9 runs none


def test_an_armed_point_with_a_count_exits_at_that_hit() -> None:
    done = _run("after_commit:3")
    assert done.returncode == CRASH_EXIT_CODE
    assert done.stdout.splitlines() == ["hit 1", "cleanup ran", "hit 2", "cleanup ran", "hit 3"]


@pytest.mark.parametrize("value", ["after_lunch", "after_commit:0", "after_commit:x"])
def test_a_misspelt_point_fails_at_import_rather_than_never_firing(value: str) -> None:
    done = _run(value)
    assert done.returncode == 1
    assert f"{ENV_VAR}={value!r}" in done.stderr
