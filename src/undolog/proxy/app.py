"""Builds the proxy's ASGI app from settings: store, engine, executor, routes, edge."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import structlog
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import Response
from starlette.routing import Route

import undolog
from undolog.config import Settings
from undolog.engine import Engine
from undolog.engine.approvals import Approvals
from undolog.engine.keys import KeyGrant, Keys, Role
from undolog.engine.saga import Saga
from undolog.proxy.approvals import router as approvals_router
from undolog.proxy.approvals import sweep_forever
from undolog.proxy.delivery import Deliveries
from undolog.proxy.edge import Edge, KeyResolver
from undolog.proxy.events import EventBroker
from undolog.proxy.events import router as events_router
from undolog.proxy.executor import ToolExecutor
from undolog.proxy.held import HeldResults
from undolog.proxy.lease import LeaseKeeper, sweep_leases_forever
from undolog.proxy.metrics import ProxyMetrics
from undolog.proxy.metrics_listener import MetricsListener
from undolog.proxy.overview import router as overview_router
from undolog.proxy.ratelimit import FailureLimiter
from undolog.proxy.ready import router as ready_router
from undolog.proxy.routes import router
from undolog.proxy.toolcall import tool_call
from undolog.proxy.ui_auth import SessionTokens, UiSessions
from undolog.proxy.ui_auth import router as ui_auth_router
from undolog.proxy.undo import router as undo_router
from undolog.proxy.wire import error_body, internal_error_message, json_response
from undolog.store import Store, open_store
from undolog.store.records import KeyRecord
from undolog.ui import mount_ui
from undolog.upstreams import UpstreamRegistry
from undolog_sdk.tier import ToolTier

__all__ = ["Runtime", "create_app", "open_runtime", "upstream_registry"]

_TOOL_CALL_BODY = {
    "required": True,
    "content": {
        "application/json": {
            "schema": {
                "type": "object",
                "required": ["session_id", "tool_name", "args"],
                "properties": {
                    "session_id": {"type": "string", "format": "uuid"},
                    "tool_name": {"type": "string"},
                    "tool_version": {"type": "string"},
                    "step_index": {"type": "integer", "minimum": 0, "maximum": 4294967295},
                    "args": {"type": "object"},
                    "mode": {"enum": ["proxy", "sdk"], "default": "proxy"},
                },
            }
        }
    },
}

_STATUS_CODES = {400: "invalid_request", 404: "not_found", 405: "method_not_allowed"}


@dataclass
class Runtime:
    """Everything a request handler needs, built once per app."""

    store: Store
    engine: Engine
    saga: Saga
    approvals: Approvals
    broker: EventBroker
    executor: ToolExecutor
    metrics: ProxyMetrics
    deliveries: Deliveries
    leases: LeaseKeeper
    held: HeldResults
    retry_after_seconds: int
    commit_retry_attempts: int
    commit_retry_backoff_ms: int
    log: Any
    keys: Keys
    # Tools whose tier the operator's config sets: (org, tool name) → "config", and the MCP
    # gateway's upstream prefixes ("git." ...) for every org. The API cannot change them.
    config_tools: dict[tuple[str, str], str] = dataclasses.field(default_factory=dict)
    gateway_prefixes: tuple[str, ...] = ()

    def config_owner(self, org_id: str, tool_name: str) -> str | None:
        """Who sets this tool's tier, if not the API: `config` ([[tools]]) or `mcp`."""
        if (org_id, tool_name) in self.config_tools:
            return "config"
        if tool_name.startswith(self.gateway_prefixes):
            return "mcp"
        return None


def config_key_grants(settings: Settings) -> list[KeyGrant]:
    """Every key the config lists: the legacy unnamed ones (role `agent`, a generated name)
    and the named `[[orgs.keys]]`."""
    grants = []
    for org in settings.orgs:
        grants += [
            KeyGrant(org.org_id, h, f"{org.org_id}-legacy-{h[:8]}", Role.AGENT)
            for h in org.api_key_hashes
        ]
        grants += [KeyGrant(org.org_id, k.key_hash, k.name, Role(k.role)) for k in org.keys]
    return grants


async def unknown_tool_org(
    store: Store, settings: Settings, declared: set[str] | None = None
) -> str | None:
    """A line naming the first `[[tools]]` entry whose org is neither declared (`[[orgs]]`,
    or `declared`) nor in the store, or None. Checked before anything is written."""
    known = {org.org_id for org in settings.orgs} | (declared or set())
    where = f"config file {settings.config}: " if settings.config else ""
    for n, tool in enumerate(settings.tools):
        if tool.org_id in known:
            continue
        async with store.reader() as q:
            found = await q.get_org(tool.org_id)
        if found is None:
            return (
                f"{where}tools[{n}] ({tool.name}) names org {tool.org_id!r}, which is not in "
                f'[[orgs]] nor in the database: add an [[orgs]] table with id = "{tool.org_id}"'
            )
        known.add(tool.org_id)
    return None


async def open_runtime(settings: Settings, metrics: ProxyMetrics | None = None) -> Runtime:
    """Open the store (migrating it), seed the configured orgs and tools, open the executor."""
    upstreams = upstream_registry(settings)
    store = await open_store(
        settings.database_url,
        lock_max_attempts=settings.lock_max_attempts,
        lock_retry_ms=settings.lock_retry_ms,
    )
    try:
        await store.migrate()
        problem = await unknown_tool_org(store, settings)
        if problem:
            raise ValueError(problem)
        engine = Engine(
            store,
            lease_seconds=settings.lease_seconds,
            retry_after_seconds=settings.retry_after_seconds,
        )
        for org in settings.orgs:
            await engine.ensure_org(
                org.org_id,
                name=org.name,
                approval_timeout_s=org.approval_timeout_seconds,
                auto_approve_on_timeout=org.auto_approve_on_timeout,
            )
        keys = Keys(store)
        # The config is the source of truth for its keys: listed ones are stored (moved to
        # the org that lists them now), the others revoked.
        await keys.sync_config(config_key_grants(settings))
        for tool in settings.tools:
            await engine.register_tool(
                tool.org_id,
                tool.name,
                tier=ToolTier(tool.tier).value,
                version=tool.version,
                compensation=dict(tool.compensation) if tool.compensation else None,
                idempotent_upstream=tool.idempotent_upstream,
                upstream=tool.upstream,
            )
        executor = ToolExecutor(upstreams, timeout_seconds=settings.upstream_timeout_seconds)
        await executor.open()
    except BaseException:
        # Every failure path closes the store: its threads or pool would keep the process alive.
        await store.close()
        raise
    if settings.lease_seconds <= settings.upstream_timeout_seconds:
        # A duplicate arriving after the lease but before the upstream gives up would find
        # a call that is still running "in doubt" (or re-run an idempotent one beside it).
        structlog.get_logger("undolog.proxy").warning(
            "lease_shorter_than_upstream_timeout",
            lease_seconds=settings.lease_seconds,
            upstream_timeout_seconds=settings.upstream_timeout_seconds,
        )
    proxy_metrics = metrics or ProxyMetrics.create()
    return Runtime(
        store=store,
        engine=engine,
        saga=Saga(store, lease_seconds=settings.lease_seconds),
        approvals=Approvals(engine),
        broker=EventBroker(store, proxy_metrics),
        executor=executor,
        metrics=proxy_metrics,
        deliveries=Deliveries(engine),
        leases=LeaseKeeper(engine, settings.lease_seconds),
        held=HeldResults(settings.spool_dir),
        retry_after_seconds=settings.retry_after_seconds,
        commit_retry_attempts=max(1, settings.commit_retry_attempts),
        commit_retry_backoff_ms=settings.commit_retry_backoff_ms,
        log=structlog.get_logger("undolog.proxy"),
        keys=keys,
        config_tools={(t.org_id, t.name): "config" for t in settings.tools},
        gateway_prefixes=tuple(f"{u.name}." for u in settings.mcp.upstreams),
    )


def upstream_registry(settings: Settings) -> UpstreamRegistry:
    """The configured upstreams; an upstream without a secret gets a random one (warned).

    Raises:
        ValueError: a URL that is not a plain http(s) base URL (settings built in code skip
            the checks `load_settings` makes).
    """
    registry = UpstreamRegistry.build(
        settings.upstream_url,
        settings.upstream_secret,
        [(u.name, u.url, u.secret, u.orgs) for u in settings.upstreams],
    )
    for upstream in registry:
        if upstream.secret_generated:
            # Still signed, but with a key no tool server holds: it cannot tell orgs apart.
            structlog.get_logger("undolog.proxy").warning(
                "upstream_secret_generated",
                upstream=upstream.name,
                hint="set UNDOLOG_UPSTREAM_SECRET or the upstream's secret/secret_env so the "
                "tool server can verify X-UndoLog-Signature",
            )
    return registry


def create_app(settings: Settings) -> Any:
    """The proxy as an ASGI app; the store opens in the lifespan."""
    metrics_holder: dict[str, Runtime] = {}
    metrics = ProxyMetrics.create()
    # Imported here: the gateway builds on the proxy's modules (executor, tool calls).
    from undolog.mcp.gateway import McpGateway

    gateway = McpGateway(settings.mcp, timeout_seconds=settings.upstream_timeout_seconds)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        runtime = await open_runtime(settings, metrics)
        metrics_holder["runtime"] = runtime
        app.state.runtime = runtime
        listener: MetricsListener | None = None
        try:
            if settings.metrics_port is not None:
                listener = MetricsListener(metrics, settings.metrics_host, settings.metrics_port)
                try:
                    await listener.start()
                except OSError as exc:
                    listener = None
                    raise RuntimeError(
                        f"cannot listen for /metrics on {settings.metrics_host}:"
                        f"{settings.metrics_port}: {exc.strerror}"
                    ) from None
            await runtime.broker.start()
            runtime.leases.start()
            sweepers = [
                asyncio.create_task(sweep_forever(runtime, settings.approval_sweep_seconds)),
                asyncio.create_task(sweep_leases_forever(runtime, settings.lease_sweep_seconds)),
            ]
            try:
                async with gateway.serving(runtime):
                    yield
            finally:
                for sweeper in sweepers:
                    sweeper.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await sweeper
                await runtime.held.close()
                await runtime.leases.stop()
                await runtime.broker.stop()
        finally:
            # Also when start-up fails after the store opened: a store left open hangs the exit.
            if listener is not None:
                await listener.stop()
            await runtime.executor.close()
            await runtime.store.close()

    api = FastAPI(
        title="UndoLog proxy",
        version=undolog.__version__,
        lifespan=lifespan,
        docs_url=None,
        redoc_url=None,
    )
    api.add_api_route(
        "/mcp/tool_call",
        tool_call,
        methods=["POST"],
        summary="Intercept and execute a tool call through the UndoLog engine",
        openapi_extra={"requestBody": _TOOL_CALL_BODY},
    )
    api.include_router(router)
    api.include_router(undo_router)
    api.include_router(approvals_router)
    api.include_router(events_router)
    api.router.routes.append(Route("/mcp", gateway, methods=["GET", "POST", "DELETE"]))
    api.include_router(overview_router)
    api.include_router(ready_router)
    api.state.ready_timeout_seconds = settings.ready_timeout_seconds
    api.include_router(ui_auth_router)
    mount_ui(api)

    @api.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> Response:
        code = _STATUS_CODES.get(exc.status_code, "http_error")
        detail = str(exc.detail)
        if exc.status_code == 405:
            detail = f"method {request.method} is not allowed on {request.url.path}"
        return json_response(
            error_body(request.state.request_id, code, detail), exc.status_code, exc.headers
        )

    @api.exception_handler(Exception)
    async def unexpected_error(request: Request, exc: Exception) -> Response:
        # A bug: the details go to the log; the client gets the request id to find them.
        request_id = request.state.request_id
        structlog.get_logger("undolog.proxy").exception(
            "unhandled_error", request_id=request_id, path=request.url.path
        )
        return json_response(
            error_body(request_id, "internal_error", internal_error_message(request_id)), 500
        )

    @api.exception_handler(RequestValidationError)
    async def validation_error(request: Request, exc: RequestValidationError) -> Response:
        # Field and reason only: the errors' own repr carries the input and Python types.
        problems = "; ".join(
            f"{'.'.join(str(part) for part in error.get('loc', ()))}: {error.get('msg', '')}"
            for error in exc.errors()
        )
        return json_response(
            error_body(request.state.request_id, "invalid_request", f"invalid request: {problems}"),
            400,
        )

    async def lookup(key_hash: str) -> KeyRecord | None:
        return await metrics_holder["runtime"].keys.live(key_hash)

    async def touch(key_id: str) -> None:
        await metrics_holder["runtime"].keys.touch(key_id)

    keys = KeyResolver(lookup, touch=touch)
    sessions = UiSessions(
        SessionTokens.from_setting(settings.ui_secret), lambda: metrics_holder["runtime"].store
    )
    api.state.ui_sessions = sessions
    api.state.ui_key_lookup = keys.record_for_key
    limiter = FailureLimiter(settings.auth_failure_limit, settings.auth_failure_window_seconds)
    api.state.allowed_origins = settings.allowed_origins
    api.state.auth_limiter = limiter
    edge = Edge(
        api,
        metrics=metrics,
        keys=keys,
        max_body_bytes=settings.max_body_bytes,
        sessions=sessions,
        metrics_token=settings.metrics_token,
        allowed_origins=settings.allowed_origins,
        limiter=limiter,
    )
    tool_call_route = next(r for r in api.routes if getattr(r, "path", "") == "/mcp/tool_call")
    edge.fast_routes[("POST", "/mcp/tool_call")] = (tool_call_route, tool_call)
    edge.fastapi = api  # type: ignore[attr-defined]  # for tests and the CLI
    return edge
