"""The `undolog` console script's launcher.

The default install of the `undolog` distribution is the agent SDK alone; the server (this
package's CLI, proxy and engine) is the `undolog[server]` extra and needs Python 3.11. So the
launcher imports nothing of the server before checking both, and says in one line what to do
instead of a traceback. This module must stay importable on Python 3.10.
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


def main() -> None:
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
            f"error: the UndoLog server is not installed (no module {missing!r}): {INSTALL_HINT}",
            file=sys.stderr,
        )
        raise SystemExit(2)
    from undolog.cli import main as cli_main

    cli_main()
