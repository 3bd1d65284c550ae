"""Builds the proxy's ASGI app from settings: store, engine, executor, routes, edge."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import Response
from starlette.routing import Route

import undolog
from undolog.config import Settings
from undolog.mcp.gateway import McpGateway
from undolog.proxy.approvals import router as approvals_router
from undolog.proxy.edge import Edge, KeyResolver
from undolog.proxy.errors import error_handler
from undolog.proxy.events import router as events_router
from undolog.proxy.metrics_listener import MetricsListener
from undolog.proxy.openapi import install_openapi
from undolog.proxy.overview import router as overview_router
from undolog.proxy.policy import router as policy_router
from undolog.proxy.ratelimit import FailureLimiter
from undolog.proxy.ready import router as ready_router
from undolog.proxy.routes import router
from undolog.proxy.toolcall import tool_call
from undolog.proxy.ui_auth import SessionTokens, UiSessions
from undolog.proxy.ui_auth import router as ui_auth_router
from undolog.proxy.undo import router as undo_router
from undolog.proxy.webhooks import router as webhooks_router
from undolog.proxy.wire import error_body, json_response
from undolog.runtime import Runtime, open_runtime
from undolog.services import tracing
from undolog.services.metrics import ProxyMetrics
from undolog.services.sweeps import (
    sweep_approvals_forever,
    sweep_leases_forever,
    sweep_retention_forever,
)
from undolog.store.records import KeyRecord
from undolog.ui import mount_ui
from undolog_sdk.errors import UndoLogError
from undolog_sdk.wire import ExecutionMode

__all__ = ["create_app"]

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
                    "mode": {
                        "enum": [m.value for m in ExecutionMode],
                        "default": ExecutionMode.PROXY.value,
                    },
                },
            }
        }
    },
}

_STATUS_CODES = {400: "invalid_request", 404: "not_found", 405: "method_not_allowed"}


def _allowed(request: Request) -> str:
    """Every method some route serves on this path (Starlette names only the first
    route's, and a path may have a route per method, as `/policy/rules` has)."""
    path = request.url.path
    methods: set[str] = set()
    for route in request.app.routes:
        found = getattr(route, "methods", None)
        regex = getattr(route, "path_regex", None)
        if found and regex is not None and regex.match(path):
            methods |= set(found)
    return ", ".join(sorted(methods))


def create_app(settings: Settings, *, prepared: bool = False) -> Any:
    """The proxy as an ASGI app; the store opens in the lifespan. `prepared`: the store is
    already migrated and seeded (by the supervisor of `undolog serve --workers N`)."""
    metrics_holder: dict[str, Runtime] = {}
    metrics = ProxyMetrics.create()
    gateway = McpGateway(
        settings.mcp,
        timeout_seconds=settings.upstream_timeout_seconds,
        org_ids=[org.org_id for org in settings.orgs],
    )

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        runtime = await open_runtime(settings, metrics, prepare=not prepared)
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
            await runtime.held.recover(runtime.log)
            if runtime.webhooks is not None:
                await runtime.webhooks.start()
            sweepers = [
                asyncio.create_task(
                    sweep_approvals_forever(runtime, settings.approval_sweep_seconds)
                ),
                asyncio.create_task(sweep_leases_forever(runtime, settings.lease_sweep_seconds)),
                asyncio.create_task(
                    sweep_retention_forever(
                        runtime, settings.retention_sweep_seconds, settings.retention_batch_size
                    )
                ),
            ]
            try:
                async with gateway.serving(runtime):
                    yield
            finally:
                for sweeper in sweepers:
                    sweeper.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await sweeper
                if runtime.webhooks is not None:
                    await runtime.webhooks.stop()
                await runtime.held.close()
                await runtime.leases.stop()
                await runtime.broker.stop()
        finally:
            # Also when start-up fails after the store opened: a store left open hangs the exit.
            if listener is not None:
                await listener.stop()
            await runtime.executor.close()
            await runtime.store.close()
            await asyncio.to_thread(tracing.flush)  # the last spans, before the process ends

    api = FastAPI(
        title="UndoLog proxy",
        version=undolog.__version__,
        lifespan=lifespan,
        docs_url="/docs",  # Swagger UI; its page and /openapi.json are outside auth
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
    api.include_router(webhooks_router)
    api.router.routes.append(Route("/mcp", gateway, methods=["GET", "POST", "DELETE"]))
    api.include_router(overview_router)
    api.include_router(policy_router)
    api.include_router(ready_router)
    api.state.ready_timeout_seconds = settings.ready_timeout_seconds
    api.include_router(ui_auth_router)
    mount_ui(api)
    install_openapi(api)

    @api.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> Response:
        code = _STATUS_CODES.get(exc.status_code, "http_error")
        detail = str(exc.detail)
        headers = exc.headers
        if exc.status_code == 405:
            detail = f"method {request.method} is not allowed on {request.url.path}"
            headers = {**(headers or {}), "Allow": _allowed(request)}
        return json_response(
            error_body(request.state.request_id, code, detail), exc.status_code, headers
        )

    # One mapping for every route (`undolog.proxy.errors`): UndoLog errors as their error
    # body, anything else as a 500 with a fixed message and the request id.
    api.add_exception_handler(UndoLogError, error_handler)
    api.add_exception_handler(Exception, error_handler)

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
