"""The event loop every server process of the CLI runs on: uvloop when installed."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any

__all__ = ["run_on_uvloop"]


def run_on_uvloop(main: Coroutine[Any, Any, Any]) -> Any:
    """Run a server coroutine on uvloop when it is installed (as uvicorn itself would)."""
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvicorn[standard] brings it
        return asyncio.run(main)
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(main)
