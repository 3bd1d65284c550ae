"""Crash points: a test-only hook that kills the process at a named place, like kill -9.

The fault suite (tests/faults, docs/faults.md) proves that exactly-once holds when a proxy dies
at the worst moments. A signal sent from outside cannot land reliably between two lines of the
hot path, so the code names those places itself: `crash_point("after_commit")` and so on.

Off by default. The environment variable `UNDOLOG_CRASH_POINT` is read once, at import:

- unset or empty: every `crash_point` call is one comparison against `None` and returns;
- `after_commit`: the process exits with status 137 the first time it reaches that point;
- `after_commit:3`: ... the third time (so a test can choose which of several calls dies).

The exit is `os._exit`: no `finally`, no lifespan shutdown, no flush of buffered writes, no
answer to the client — what kill -9 leaves, at a known line. Never set it in production.

Points (where they are called):

- `after_intent`: the effect is durably `executing`, the upstream not yet called
  (`undolog.services.calls.execute_decision`).
- `during_upstream`: the request was sent and the upstream's answer has started to arrive,
  but its body is not read (`undolog.services.executor.ToolExecutor.call`; also compensations).
- `after_answer`: the answer is read, the outcome not recorded (`execute_decision`).
- `after_commit`: the result is committed, the reply not yet sent (`execute_decision`).
- `mid_rollback`: a compensation was run on the upstream, its outcome not yet recorded
  (`undolog.services.rollback`).
"""

from __future__ import annotations

import os

__all__ = ["CRASH_EXIT_CODE", "CRASH_POINTS", "ENV_VAR", "crash_point"]

ENV_VAR = "UNDOLOG_CRASH_POINT"
CRASH_EXIT_CODE = 137  # what a shell reports for a process killed by SIGKILL (128 + 9)
CRASH_POINTS = frozenset(
    {"after_intent", "during_upstream", "after_answer", "after_commit", "mid_rollback"}
)


def _parse(raw: str | None) -> tuple[str, int] | None:
    """`name` or `name:N` (N >= 1) -> (name, N); unset or empty -> None; anything else raises."""
    if not raw:
        return None
    name, _, count = raw.partition(":")
    if name not in CRASH_POINTS:
        raise ValueError(f"{ENV_VAR}={raw!r}: unknown crash point (one of {sorted(CRASH_POINTS)})")
    hits = int(count) if count.isdigit() else (1 if not count else 0)
    if hits < 1:
        raise ValueError(f"{ENV_VAR}={raw!r}: the hit count must be at least 1")
    return name, hits


_ARMED = _parse(os.environ.get(ENV_VAR))
_ARMED_NAME = _ARMED[0] if _ARMED else None
_remaining = _ARMED[1] if _ARMED else 0


def crash_point(name: str) -> None:
    """Exit at once (status 137, no cleanup) if `UNDOLOG_CRASH_POINT` armed `name` and this is
    the hit it counts down to; otherwise do nothing."""
    global _remaining
    if _ARMED_NAME is None or name != _ARMED_NAME:
        return
    _remaining -= 1
    if _remaining <= 0:
        os._exit(CRASH_EXIT_CODE)
