"""The `undolog` console script's launcher.

The default install of the `undolog` distribution is the agent SDK alone; the server (this
package's CLI, proxy and engine) is the `undolog[server]` extra and needs Python 3.11. So the
launcher imports nothing of the server before checking both, and says in one line what to do
instead of a traceback. This module must stay importable on Python 3.10.

The client commands (`--version`, `sessions`, `approvals`, `undo`, `effects`: they talk to a
running proxy) need only httpx, so they run from `undolog.cli_ops` in every install, on
Python 3.10 too, without loading the server's CLI.
"""

from __future__ import annotations

import importlib.util
import sys

__all__ = ["main", "missing_server_dependency"]

MIN_SERVER_PYTHON = (3, 11)
INSTALL_HINT = "pip install 'undolog[server]'"
# One module per server dependency the CLI cannot start without (import names).
SERVER_MODULES = (
    "fastapi",
    "starlette",
    "uvicorn",
    "aiohttp",
    "yarl",
    "aiosqlite",
    "asyncpg",
    "orjson",
    "prometheus_client",
    "sse_starlette",
    "typer",
    "structlog",
    "mcp",
)


def missing_server_dependency() -> str | None:
    """The first server dependency that is not installed, or None."""
    for name in SERVER_MODULES:
        if importlib.util.find_spec(name) is None:
            return name
    return None


def _client_command(argv: list[str]) -> bool:
    """Whether `argv` (without the program) is a client command, served by `cli_ops`."""
    from undolog.cli_ops import COMMANDS

    first = argv[0] if argv else ""
    return first == "--version" or first in COMMANDS


def main() -> None:
    if _client_command(sys.argv[1:]):
        from undolog.cli_ops import main as client_main

        raise SystemExit(client_main(sys.argv[1:]))
    if sys.version_info < MIN_SERVER_PYTHON:
        found = ".".join(str(n) for n in sys.version_info[:2])
        print(
            f"error: the UndoLog server needs Python 3.11 or newer (this is {found}); "
            "the SDK (import undolog_sdk) works here",
            file=sys.stderr,
        )
        raise SystemExit(2)
    missing = missing_server_dependency()
    if missing is not None:
        print(
            f"error: the UndoLog server is not installed (no module {missing!r}): {INSTALL_HINT} "
            "(here: --version, sessions, approvals, undo, effects)",
            file=sys.stderr,
        )
        raise SystemExit(2)
    from undolog.cli import main as cli_main

    cli_main()
