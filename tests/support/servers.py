"""Real uvicorn servers for tests: in a thread of this process, or as a child process.

Both bind 127.0.0.1 on a port the OS picks, and wait (with a deadline) until the server
answers before handing back its base URL. No sleeps: readiness is polled.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import httpx
import uvicorn

from undolog.config import Settings
from undolog.proxy.server import build_server


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_until(
    predicate: Callable[[], bool], *, timeout: float = 15.0, what: str = "condition"
) -> None:
    """Poll `predicate` until it holds, or fail after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.02)
    raise TimeoutError(f"timed out after {timeout}s waiting for {what}")


async def await_until(
    predicate: Callable[[], Any], *, within: float = 15.0, what: str = "condition"
) -> None:
    """Async twin of `wait_until`; `predicate` may be a coroutine function."""
    timeout = within
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if asyncio.iscoroutine(value):
            value = await value
        if value:
            return
        await asyncio.sleep(0.02)
    raise TimeoutError(f"timed out after {timeout}s waiting for {what}")


def _answers(url: str) -> bool:
    try:
        httpx.get(url, timeout=0.5)
    except httpx.TransportError:
        return False
    return True


@dataclass
class ThreadServer:
    """A uvicorn server running an ASGI app in a background thread.

    Built by `undolog.proxy.server.build_server`, as `undolog serve` builds it, so every test
    runs behind the same connection caps; `settings` gives them (default: the defaults).
    """

    app: Any
    port: int = field(default_factory=free_port)
    server: uvicorn.Server | None = None
    thread: threading.Thread | None = None
    settings: Settings | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> ThreadServer:
        self.server = build_server(
            self.app,
            self.settings or Settings(),
            host="127.0.0.1",
            port=self.port,
            log_level="warning",
        )
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        wait_until(lambda: self.server is not None and self.server.started, what="uvicorn start")
        return self

    def stop(self) -> None:
        if self.server is not None:
            self.server.should_exit = True
        if self.thread is not None:
            self.thread.join(timeout=10)


@contextlib.contextmanager
def serve_in_thread(app: Any, settings: Settings | None = None) -> Iterator[ThreadServer]:
    server = ThreadServer(app, settings=settings).start()
    try:
        yield server
    finally:
        server.stop()


@dataclass
class ProcessServer:
    """A server run as a child process (so a test can kill -9 it)."""

    args: list[str]
    env: Mapping[str, str]
    port: int
    health_path: str = "/health"
    proc: subprocess.Popen[bytes] | None = None
    log_path: str | None = None
    new_session: bool = False  # its own process group, as a shell job gets (for Ctrl-C)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 90.0) -> ProcessServer:
        # Generous: a cold `python -m undolog serve` takes 10-20 s on a loaded 2-core machine.
        # It returns as soon as the server answers; the deadline only bounds a hang.
        # One process unless the test asks for more (`undolog serve` defaults to one worker
        # per core on PostgreSQL): a kill -9 or a crash point must end the server, not a
        # worker that its supervisor would start again.
        env = {"UNDOLOG_WORKERS": "1", **os.environ, **self.env}
        if self.log_path:
            # The child gets its own copy of the descriptor; ours is closed at once.
            with open(self.log_path, "ab") as log:
                self.proc = subprocess.Popen(
                    self.args, env=env, stdout=log, stderr=log, start_new_session=self.new_session
                )
        else:
            self.proc = subprocess.Popen(
                self.args,
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=self.new_session,
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"server exited early with code {self.proc.returncode}: {self.args}"
                )
            if _answers(self.url + self.health_path):
                return self
            time.sleep(0.05)
        self.kill()
        raise TimeoutError(f"server did not answer within {timeout}s: {self.args}")

    def kill(self) -> None:
        """kill -9: no shutdown hooks run."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.kill()


def undolog_command(*args: str) -> list[str]:
    """The `undolog` CLI, run with this interpreter."""
    return [sys.executable, "-m", "undolog", *args]
