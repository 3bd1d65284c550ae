"""A start that cannot succeed exits non-zero with one line naming the problem; it never hangs.

Each case runs `undolog serve` as a real process under a deadline: a hang fails the test (the
process is killed), it does not stall the suite.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import sqlite3
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.servers import ProcessServer, free_port, undolog_command

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


# --- config errors: one line, exit 2, nothing written ------------------------------------


def _config_error(lines: list[str], code: int) -> str:
    """A config problem: exit 2 and exactly one line, `error: cannot start: ...`."""
    assert code == 2, "\n".join(lines)
    assert not any("Traceback" in line for line in lines), "\n".join(lines)
    errors = [line for line in lines if line.startswith("error: cannot start: ")]
    assert len(errors) == 1 and len(lines) == 1, "\n".join(lines)
    return errors[0]


def _rows(database: Path, table: str) -> int:
    with contextlib.closing(sqlite3.connect(database)) as db:
        return int(db.execute(f"SELECT count(*) FROM {table}").fetchone()[0])


@pytest.mark.parametrize("demo", [False, True], ids=["serve", "serve --demo"])
def test_a_tool_of_an_unknown_org_exits_2_and_writes_nothing(tmp_path: Path, demo: bool) -> None:
    database = tmp_path / "u.db"
    config = tmp_path / "undolog.toml"
    config.write_text(
        f'[server]\ndatabase_url = "sqlite:///{database}"\n'
        '[[orgs]]\nid = "acme"\n'
        '[[tools]]\norg = "ghost"\nname = "wipe"\ntier = "irreversible"\n',
        encoding="utf-8",
    )
    flags = ["--demo", "--demo-tools-port", str(free_port())] if demo else []
    code, lines = _serve("--config", str(config), "--port", str(free_port()), *flags)
    error = _config_error(lines, code)
    assert "'ghost'" in error and "tools[0] (wipe)" in error and str(config) in error
    assert not database.exists() or all(
        _rows(database, table) == 0 for table in ("orgs", "api_keys", "tools")
    )


def test_a_tool_of_an_org_the_database_knows_is_served(tmp_path: Path) -> None:
    """An org made earlier (`undolog keys create` makes its org) needs no [[orgs]] entry."""
    database = tmp_path / "u.db"
    made = subprocess.run(
        undolog_command("keys", "create", "--database-url", f"sqlite:///{database}",
                        "--org", "known", "--name", "ops", "--role", "admin"),
        capture_output=True, text=True, timeout=DEADLINE_SECONDS, check=False,
    )  # fmt: skip
    assert made.returncode == 0, made.stderr
    config = tmp_path / "undolog.toml"
    config.write_text(
        f'[server]\ndatabase_url = "sqlite:///{database}"\n'
        '[[tools]]\norg = "known"\nname = "wipe"\ntier = "irreversible"\n',
        encoding="utf-8",
    )
    port = free_port()
    server = ProcessServer(
        undolog_command("serve", "--config", str(config), "--port", str(port)), {}, port
    ).start()
    try:
        assert _rows(database, "tools") == 1
    finally:
        server.stop()


@pytest.mark.parametrize("busy", ["proxy", "demo tools"])
def test_serve_demo_on_a_busy_port_exits_2_before_making_a_key(tmp_path: Path, busy: str) -> None:
    database = tmp_path / "u.db"
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        taken_port = taken.getsockname()[1]
        port, tools_port = (
            (taken_port, free_port()) if busy == "proxy" else (free_port(), taken_port)
        )
        code, lines = _serve("--demo", "--database-url", f"sqlite:///{database}",
                             "--port", str(port), "--demo-tools-port", str(tools_port))  # fmt: skip
    error = _config_error(lines, code)
    assert f"127.0.0.1:{taken_port}: address already in use" in error
    assert not database.exists()  # no demo org, no key


def test_a_missing_mcp_command_is_named(tmp_path: Path) -> None:
    database = tmp_path / "u.db"
    config = tmp_path / "undolog.toml"
    config.write_text(
        f'[server]\ndatabase_url = "sqlite:///{database}"\n'
        '[[mcp.upstreams]]\nname = "memory"\ntransport = "stdio"\n'
        'command = "undolog-no-such-mcp-server"\n',
        encoding="utf-8",
    )
    code, lines = _serve("--config", str(config), "--port", str(free_port()))
    error = _config_error(lines, code)
    assert "'undolog-no-such-mcp-server'" in error and "'memory'" in error
    assert not database.exists()


# --- a start that works: the hint without an org, JSON logs ------------------------------


def test_serve_without_an_org_says_how_to_add_one_and_logs_json_lines(tmp_path: Path) -> None:
    port = free_port()
    log = tmp_path / "serve.log"
    command = undolog_command(
        "serve", "--database-url", f"sqlite:///{tmp_path / 'u.db'}", "--port", str(port)
    )
    server = ProcessServer(command, {"UNDOLOG_LOG_LEVEL": "info"}, port, log_path=str(log))
    server.start()
    server.stop()
    lines = [line for line in log.read_text(encoding="utf-8").splitlines() if line.strip()]
    hints = [line for line in lines if line.startswith("note: ")]
    assert len(hints) == 1 and "[[orgs]]" in hints[0] and "--demo" in hints[0], lines
    logs = [json.loads(line) for line in lines if line not in hints]
    events = [entry["event"] for entry in logs]
    assert any(f"127.0.0.1:{port}" in event for event in events), events  # "Uvicorn running"
    assert all(entry["level"] in ("info", "warning") for entry in logs), logs
    assert all("timestamp" in entry for entry in logs), logs


def test_an_unwritable_spool_exits_2_naming_it(tmp_path: Path) -> None:
    """Results held while the store is away go to the spool: a proxy that could not write
    them down does not start (a folder under a regular file cannot be made, even by root)."""
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("x", encoding="utf-8")
    spool = blocker / "spool"
    database = tmp_path / "u.db"
    code, lines = _serve(
        "--database-url", f"sqlite:///{database}", "--port", str(free_port()),
        "--spool-dir", str(spool),
    )  # fmt: skip
    error = _config_error(lines, code)
    assert str(spool) in error and "--spool-dir" in error
    assert not database.exists()
