"""The `undolog` command: serve, migrate, demo-tools.

Every `serve` flag maps 1:1 to a setting and to an `UNDOLOG_*` env var (see `config.py`);
flags win over env vars, which win over the TOML file named by `--config`.
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Coroutine
from typing import Any

import typer
import uvicorn

from undolog.config import DEFAULT_HOST, Settings, hash_api_key, load_settings

app = typer.Typer(add_completion=False, help="UndoLog: exactly-once, undoable, gated tool calls.")

DEMO_ORG = "demo"
DEMO_TOOLS_PORT = 8090


def _run(main: Coroutine[Any, Any, None]) -> None:
    """Run a server coroutine on uvloop when it is installed (as uvicorn itself would)."""
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvicorn[standard] brings it
        asyncio.run(main)
        return
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(main)


def _settings(**flags: Any) -> Settings:
    try:
        return load_settings(flags)
    except ValueError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None


@app.command()
def serve(
    database_url: str = typer.Option(
        None,
        help="sqlite:///path.db or postgresql://... "
        "(env UNDOLOG_DATABASE_URL; default sqlite:///./undolog.db)",
    ),
    host: str = typer.Option(None, help="Address to bind (env UNDOLOG_HOST; default 127.0.0.1)"),
    port: int = typer.Option(None, help="Port (env UNDOLOG_PORT; default 8080)"),
    upstream_url: str = typer.Option(None, help="Tool server base URL (env UNDOLOG_UPSTREAM_URL)"),
    upstream_timeout_seconds: float = typer.Option(None, help="Upstream call timeout"),
    lease_seconds: float = typer.Option(None, help="Execution lease before a call is in doubt"),
    lock_max_attempts: int = typer.Option(None, help="Advisory lock attempts (PostgreSQL)"),
    lock_retry_ms: int = typer.Option(None, help="Delay between advisory lock attempts"),
    max_body_bytes: int = typer.Option(None, help="Largest request body accepted"),
    retry_after_seconds: int = typer.Option(None, help="retry_after hint for waiting calls"),
    approval_sweep_seconds: float = typer.Option(
        None, help="How often expired approvals are swept (env UNDOLOG_APPROVAL_SWEEP_SECONDS)"
    ),
    commit_retry_attempts: int = typer.Option(
        None, help="Attempts of Commit/Fail on transient store errors"
    ),
    commit_retry_backoff_ms: int = typer.Option(
        None, help="First backoff between Commit/Fail attempts (doubles)"
    ),
    log_level: str = typer.Option(None, help="debug, info, warning, error"),
    ui_secret: str = typer.Option(
        None,
        help="Secret that signs dashboard sessions (env UNDOLOG_UI_SECRET; "
        "default: random per process, so a restart signs everyone out)",
    ),
    metrics_token: str = typer.Option(
        None,
        help="Serve /metrics on the main port to `Authorization: Bearer <token>` "
        "(env UNDOLOG_METRICS_TOKEN; default: /metrics not served there)",
    ),
    metrics_host: str = typer.Option(
        None, help="Address of the separate /metrics listener (default 127.0.0.1)"
    ),
    metrics_port: int = typer.Option(
        None, help="Port of a separate /metrics listener without auth (env UNDOLOG_METRICS_PORT)"
    ),
    allowed_origins: str = typer.Option(
        None,
        help="Comma-separated origins of the dashboard, e.g. https://undolog.example.com "
        "(env UNDOLOG_ALLOWED_ORIGINS; default: http://{host}:{port}, localhost, 127.0.0.1)",
    ),
    auth_failure_limit: int = typer.Option(
        None, help="Failed key checks / sign-ins per client address per window before 429"
    ),
    auth_failure_window_seconds: float = typer.Option(
        None, help="The window of --auth-failure-limit, in seconds (default 60)"
    ),
    config: str = typer.Option(None, help="TOML config file (env UNDOLOG_CONFIG)"),
    demo: bool = typer.Option(False, help="Also run the demo tool server and a demo org"),
    demo_tools_port: int = typer.Option(DEMO_TOOLS_PORT, help="Port of the demo tool server"),
) -> None:
    """Run the proxy and engine in one process (SQLite by default)."""
    flags = {k: v for k, v in locals().items() if k not in ("demo", "demo_tools_port")}
    if demo and upstream_url is None:
        flags["upstream_url"] = f"http://127.0.0.1:{demo_tools_port}"
    settings = _settings(**flags)
    _run(_serve(settings, demo=demo, demo_tools_port=demo_tools_port))


async def _serve(settings: Settings, *, demo: bool, demo_tools_port: int) -> None:
    from undolog.logs import configure_logging
    from undolog.proxy import create_app

    configure_logging(settings.log_level)
    tasks = []
    if demo:
        from undolog.demo.tools import run_demo_tools

        await _seed_demo(settings)
        tasks.append(asyncio.create_task(run_demo_tools(DEFAULT_HOST, demo_tools_port)))
    config = uvicorn.Config(
        create_app(settings),
        host=settings.host,
        port=settings.port,
        log_level=settings.log_level,
        access_log=False,
        lifespan="on",
    )
    server = uvicorn.Server(config)
    try:
        await server.serve()
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def _seed_demo(settings: Settings) -> None:
    """Create the demo org with a fresh API key and the demo tools; print how to use them."""
    from undolog.demo.catalog import DEMO_TOOLS
    from undolog.engine import Engine
    from undolog.store import open_store

    key = "ul_demo_" + secrets.token_urlsafe(24)
    store = await open_store(settings.database_url)
    try:
        await store.migrate()
        engine = Engine(store)
        await engine.ensure_org(DEMO_ORG, name="Demo", api_key_hashes=(hash_api_key(key),))
        for name, spec in DEMO_TOOLS.items():
            await engine.register_tool(DEMO_ORG, name, **spec)
    finally:
        await store.close()
    base = f"http://{settings.host}:{settings.port}"
    typer.echo(
        f"UndoLog demo\n  proxy:     {base}\n  dashboard: {base}/ui\n"
        f"  org:       {DEMO_ORG}\n  API key:   {key}\n"
        f"  try:       curl -s {base}/mcp/tool_call -H 'X-Api-Key: {key}' "
        "-H 'Content-Type: application/json' -d '{\"session_id\": "
        '"7f9c2a4e-1b7d-4c8e-9a51-0d3f6b2e8c10", "tool_name": "send_email", '
        '"step_index": 1, "args": {"to": "ada@example.com", "subject": "hi"}}\''
    )


@app.command()
def migrate(
    database_url: str = typer.Option(None, help="(env UNDOLOG_DATABASE_URL)"),
    config: str = typer.Option(None, help="TOML config file"),
) -> None:
    """Create or upgrade the schema."""
    settings = _settings(database_url=database_url, config=config)

    async def run() -> int:
        from undolog.store import open_store

        store = await open_store(settings.database_url)
        try:
            return await store.migrate()
        finally:
            await store.close()

    version = asyncio.run(run())
    typer.echo(f"schema at version {version} ({settings.database_url.split('://')[0]})")


@app.command("demo-tools")
def demo_tools(
    host: str = typer.Option(DEFAULT_HOST, help="Address to bind"),
    port: int = typer.Option(DEMO_TOOLS_PORT, help="Port"),
) -> None:
    """Run the demo tool server (the upstream of the demo and the tests)."""
    from undolog.demo.tools import run_demo_tools

    _run(run_demo_tools(host, port))


@app.command()
def demo(
    url: str = typer.Option(None, "--url", help="Run against this proxy instead of a private one"),
    api_key: str = typer.Option(None, "--api-key", help="API key for --url"),
) -> None:
    """A scripted agent session: calls, a replay, an approval wait, a failure, a rollback."""
    from undolog.demo.scenario import demo_main

    view = asyncio.run(demo_main(url, api_key, typer.echo))
    if view["state"] != "compensated":
        raise typer.Exit(1)


def _add_operator_commands() -> None:
    from undolog.cli_ops import approvals_app, sessions_app, undo_app

    app.add_typer(approvals_app, name="approvals")
    app.add_typer(sessions_app, name="sessions")
    app.add_typer(undo_app, name="undo")


_add_operator_commands()


def main() -> None:
    app()
