"""The ASGI edge of the proxy: request ids, /health and /metrics, body limit, auth, metrics.

Written as plain ASGI rather than `BaseHTTPMiddleware`, which costs a task and a memory
stream per request on the hot path. Order: a request id for every response; `/health` and
`/metrics` answered before anything else (outside the HTTP metrics, as the reference says;
`/metrics` only to `Authorization: Bearer <metrics_token>`, since it names every org, and not
at all without a configured token — `metrics_port` serves it on a private listener instead);
then the declared body size; then auth, from the headers alone, which puts the key's principal
in `scope["state"]` (`org_id`, `key_id`, `key_name`, `role`, `principal`), checks the role
against the permission table (`roles.py`: 403 `forbidden`) and tells the server the connection
has shown a valid key (`server.py` never sheds such a connection); only then the body, read
whole within the limit; then the app, timed per route template. A request without valid
credentials is thus answered before its body is read, and the server closes its connection.
The org and the actor always come from the key, never from what the client writes. Failed key
checks count per client address (`ratelimit.py`): past the limit a wrong key answers 429, a
valid key always passes.

Auth takes the `X-Api-Key` header first; without one, the dashboard's session cookie
(`ui_auth.py`) stands in for it, and a state-changing request must then also pass the
same-origin check that stops cross-site request forgery.

Keys are cached in this process for `ttl_seconds` (5 s): a revoked key stops working within
that time in every process, at once in a dashboard session (checked against the store on
each request). A key's `last_used` is written at most once a minute, in the background.
"""

from __future__ import annotations

import asyncio
import hmac
import re
import time
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

import orjson
import structlog
from starlette.requests import Request
from starlette.responses import Response

from undolog.config import hash_api_key
from undolog.engine.keys import Role
from undolog.engine.model import new_id
from undolog.proxy.errors import answer_error
from undolog.proxy.inputs import path_problem
from undolog.proxy.ratelimit import FailureLimiter, client_address
from undolog.proxy.roles import Principal, allowed
from undolog.proxy.server import CONNECTION_VERIFIED
from undolog.proxy.ui_auth import UiSessions, cookie_token, same_origin
from undolog.proxy.wire import error_body
from undolog.services.metrics import ProxyMetrics
from undolog.store.records import KeyRecord
from undolog_sdk.errors import (
    AuthFailed,
    AuthMissing,
    Forbidden,
    InvalidRequest,
    NotFound,
    PayloadTooLarge,
    RateLimited,
    UndoLogError,
)

__all__ = ["Edge", "KeyResolver"]

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

_SAFE_REQUEST_ID = re.compile(r"^[A-Za-z0-9._:\-]{1,128}$")
# The API's description and Swagger UI (`/docs`) are public: they hold no data.
PUBLIC_PATHS = frozenset({"/openapi.json", "/ready", "/docs", "/docs/oauth2-redirect"})
PUBLIC_PREFIXES = ("/ui/",)  # the dashboard's static files; its data comes from the API
_BODY_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})


class KeyResolver:
    """API key → its live record (org, id, name, role), through the store, cached briefly.

    Keys are hashed (SHA-256) before any lookup and never kept or logged in plain form.
    `touch` records a key's use, at most once per `touch_interval_seconds` per key and in a
    background task: never a write on the request's path.
    """

    def __init__(
        self,
        lookup: Callable[[str], Awaitable[KeyRecord | None]],
        *,
        ttl_seconds: float = 5.0,
        negative_ttl_seconds: float = 1.0,
        touch: Callable[[str], Awaitable[None]] | None = None,
        touch_interval_seconds: float = 60.0,
    ) -> None:
        self._lookup = lookup
        self._ttl = ttl_seconds
        self._negative_ttl = negative_ttl_seconds
        # key hash → (expiry, record, its principal): the principal is built once per lookup
        self._cache: dict[str, tuple[float, KeyRecord | None, Principal | None]] = {}
        self._touch = touch
        self._touch_interval = touch_interval_seconds
        self._touched: dict[str, float] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    async def _resolve(self, key: str) -> tuple[KeyRecord | None, Principal | None]:
        key_hash = hash_api_key(key)
        now = time.monotonic()
        cached = self._cache.get(key_hash)
        if cached is not None and cached[0] > now:
            _, record, principal = cached
        else:
            record = await self._lookup(key_hash)
            principal = None
            if record is not None:
                principal = Principal(record.org_id, record.key_id, record.name, Role(record.role))
            expiry = now + (self._ttl if record else self._negative_ttl)
            self._cache[key_hash] = (expiry, record, principal)
            if len(self._cache) > 10_000:  # bounded: unknown keys must not grow it forever
                self._cache.clear()
        if record is not None:
            self._note_use(record.key_id, now)
        return record, principal

    async def record_for_key(self, key: str) -> KeyRecord | None:
        """The key's live record (None: unknown or revoked)."""
        return (await self._resolve(key))[0]

    async def principal_for_key(self, key: str) -> Principal | None:
        """Who the key speaks for (None: unknown or revoked)."""
        return (await self._resolve(key))[1]

    def _note_use(self, key_id: str, now: float) -> None:
        if self._touch is None or now - self._touched.get(key_id, -1e18) < self._touch_interval:
            return
        self._touched[key_id] = now
        task = asyncio.get_running_loop().create_task(self._touch_quietly(key_id))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _touch_quietly(self, key_id: str) -> None:
        assert self._touch is not None
        try:
            await self._touch(key_id)
        except Exception:  # a lost "last used" must never fail or log-spam a request
            structlog.get_logger("undolog.proxy").debug("key_touch_failed", key_id=key_id)


def _connection_verified(scope: Scope) -> None:
    """Tell the server this connection has shown valid credentials (`server.py` then never
    sheds it to seat another); the extension is there only until it has."""
    extensions = scope.get("extensions")
    if extensions is not None:
        mark = extensions.get(CONNECTION_VERIFIED)
        if mark is not None:
            mark()


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope["headers"]:
        if key == name:
            return str(value.decode("latin-1"))
    return None


async def _send_json(send: Send, status: int, body: Any, request_id: str | None = None) -> None:
    """A JSON response; `request_id` adds the header (None: `send` adds it itself)."""
    payload = orjson.dumps(body)
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(payload)).encode()),
    ]
    if request_id is not None:
        headers.append((b"x-request-id", request_id.encode()))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": payload})


async def _send_error(
    send: Send,
    exc: UndoLogError,
    request_id: str,
    *,
    id_header: bool = False,
    extra: tuple[tuple[bytes, bytes], ...] = (),
) -> None:
    """The error body of `exc` (with its fields, and `Retry-After` when it has one)."""
    fields = exc.fields()
    body = orjson.dumps(error_body(request_id, exc.code, exc.message, **fields))
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
    ]
    if fields.get("retry_after") is not None:
        headers.append((b"retry-after", str(fields["retry_after"]).encode()))
    headers.extend(extra)
    if id_header:
        headers.append((b"x-request-id", request_id.encode()))
    await send({"type": "http.response.start", "status": exc.http_status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


MCP_PATH = "/mcp"
# JSON-RPC's implementation-defined server error range: the request was not authenticated.
MCP_AUTH_ERROR = -32001
NOT_RECOGNISED = "API key not recognised"
_MCP_MISSING = "the API key is missing: send it as X-Api-Key (or Authorization: Bearer <key>)"
_MCP_INVALID = "the API key is invalid or revoked: UndoLog does not recognise it"


def _bearer(scope: Scope) -> str | None:
    value = _header(scope, b"authorization")
    if value is not None and value[:7].lower() == "bearer ":
        return value[7:].strip() or None
    return None


async def _send_mcp_refusal(send: Send, exc: UndoLogError) -> None:
    """`/mcp`'s refusal of a request the edge did not let in, as an MCP client shows it: a
    JSON-RPC error whose message names the problem (clients show that, not the status), with
    `401` and `WWW-Authenticate` for a missing or unrecognised key (the MCP spec's
    Authorization section: invalid credentials are a 401) and `403` for a key whose role may
    not use `/mcp`, or an org header that disagrees with the key (docs/mcp.md)."""
    if isinstance(exc, AuthMissing) or exc.message == NOT_RECOGNISED:
        status = 401
        message = _MCP_MISSING if isinstance(exc, AuthMissing) else _MCP_INVALID
        challenge = 'Bearer realm="undolog"' + (
            "" if isinstance(exc, AuthMissing) else ', error="invalid_token"'
        )
    else:
        status, message = 403, f"UndoLog refused the API key: {exc.message}"
        challenge = 'Bearer realm="undolog", error="insufficient_scope"'
    body = orjson.dumps({
        "jsonrpc": "2.0",
        "id": None,
        "error": {"code": MCP_AUTH_ERROR, "message": message, "data": {"code": exc.code}},
    })  # fmt: skip
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        (b"www-authenticate", challenge.encode()),
    ]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def _with_id(
    send: Send, request_id: str, status_holder: list[int], *, closing: bool = False
) -> Send:
    """`send` adding the `X-Request-Id` header to the response and noting its status;
    `closing`: also `Connection: close` (answered before the body was read, the connection
    is not kept, and the client must not send another request on it)."""
    extra = [(b"x-request-id", request_id.encode())]
    if closing:
        extra.append((b"connection", b"close"))

    async def send_with_id(message: Message) -> None:
        if message["type"] == "http.response.start":
            status_holder[0] = message["status"]
            message["headers"] = [*message.get("headers", []), *extra]
        await send(message)

    return send_with_id


class _BodyReplay:
    """A request's body, read whole by the edge, handed to the app as one message; after
    it, the server's own `receive` (which then only reports a disconnect)."""

    __slots__ = ("_receive", "body", "delivered")

    def __init__(self, body: bytes, receive: Receive) -> None:
        self.body = body
        self.delivered = False
        self._receive = receive

    async def __call__(self) -> Message:
        if not self.delivered:
            self.delivered = True
            return {"type": "http.request", "body": self.body, "more_body": False}
        return await self._receive()


class Edge:
    """Wraps the FastAPI app; see the module docstring for what it does, in order."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        metrics: ProxyMetrics,
        keys: KeyResolver,
        max_body_bytes: int,
        sessions: UiSessions | None = None,
        metrics_token: str | None = None,
        allowed_origins: tuple[str, ...] = (),
        limiter: FailureLimiter | None = None,
    ) -> None:
        self.app = app
        self.metrics = metrics
        self.keys = keys
        self.max_body_bytes = max_body_bytes
        self.sessions = sessions
        self.metrics_token = metrics_token
        self.allowed_origins = allowed_origins
        self.limiter = limiter if limiter is not None else FailureLimiter(10, 60.0)
        # (method, path) → (route, handler) served straight from here, past FastAPI's
        # routing and middleware: the hot path (`POST /mcp/tool_call`). The route object is
        # still registered with FastAPI, for OpenAPI and for the metrics label.
        self.fast_routes: dict[
            tuple[str, str], tuple[Any, Callable[[Request], Awaitable[Response]]]
        ] = {}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        supplied = _header(scope, b"x-request-id")
        request_id = supplied if supplied and _SAFE_REQUEST_ID.match(supplied) else new_id()
        state = scope.setdefault("state", {})
        state["request_id"] = request_id
        path: str = scope["path"]
        if path == "/health":
            await _send_json(send, 200, {"status": "ok", "service": "undolog-proxy"}, request_id)
            return
        if path == "/metrics":
            await self._gated_metrics(scope, send, request_id)
            return

        status_holder = [500]
        started = time.perf_counter()
        try:
            await self._guarded(scope, receive, send, request_id, path, status_holder)
        finally:
            route = scope.get("route")
            label = getattr(route, "path", None) or "unmatched"
            self.metrics.http_requests.labels(label, str(status_holder[0])).inc()
            self.metrics.http_duration.labels(label).observe(time.perf_counter() - started)

    async def _guarded(
        self,
        scope: Scope,
        receive: Receive,
        send: Send,
        request_id: str,
        path: str,
        status_holder: list[int],
    ) -> None:
        """Limits and auth, then the route; `status_holder` gets the answer's status."""
        has_body = scope["method"] in _BODY_METHODS
        try:
            if has_body:
                self._check_declared_length(scope)
            # The key is checked from the headers, before the body is read: a request without
            # valid credentials is answered at once, and the server closes its connection
            # without waiting for the body (`server.py`).
            if not (path in PUBLIC_PATHS or path == "/ui" or path.startswith(PUBLIC_PREFIXES)):
                principal = await self._authenticate(scope)
                _connection_verified(scope)
                state = scope["state"]
                state["principal"] = principal
                state["org_id"] = principal.org_id
                state["key_id"] = principal.key_id
                state["key_name"] = principal.key_name
                state["role"] = principal.role.value
                if not allowed(principal, scope["method"], path):
                    raise Forbidden(
                        f"an {principal.role.value} key may not use {scope['method']} {path}"
                    )
            problem = path_problem(path)
            if problem is not None:
                raise InvalidRequest(problem)
            if has_body:
                body = await self._bounded_body(receive)
                if body is None:
                    status_holder[0] = 499  # the client left (or was cut) before its body
                    return
                receive = body
        except UndoLogError as exc:
            # Refused before its body was read: the server does not keep the connection.
            unread = has_body and not isinstance(receive, _BodyReplay)
            refusal = _with_id(send, request_id, status_holder, closing=unread)
            if path == MCP_PATH and isinstance(exc, AuthFailed | Forbidden):
                await _send_mcp_refusal(refusal, exc)
                return
            # The app's one mapping.
            error = answer_error(request_id, exc, path)
            await error(scope, receive, refusal)
            return
        fast = self.fast_routes.get((scope["method"], path))
        if fast is None:
            await self.app(scope, receive, _with_id(send, request_id, status_holder))
            return
        route, handler = fast
        scope["app"] = self.app  # what `request.app` is inside the handler
        scope["route"] = route
        request = Request(scope, receive)
        if type(receive) is _BodyReplay:
            # Read whole already: the handler's `body()` takes it as Starlette caches it,
            # without a stream over the replay (and `receive` is past the body from here on).
            request._body = receive.body
            receive.delivered = True
        try:
            response = await handler(request)
        except Exception as exc:  # answered as the app's own handler would
            response = answer_error(request_id, exc, path)
        # The response is in hand: its header and status are known without wrapping `send`.
        response.raw_headers.append((b"x-request-id", request_id.encode()))
        status_holder[0] = response.status_code
        await response(scope, receive, send)

    def _check_declared_length(self, scope: Scope) -> None:
        limit = self.max_body_bytes
        declared = _header(scope, b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            raise PayloadTooLarge(f"request body exceeds the limit of {limit} bytes")

    async def _bounded_body(self, receive: Receive) -> _BodyReplay | None:
        """Read the whole body (refusing more than the limit) to replay it to the app; None
        when the client disconnected first (a partial body is never handed on)."""
        limit = self.max_body_bytes
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return None
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > limit:
                raise PayloadTooLarge(f"request body exceeds the limit of {limit} bytes")
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        return _BodyReplay(b"".join(chunks), receive)

    async def _authenticate(self, scope: Scope) -> Principal:
        key = _header(scope, b"x-api-key")
        if not key and scope["path"] == MCP_PATH:
            key = _bearer(scope)  # MCP clients often know only bearer tokens
        principal: Principal | None
        if key:
            principal = await self.keys.principal_for_key(key)
            if principal is None:
                self._failed_attempt(scope)
                raise AuthFailed(NOT_RECOGNISED)
        else:
            principal = await self._cookie_principal(scope)
        org_id = principal.org_id
        for header in (b"x-org-id", b"x-undolog-org-id"):
            claimed = _header(scope, header)
            if claimed is not None and not hmac.compare_digest(claimed.encode(), org_id.encode()):
                raise AuthFailed(f"{header.decode()} does not match the API key's organisation")
        return principal

    async def _cookie_principal(self, scope: Scope) -> Principal:
        """Who the dashboard's session cookie speaks for (the fallback without `X-Api-Key`)."""
        token = cookie_token(scope["headers"]) if self.sessions is not None else None
        if token is None or self.sessions is None:
            raise AuthMissing("missing X-Api-Key header")
        principal = await self.sessions.principal(token)
        if principal is None:
            raise AuthMissing("the dashboard session has ended or is invalid: sign in again")
        if scope["method"] in _BODY_METHODS and not same_origin(scope, self.allowed_origins):
            raise AuthFailed("a dashboard request must come from the dashboard's own origin")
        return principal

    def _failed_attempt(self, scope: Scope) -> None:
        """Count a failed credential; raises `RateLimited` past the limit for this address."""
        retry_after = self.limiter.failed(client_address(scope))
        if retry_after is not None:
            raise RateLimited(retry_after)

    async def _gated_metrics(self, scope: Scope, send: Send, request_id: str) -> None:
        """`/metrics` on the main port: only with the configured bearer token."""
        try:
            if self.metrics_token is None:
                raise NotFound(
                    "/metrics is not served on this port: set metrics_token (--metrics-token, "
                    "UNDOLOG_METRICS_TOKEN) and send 'Authorization: Bearer <token>', or set "
                    "metrics_port to serve it on a separate private listener"
                )
            auth = _header(scope, b"authorization") or ""
            scheme, _, given = auth.partition(" ")
            if scheme.lower() != "bearer" or not hmac.compare_digest(
                given.strip().encode(), self.metrics_token.encode()
            ):
                if auth:
                    self._failed_attempt(scope)
                raise AuthMissing("/metrics needs 'Authorization: Bearer <metrics_token>'")
        except UndoLogError as exc:
            challenge = ((b"www-authenticate", b"Bearer"),) if exc.http_status == 401 else ()
            await _send_error(send, exc, request_id, id_header=True, extra=challenge)
            return
        await self._send_metrics(send, request_id)

    async def _send_metrics(self, send: Send, request_id: str) -> None:
        payload = self.metrics.render()
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [
                    (b"content-type", b"text/plain; version=0.0.4; charset=utf-8"),
                    (b"content-length", str(len(payload)).encode()),
                    (b"x-request-id", request_id.encode()),
                ],
            }
        )
        await send({"type": "http.response.body", "body": payload})
