"""Helpers for the SDK tests that run against a real proxy, and agents run as processes.

There is no approvals endpoint yet, so a test decides an approval the way the engine would see
it: by writing the approval row through the store the proxy uses.
"""

from __future__ import annotations

import queue
import subprocess
import threading
import time
from pathlib import Path
from typing import IO, Any

from tests.proxy.conftest import ProxyHarness
from undolog.store import open_store


def session_view(proxy: ProxyHarness, session_id: str) -> dict[str, Any]:
    """`GET /sessions/{id}`: the session with its effects (step order) and approvals."""
    with proxy.client() as c:
        response = c.get(f"/sessions/{session_id}")
    assert response.status_code == 200, response.text
    view: dict[str, Any] = response.json()
    return view


async def decide_approval(proxy: ProxyHarness, approval_id: str, status: str = "approved") -> None:
    """Approve (or reject) a pending approval, as a person would from the dashboard."""
    store = await open_store(proxy.database_url)
    try:
        async with store.transaction() as q:
            changed = await q.update_approval(
                proxy.org_id,
                approval_id,
                status=status,
                decided_us=time.time_ns() // 1000,
                decided_by="test-operator",
                expect_status="pending",
            )
    finally:
        await store.close()
    assert changed, f"approval {approval_id} was not pending"


class Agent:
    """An agent script as a child process, its stdout read line by line with a deadline.

    Use it as a context manager: a test that fails half-way still kills the process.
    """

    def __init__(self, args: list[str], env: dict[str, str], log: Path) -> None:
        self._log = log.open("ab")
        self.proc = subprocess.Popen(
            args,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log,
            text=True,
        )
        self.lines: list[str] = []
        self._queue: queue.Queue[str | None] = queue.Queue()
        assert self.proc.stdout is not None
        threading.Thread(target=self._pump, args=(self.proc.stdout,), daemon=True).start()

    def __enter__(self) -> Agent:
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)
        if not self._log.closed:
            self._close()

    def _pump(self, stream: IO[str]) -> None:
        with stream:
            for line in stream:
                self._queue.put(line.rstrip("\n"))
        self._queue.put(None)

    def wait_for_line(self, text: str, timeout: float = 30.0) -> str:
        """The next line that contains `text` (the lines before it are kept in `lines`)."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                line = self._queue.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise TimeoutError(
                    f"no line with {text!r} within {timeout}s: {self.lines}"
                ) from None
            if line is None:
                raise AssertionError(f"the agent exited before a line with {text!r}: {self.lines}")
            self.lines.append(line)
            if text in line:
                return line

    def kill9(self) -> None:
        self.proc.kill()  # SIGKILL
        assert self.proc.wait(timeout=10) == -9
        self._close()

    def finish(self, timeout: float = 60.0) -> int:
        """Wait for the agent to exit by itself; its exit code."""
        code = self.proc.wait(timeout=timeout)
        self._close()
        return code

    def _close(self) -> None:
        """Read what is left of stdout (the pump closes it), close stdin and the log."""
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        while (line := self._queue.get(timeout=10)) is not None:
            self.lines.append(line)
        self._log.close()
