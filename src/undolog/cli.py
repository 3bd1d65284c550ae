"""The `undolog` command: serve, migrate, demo-tools.

Every `serve` flag maps 1:1 to a setting and to an `UNDOLOG_*` env var (see `config.py`);
flags win over env vars, which win over the TOML file named by `--config`.
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Coroutine
from typing import Any

import orjson
import typer

import undolog
from undolog.config import DEFAULT_HOST, Settings, load_settings
from undolog.loop import run_on_uvloop
from undolog.supervisor import StartFailed, worker_count
from undolog_sdk.errors import UndoLogError
from undolog_sdk.wire import SessionState

app = typer.Typer(add_completion=False, help="UndoLog: exactly-once, undoable, gated tool calls.")

DEMO_ORG = "demo"
DEMO_TOOLS_PORT = 8090
NO_ORG_HINT = (
    "note: the config names no org, so only keys of orgs already in the database work: add an "
    "[[orgs]] table with [[orgs.keys]] to a config file (--config undolog.toml; see the "
    'README\'s "Running it"), or try `undolog serve --demo`'
)


def _print_version(value: bool) -> None:
    if value:
        typer.echo(f"undolog {undolog.__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(
        False, "--version", callback=_print_version, is_eager=True, help="Print the version"
    ),
) -> None:
    """UndoLog: exactly-once, undoable, gated tool calls."""


def _run(main: Coroutine[Any, Any, Any]) -> Any:
    """Run a server coroutine on uvloop when it is installed (as uvicorn itself would)."""
    return run_on_uvloop(main)


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
    upstream_url: str = typer.Option(
        None,
        help="Base URL of the tool server named 'default' (env UNDOLOG_UPSTREAM_URL; "
        "its signing secret: env UNDOLOG_UPSTREAM_SECRET)",
    ),
    upstream_timeout_seconds: float = typer.Option(None, help="Upstream call timeout"),
    lease_seconds: float = typer.Option(None, help="Execution lease before a call is in doubt"),
    lock_max_attempts: int = typer.Option(None, help="Advisory lock attempts (PostgreSQL)"),
    lock_retry_ms: int = typer.Option(None, help="Delay between advisory lock attempts"),
    db_pool_size: int = typer.Option(
        None, help="PostgreSQL connections per process, at most (default 20; docs/deploy.md)"
    ),
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
    max_header_bytes: int = typer.Option(
        None, help="Largest request head (request line + headers); above: 431 and close"
    ),
    header_timeout_seconds: float = typer.Option(
        None, help="Time allowed to send a request's headers; then the connection closes"
    ),
    keep_alive_timeout_seconds: float = typer.Option(
        None, help="Idle time allowed between requests on one connection"
    ),
    max_connections: int = typer.Option(
        None, help="Connections open at once; above: 503 and close"
    ),
    body_timeout_seconds: float = typer.Option(
        None, help="Time allowed to send a request's body (plus what its rate earns; default 10)"
    ),
    min_body_bytes_per_second: int = typer.Option(
        None, help="Slowest average body rate accepted past --body-timeout-seconds (default 1024)"
    ),
    max_connections_per_client: int = typer.Option(
        None, help="Connections per client address without a valid key yet (default 256)"
    ),
    reserved_connections: int = typer.Option(
        None, help="Part of --max-connections kept for connections with a valid key (default 256)"
    ),
    forwarded_allow_ips: str = typer.Option(
        None,
        help="Comma-separated addresses/networks of reverse proxies whose X-Forwarded-For and "
        "X-Forwarded-Proto are trusted (env UNDOLOG_FORWARDED_ALLOW_IPS; default: none)",
    ),
    ready_timeout_seconds: float = typer.Option(
        None, help="Time the store has to answer GET /ready"
    ),
    lease_sweep_seconds: float = typer.Option(
        None, help="How often executing calls whose lease expired are moved to in_doubt"
    ),
    retention_sweep_seconds: float = typer.Option(
        None, help="How often finished sessions past their org's retention_days are pruned"
    ),
    retention_batch_size: int = typer.Option(
        None, help="Sessions pruned per transaction by the retention sweep (default 200)"
    ),
    spool_dir: str = typer.Option(
        None, help="Where results that could not be committed are kept (env UNDOLOG_SPOOL_DIR)"
    ),
    log_level: str = typer.Option(None, help="debug, info, warning, error"),
    migrate: bool = typer.Option(
        None,
        "--migrate/--no-migrate",
        help="Apply pending migrations at start (env UNDOLOG_MIGRATE; default on). Off: only "
        "`undolog migrate` does, and an older schema is refused (docs/deploy.md)",
    ),
    ssl_certfile: str = typer.Option(
        None, help="PEM certificate (chain): serve HTTPS on --port (env UNDOLOG_SSL_CERTFILE)"
    ),
    ssl_keyfile: str = typer.Option(
        None, help="PEM private key of --ssl-certfile (env UNDOLOG_SSL_KEYFILE)"
    ),
    workers: int = typer.Option(
        None,
        help="Processes serving the port (env UNDOLOG_WORKERS; default: one per core on "
        "PostgreSQL, 1 on SQLite, which allows no more); see docs/deploy.md",
    ),
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
    key_calls_per_second: float = typer.Option(
        None, help="Tool calls per API key per second, sustained, then 429 (default 50)"
    ),
    key_call_burst: int = typer.Option(
        None, help="Tool calls per API key at once, over --key-calls-per-second (default 200)"
    ),
    key_sessions_per_minute: int = typer.Option(
        None, help="New sessions per API key per minute, then 429 (default 120)"
    ),
    key_event_streams: int = typer.Option(
        None, help="Event streams (GET /events) open at once per API key (default 10)"
    ),
    dashboard_url: str = typer.Option(
        None, help="Base URL of the dashboard in webhook messages (default http://{host}:{port})"
    ),
    webhook_timeout_seconds: float = typer.Option(None, help="Per webhook attempt (default 5)"),
    webhook_max_attempts: int = typer.Option(None, help="Before a delivery is dead (default 10)"),
    webhook_backoff_seconds: float = typer.Option(None, help="First retry delay (default 1)"),
    webhook_backoff_max_seconds: float = typer.Option(None, help="Retry delay cap (default 300)"),
    allow_self_approval: bool = typer.Option(
        None,
        "--allow-self-approval/--no-allow-self-approval",
        help="Let the key that made a call approve it, when one approver suffices: for a "
        "single-person setup (env UNDOLOG_ALLOW_SELF_APPROVAL; default off)",
    ),
    config: str = typer.Option(None, help="TOML config file (env UNDOLOG_CONFIG)"),
    demo: bool = typer.Option(False, help="Also run the demo tool server and a demo org"),
    demo_tools_port: int = typer.Option(DEMO_TOOLS_PORT, help="Port of the demo tool server"),
) -> None:
    """Run the proxy and engine in one process (SQLite by default)."""
    flags = {k: v for k, v in locals().items() if k not in ("demo", "demo_tools_port")}
    demo_secret = None
    if demo and upstream_url is None:
        flags["upstream_url"] = f"http://127.0.0.1:{demo_tools_port}"
        # The demo tool server and the proxy share a fresh secret, so the demo's calls are
        # signed and verified as a real deployment's should be.
        demo_secret = secrets.token_urlsafe(32)
        flags["upstream_secret"] = demo_secret
    settings = _settings(**flags)
    if demo:  # the demo tools at /mcp too, with their tiers (docs/mcp.md, "The demo at /mcp")
        import dataclasses

        from undolog.demo.catalog import with_demo_mcp_tools

        mcp = with_demo_mcp_tools(settings.mcp, DEMO_ORG)
        settings = dataclasses.replace(settings, mcp=mcp)
    try:
        count = worker_count(settings)
    except ValueError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    # Every problem the config can be checked for is found before anything is written (no
    # demo key, no org, no tool): one line, exit 2.
    from undolog.preflight import StartProblem, check_start

    try:
        asyncio.run(check_start(settings, demo_org=DEMO_ORG if demo else None,
                                demo_tools_port=demo_tools_port if demo else None))  # fmt: skip
    except StartProblem as exc:
        typer.echo(f"error: cannot start: {exc}", err=True)
        raise typer.Exit(2) from None
    if not demo and not settings.orgs:
        typer.echo(NO_ORG_HINT, err=True)
    code = _run(
        _serve(settings, demo=demo, demo_tools_port=demo_tools_port, demo_secret=demo_secret,
               workers=count)
    )  # fmt: skip
    if code:
        raise typer.Exit(code)


async def _serve(
    settings: Settings,
    *,
    demo: bool,
    demo_tools_port: int,
    demo_secret: str | None = None,
    workers: int = 1,
) -> int:
    """Serve until stopped (in this process, or as the supervisor of `workers` processes);
    returns the exit code."""
    from undolog.logs import configure_logging
    from undolog.proxy import create_app
    from undolog.proxy.server import build_server

    configure_logging(settings.log_level)
    tasks = []
    if demo:
        from undolog.demo.tools import run_demo_tools

        try:
            await _seed_demo(settings)
        except UndoLogError as exc:
            typer.echo(f"error: cannot start: {exc}", err=True)
            raise typer.Exit(1) from None
        tasks.append(
            # The demo's own tool server: its inspection routes are part of the demo.
            asyncio.create_task(
                run_demo_tools(DEFAULT_HOST, demo_tools_port, secret=demo_secret, inspect=True)
            )
        )
    try:
        if workers > 1:
            from undolog.supervisor import supervise

            try:
                return await supervise(settings, workers)
            except StartFailed as exc:
                typer.echo(f"error: cannot start: {exc}", err=True)
                return 1
        from undolog.telemetry import exporting_spans

        with exporting_spans():  # OTEL_EXPORTER_OTLP_* (each worker sets up its own)
            await build_server(create_app(settings), settings).serve()
        return 0
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def _seed_demo(settings: Settings) -> None:
    """Create the demo org and tools, revoke the previous demo keys and make three new ones:
    an agent key (the agent's calls), an approver key (a person: the dashboard, approvals,
    rollbacks) and an admin key (an operator's repairs); print how to use them."""
    from undolog.demo.catalog import DEMO_TOOLS, EXAMPLE_TOOLS
    from undolog.engine import Engine
    from undolog.engine.keys import Keys, KeySource
    from undolog.store import open_store

    store = await open_store(settings.database_url)
    try:
        await store.migrate()
        engine = Engine(store)
        await engine.ensure_org(DEMO_ORG, name="Demo")
        for name, spec in {**DEMO_TOOLS, **EXAMPLE_TOOLS}.items():
            await engine.register_tool(DEMO_ORG, name, **spec)
        keys = Keys(store)
        await keys.revoke_source(KeySource.DEMO, DEMO_ORG)
        agent, _ = await keys.create(DEMO_ORG, "demo-agent", "agent", KeySource.DEMO)
        approver, _ = await keys.create(DEMO_ORG, "demo-approver", "approver", KeySource.DEMO)
        admin, _ = await keys.create(DEMO_ORG, "demo-admin", "admin", KeySource.DEMO)
    finally:
        await store.close()
    typer.echo(demo_banner(f"http://{settings.host}:{settings.port}", agent, approver, admin))


def demo_banner(base: str, agent: str, approver: str, admin: str) -> str:
    """What `serve --demo` prints: the keys, and for each documented command the key it needs
    (README, "Run the product"): the agent's shell gets the agent key, a person's the
    approver key (the CLI's approvals and sessions commands), an operator adds the admin key."""
    return (
        f"UndoLog demo\n  proxy:     {base}\n  dashboard: {base}/ui\n"
        f"  mcp:       {base}/mcp   (the demo tools, with the agent key as X-Api-Key)\n"
        f"  org:       {DEMO_ORG}\n"
        f"  agent key:    {agent}   (the agent: tool calls, the SDK, /mcp, mcp-stdio)\n"
        f"  approver key: {approver}   (a person: the dashboard, approvals, rollback)\n"
        f"  admin key:    {admin}   (an operator: `undolog undo retry|resolve`)\n"
        "  (the previous demo keys no longer work)\n"
        "  in the agent's shell (the SDK, `undolog mcp-stdio`), the agent key:\n"
        f"    export UNDOLOG_PROXY_URL={base}\n"
        f"    export UNDOLOG_API_KEY={agent}\n"
        "  in a person's shell (`undolog approvals`, `undolog sessions`), the approver key:\n"
        f"    export UNDOLOG_PROXY_URL={base}\n"
        f"    export UNDOLOG_API_KEY={approver}\n"
        f"  an operator's repairs: undolog undo retry|resolve ENTRY --api-key {admin}\n"
        f"  try:       curl -s {base}/mcp/tool_call -H 'X-Api-Key: {agent}' "
        "-H 'Content-Type: application/json' -d '{\"session_id\": "
        '"7f9c2a4e-1b7d-4c8e-9a51-0d3f6b2e8c10", "tool_name": "send_email", '
        '"step_index": 1, "args": {"to": "ada@example.com", "subject": "hi"}}\''
    )


@app.command()
def migrate(
    database_url: str = typer.Option(None, help="(env UNDOLOG_DATABASE_URL)"),
    config: str = typer.Option(None, help="TOML config file"),
    as_json: bool = typer.Option(False, "--json", help="Print JSON"),
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
    database = settings.database_url.split("://")[0]
    if as_json:
        typer.echo(orjson.dumps({"schema_version": version, "database": database}).decode())
        return
    typer.echo(f"schema at version {version} ({database})")


@app.command("demo-tools")
def demo_tools(
    host: str = typer.Option(DEFAULT_HOST, help="Address to bind"),
    port: int = typer.Option(DEMO_TOOLS_PORT, help="Port"),
    secret: str = typer.Option(
        None,
        envvar="UNDOLOG_DEMO_TOOLS_SECRET",
        help="Upstream secret: answer 401 to calls whose X-UndoLog-Signature does not verify "
        "(env UNDOLOG_DEMO_TOOLS_SECRET; default: trust X-UndoLog-Org as sent)",
    ),
    inspect: bool = typer.Option(
        False,
        "--inspect",
        envvar="UNDOLOG_DEMO_TOOLS_INSPECT",
        help="Also serve the unauthenticated inspection routes (/counters, /state, /calls, "
        "PUT /balances, POST /reset) that show and change every org's state "
        "(env UNDOLOG_DEMO_TOOLS_INSPECT; default: off)",
    ),
) -> None:
    """Run the demo tool server (the upstream of the demo and the tests)."""
    from undolog.demo.tools import run_demo_tools

    _run(run_demo_tools(host, port, secret=secret, inspect=inspect))


@app.command("mcp-stdio")
def mcp_stdio(
    url: str = typer.Option(
        "http://localhost:8080",
        "--url",
        envvar="UNDOLOG_PROXY_URL",
        help="The proxy's base URL (env UNDOLOG_PROXY_URL)",
    ),
    api_key: str = typer.Option(
        None, "--api-key", envvar="UNDOLOG_API_KEY", help="An agent key (env UNDOLOG_API_KEY)"
    ),
    session_id: str = typer.Option(
        None,
        "--session-id",
        envvar="UNDOLOG_SESSION_ID",
        help="The UndoLog session of every call (default: a new one per start)",
    ),
) -> None:
    """Speak MCP over stdio to a desktop client, forwarding to the proxy's /mcp gateway."""
    import uuid

    from undolog.mcp.stdio import new_session_id, run_bridge

    if not api_key:
        typer.echo("error: an API key is needed (--api-key or UNDOLOG_API_KEY)", err=True)
        raise typer.Exit(2)
    if session_id is not None:
        try:
            session_id = str(uuid.UUID(session_id))
        except ValueError:
            typer.echo(f"error: --session-id {session_id!r} is not a UUID", err=True)
            raise typer.Exit(2) from None
    try:
        asyncio.run(run_bridge(url, api_key, session_id or new_session_id()))
    except KeyboardInterrupt:
        pass
    except Exception as exc:  # one line on stderr: stdout belongs to the protocol
        typer.echo(f"error: cannot serve the UndoLog gateway at {url}: {_reason(exc)}", err=True)
        raise typer.Exit(2) from None


def _reason(exc: BaseException) -> str:
    """The innermost cause of a failure inside task groups, as one short line."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    text = str(exc).splitlines()[0] if str(exc) else ""
    if type(exc).__name__ == "MCPError" and text:
        return text  # the gateway's own words ("the API key is invalid or revoked: ...")
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


@app.command()
def demo(
    url: str = typer.Option(None, "--url", help="Run against this proxy instead of a private one"),
    api_key: str = typer.Option(None, "--api-key", help="API key for --url"),
) -> None:
    """A scripted agent session: calls, a replay, an approval wait, a failure, a rollback."""
    from undolog.demo.scenario import demo_main

    view = asyncio.run(demo_main(url, api_key, typer.echo))
    if view["state"] != SessionState.COMPENSATED:
        raise typer.Exit(1)


def _client_command(name: str, help_text: str) -> None:
    """List a client command of `cli_ops` here and hand it its arguments untouched: it is
    written once, with argparse and httpx only, so it also runs without the server extra."""
    from undolog import cli_ops

    settings = {"allow_extra_args": True, "ignore_unknown_options": True}

    def forward(ctx: typer.Context) -> None:
        raise typer.Exit(cli_ops.main([name, *ctx.args]))

    app.command(name, help=help_text, context_settings=settings, add_help_option=False)(forward)


def _add_operator_commands() -> None:
    from undolog.cli_audit import audit_app
    from undolog.cli_keys import keys_app
    from undolog.cli_ops import COMMANDS
    from undolog.cli_retention import prune

    app.add_typer(keys_app, name="keys")
    for name, help_text in COMMANDS.items():
        _client_command(name, help_text)
    app.command("prune")(prune)
    app.add_typer(audit_app, name="audit")


_add_operator_commands()


def main() -> None:
    app()
