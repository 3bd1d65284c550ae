"""A start that cannot succeed exits non-zero with one line naming the problem; it never hangs.

Each case runs `undolog serve` as a real process under a deadline: a hang fails the test (the
process is killed), it does not stall the suite.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.servers import free_port, undolog_command

DEADLINE_SECONDS = 40.0  # far above a failed start (a few seconds), far below "hangs"


def _serve(*args: str, wrap: list[str] | None = None) -> tuple[int, list[str]]:
    """Run `undolog serve ARGS` until it exits; return its code and its non-empty output lines."""
    command = [*(wrap or []), *undolog_command("serve", *args)]
    env = {**os.environ, "UNDOLOG_LOG_LEVEL": "info"}
    try:
        done = subprocess.run(
            command, env=env, capture_output=True, text=True, timeout=DEADLINE_SECONDS
        )
    except subprocess.TimeoutExpired as exc:  # run() has killed it
        output = exc.stderr or b""
        text = output.decode() if isinstance(output, bytes) else output
        pytest.fail(f"`undolog serve` hung (killed after {DEADLINE_SECONDS}s):\n{text[-2000:]}")
    lines = [line for line in (done.stdout + done.stderr).splitlines() if line.strip()]
    return done.returncode, lines


def _the_error(lines: list[str]) -> str:
    """The one line that says why; no traceback."""
    assert not any("Traceback" in line for line in lines), "\n".join(lines)
    errors = [line for line in lines if "cannot start" in line or "error while attempting" in line]
    assert len(errors) == 1, "\n".join(lines)
    return errors[0]


def test_sqlite_on_a_read_only_filesystem_exits(tmp_path: Path) -> None:
    unshare = shutil.which("unshare")
    if unshare is None:
        pytest.skip("needs unshare(1) to mount a read-only filesystem")
    folder = tmp_path / "ro"
    folder.mkdir()
    database = folder / "undolog.db"
    subprocess.run(
        undolog_command("migrate", "--database-url", f"sqlite:///{database}"),
        check=True,
        capture_output=True,
        timeout=DEADLINE_SECONDS,
    )
    # A private mount namespace where the folder is bind-mounted read-only: the database file
    # exists and opens, but cannot be read in WAL mode (its -shm cannot be created).
    probe = subprocess.run(
        [unshare, "--mount", "--map-root-user", "true"], capture_output=True, check=False
    )
    if probe.returncode != 0:
        pytest.skip("unshare cannot create a mount namespace here")
    remount = f'mount --bind {folder} {folder} && mount -o remount,bind,ro {folder} && exec "$@"'
    wrap = [unshare, "--mount", "--map-root-user", "sh", "-c", remount, "sh"]
    code, lines = _serve(
        "--database-url", f"sqlite:///{database}", "--port", str(free_port()), wrap=wrap
    )
    assert code != 0
    error = _the_error(lines)
    assert str(database) in error and "unable to open database file" in error


def test_sqlite_path_under_a_regular_file_exits(tmp_path: Path) -> None:
    not_a_folder = tmp_path / "file"
    not_a_folder.write_text("")
    code, lines = _serve(
        "--database-url", f"sqlite:///{not_a_folder}/undolog.db", "--port", str(free_port())
    )
    assert code != 0
    assert "cannot open SQLite database" in _the_error(lines)


def test_postgres_refusing_connections_exits() -> None:
    closed = free_port()  # nothing listens there
    code, lines = _serve(
        "--database-url",
        f"postgresql://postgres@127.0.0.1:{closed}/test",
        "--port",
        str(free_port()),
    )
    assert code != 0
    assert "cannot connect to PostgreSQL" in _the_error(lines)


@contextlib.contextmanager
def _silent_listener() -> Iterator[int]:
    """A port that accepts connections and never says a word (a black-holed database)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(16)
        yield int(listener.getsockname()[1])


def test_postgres_that_never_answers_exits_after_the_connect_timeout() -> None:
    with _silent_listener() as port:
        code, lines = _serve(
            "--database-url",
            f"postgresql://postgres@127.0.0.1:{port}/test",
            "--port",
            str(free_port()),
        )
    assert code != 0
    assert "cannot connect to PostgreSQL" in _the_error(lines)


def test_a_busy_port_exits(tmp_path: Path) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        code, lines = _serve(
            "--database-url", f"sqlite:///{tmp_path / 'u.db'}", "--port", str(port)
        )
    assert code != 0
    assert "address already in use" in _the_error(lines)
