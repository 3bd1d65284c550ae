"""Dashboard sign-in: an `approver` or `admin` key is exchanged once for a session cookie.

The cookie (`undolog_session`) carries a random session id and an expiry, signed with
HMAC-SHA256 under the server's `ui_secret` — never the key. It is HttpOnly and
SameSite=Strict, Secure when the request came over https. The edge accepts it in place of
`X-Api-Key`; a request that changes state with it must also prove it comes from the
dashboard's own origin: an `Origin` among the allowed origins (the `allowed_origins` setting,
or this server's own address), or, without `Origin`, `X-Requested-With: undolog-ui` and an
allowed `Host`. Neither a cross-site form nor a DNS-rebinding page can forge that. Failed
sign-ins count toward the per-address limit on failed authentication (`ratelimit.py`).

Sessions are kept server-side (`ui_sessions`, the session id stored as its SHA-256) and tied
to the key that signed in: each request checks the session is neither signed out nor expired
and that its key is not revoked, so sign-out and `undolog keys revoke` end it at once. An
`agent` key cannot sign in. Without a configured secret each process draws a random one, so
a restart signs everyone out.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
import time
import urllib.parse
from collections.abc import Awaitable, Callable, Iterable, Mapping, MutableMapping
from dataclasses import dataclass
from typing import Any

import orjson
from fastapi import APIRouter, Request
from starlette.requests import cookie_parser
from starlette.responses import Response

from undolog.engine.keys import Role
from undolog.engine.model import now_us
from undolog.proxy.ratelimit import FailureLimiter, client_address
from undolog.proxy.roles import Principal, route_roles
from undolog.proxy.wire import error_body, error_response, json_response
from undolog.store.protocol import Store
from undolog.store.records import KeyRecord
from undolog_sdk.errors import RateLimited

__all__ = [
    "COOKIE_NAME",
    "CSRF_HEADER",
    "CSRF_VALUE",
    "SessionTokens",
    "UiSessions",
    "allowed_origins",
    "cookie_token",
    "router",
    "same_origin",
]

COOKIE_NAME = "undolog_session"
CSRF_HEADER = "x-requested-with"
CSRF_VALUE = "undolog-ui"
DEFAULT_TTL_SECONDS = 12 * 3600
_MAX_KEY_CHARS = 512


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


@dataclass(frozen=True)
class SessionTokens:
    """Issues and checks session tokens: `base64url(payload).base64url(hmac)`."""

    secret: bytes
    ttl_seconds: int = DEFAULT_TTL_SECONDS

    @classmethod
    def from_setting(
        cls, secret: str | None, ttl_seconds: int = DEFAULT_TTL_SECONDS
    ) -> SessionTokens:
        """The configured secret, or a random one for this process only."""
        raw = secret.encode("utf-8") if secret else secrets.token_bytes(32)
        return cls(raw, ttl_seconds)

    def _sign(self, payload: bytes) -> bytes:
        return hmac.new(self.secret, payload, hashlib.sha256).digest()

    def issue(self, session_id: str, now: float | None = None) -> tuple[str, int]:
        """A token for the server-side session `session_id`; returns it with its expiry
        (Unix seconds)."""
        expires = int(now if now is not None else time.time()) + self.ttl_seconds
        payload = orjson.dumps({"sid": session_id, "exp": expires})
        return f"{_b64(payload)}.{_b64(self._sign(payload))}", expires

    def verify(self, token: str, now: float | None = None) -> str | None:
        """The session id of a well-signed, unexpired token; None for anything else."""
        head, dot, tail = token.partition(".")
        if not dot:
            return None
        try:
            payload, signature = _unb64(head), _unb64(tail)
        except (ValueError, UnicodeEncodeError):
            return None
        if not hmac.compare_digest(signature, self._sign(payload)):
            return None
        try:
            data = orjson.loads(payload)
        except orjson.JSONDecodeError:  # pragma: no cover - we signed it, so we wrote it
            return None
        session_id, expires = data.get("sid"), data.get("exp")
        if not isinstance(session_id, str) or not isinstance(expires, int):
            return None
        if expires <= (now if now is not None else time.time()):
            return None
        return session_id


def _session_hash(session_id: str) -> str:
    return hashlib.sha256(session_id.encode("utf-8")).hexdigest()


class UiSessions:
    """Dashboard sessions: a signed cookie outside, a row in `ui_sessions` inside."""

    def __init__(self, tokens: SessionTokens, store: Callable[[], Store]) -> None:
        self.tokens = tokens
        self._store = store  # the runtime's store, opened in the lifespan

    async def start(self, key: KeyRecord) -> tuple[str, int]:
        """A new session for `key`; returns its cookie value and expiry (Unix seconds)."""
        session_id = secrets.token_hex(16)
        token, expires = self.tokens.issue(session_id)
        async with self._store().autocommit() as q:
            await q.insert_ui_session(
                _session_hash(session_id), key.key_id, key.org_id, now_us(), expires * 1_000_000
            )
        return token, expires

    async def principal(self, token: str) -> Principal | None:
        """Who a cookie speaks for: None when it is forged, expired, signed out or its key
        was revoked."""
        session_id = self.tokens.verify(token)
        if session_id is None:
            return None
        async with self._store().reader() as q:
            key = await q.ui_session_key(_session_hash(session_id), now_us())
        if key is None:
            return None
        return Principal(key.org_id, key.key_id, key.name, Role(key.role))

    async def end(self, token: str) -> None:
        session_id = self.tokens.verify(token)
        if session_id is not None:
            async with self._store().autocommit() as q:
                await q.end_ui_session(_session_hash(session_id), now_us())


def cookie_token(headers: Any) -> str | None:
    """The session cookie's value from raw ASGI headers (a list of byte pairs)."""
    for key, value in headers:
        if key == b"cookie":
            token = cookie_parser(value.decode("latin-1")).get(COOKIE_NAME)
            if token:
                return token
    return None


def _normal_origin(origin: str) -> str | None:
    """`scheme://host[:port]` in lower case, without a default port; None if malformed."""
    try:
        parts = urllib.parse.urlsplit(origin.strip().lower())
        port = parts.port
    except ValueError:
        return None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return None
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    if port is None or port == {"http": 80, "https": 443}[parts.scheme]:
        return f"{parts.scheme}://{host}"
    return f"{parts.scheme}://{host}:{port}"


def allowed_origins(
    scope: MutableMapping[str, Any], configured: Iterable[str] = ()
) -> frozenset[str]:
    """The origins the dashboard may send state-changing requests from.

    The configured ones (`allowed_origins`) if any; else this server's own address as it
    accepted the connection (`scope["server"]`, never the client's `Host` header), plus
    localhost and 127.0.0.1 on that port.
    """
    listed = {o for o in (_normal_origin(c) for c in configured) if o}
    if listed:
        return frozenset(listed)
    server = scope.get("server")
    if not server or server[1] is None:
        return frozenset()
    scheme = scope.get("scheme", "http")
    names = {str(server[0]), "localhost", "127.0.0.1"}
    found = (_normal_origin(f"{scheme}://{n if ':' not in n else f'[{n}]'}:{server[1]}")
             for n in names)  # fmt: skip
    return frozenset(o for o in found if o)


def same_origin(scope: MutableMapping[str, Any], configured: Iterable[str] = ()) -> bool:
    """Did the dashboard itself send this request? (the CSRF and DNS-rebinding check for
    cookie auth and sign-in)

    With an `Origin` header, it must be one of `allowed_origins`. Without one (older
    browsers), the request must carry `X-Requested-With: undolog-ui` and name an allowed
    origin in its `Host`. Matching `Origin` to `Host` is not enough: under DNS rebinding an
    attacker's name points at this server, and both headers then carry that name.
    """
    headers: dict[str, str] = {
        k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]
    }
    allowed = allowed_origins(scope, configured)
    origin = headers.get("origin")
    if origin is not None:
        return origin != "null" and _normal_origin(origin) in allowed
    host = headers.get("host")
    if headers.get(CSRF_HEADER) != CSRF_VALUE or not host:
        return False
    return _normal_origin(f"{scope.get('scheme', 'http')}://{host}") in allowed


# -- routes ------------------------------------------------------------------------------------

router = APIRouter(include_in_schema=False)


def _sessions(request: Request) -> UiSessions:
    sessions: UiSessions = request.app.state.ui_sessions
    return sessions


async def _submitted_key(request: Request) -> tuple[str | None, bool]:
    """The key from a JSON body `{"api_key": ...}` or a form field `api_key`; and whether
    the caller sent a form (it then gets a redirect rather than JSON)."""
    raw = await request.body()
    content_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if content_type == "application/x-www-form-urlencoded":
        fields: Mapping[str, list[str]] = urllib.parse.parse_qs(raw.decode("utf-8", "replace"))
        values = fields.get("api_key") or [""]
        return values[0].strip() or None, True
    try:
        data = orjson.loads(raw) if raw.strip() else {}
    except orjson.JSONDecodeError:
        return None, False
    key = data.get("api_key") if isinstance(data, dict) else None
    return (key.strip() or None) if isinstance(key, str) else None, False


def _set_cookie(response: Response, request: Request, value: str, max_age: int) -> None:
    response.set_cookie(
        COOKIE_NAME,
        value,
        max_age=max_age,
        path="/",
        httponly=True,
        samesite="strict",
        secure=request.url.scheme == "https",
    )


def _refused(request: Request, status: int, code: str, message: str) -> Response:
    return json_response(error_body(request.state.request_id, code, message), status)


# The page's actions and the route each uses: the page shows an action only when the key's
# role may use its route (`roles.py`, the one permission table), and says why otherwise.
_ACTIONS = {
    "approve": ("POST", "/approvals/{id}/approve"),
    "reject": ("POST", "/approvals/{id}/reject"),
    "rollback": ("POST", "/sessions/{id}/rollback"),  # a whole session, or one entry (undo)
    "undo_retry": ("POST", "/undo/{entry}/retry"),
    "undo_resolve": ("POST", "/undo/{entry}/resolve"),
}


def actions_for(role: Role) -> dict[str, bool]:
    """Which of the page's actions `role` may use."""
    return {
        name: role in route_roles(method, path.replace("{id}", "x").replace("{entry}", "x"))
        for name, (method, path) in _ACTIONS.items()
    }


@router.post("/ui/login")
async def login(request: Request) -> Response:
    """Exchange an `approver` or `admin` key for the session cookie (JSON `{"api_key"}` or
    a form field)."""
    if not same_origin(request.scope, request.app.state.allowed_origins):
        return _refused(request, 403, "auth_failed", "sign-in must come from the dashboard")
    key, is_form = await _submitted_key(request)
    if key is None or len(key) > _MAX_KEY_CHARS:
        return _refused(request, 400, "invalid_request", "an API key is required")
    lookup: Callable[[str], Awaitable[KeyRecord | None]] = request.app.state.ui_key_lookup
    record = await lookup(key)
    if record is None:
        limiter: FailureLimiter = request.app.state.auth_limiter
        retry_after = limiter.failed(client_address(request.scope))
        if retry_after is not None:
            return error_response(request.state.request_id, RateLimited(retry_after))
        return _refused(request, 401, "auth_failed", "API key not recognised")
    if record.role not in (Role.APPROVER, Role.ADMIN):
        return _refused(request, 403, "forbidden", "the dashboard needs an approver or admin key")
    sessions = _sessions(request)
    token, expires = await sessions.start(record)
    response: Response
    if is_form:
        response = Response(status_code=303, headers={"Location": "/ui/"})
    else:
        response = json_response(
            {"signed_in": True, "org_id": record.org_id, "key_name": record.name,
             "role": record.role, "expires_at": expires,
             "actions": actions_for(Role(record.role))}
        )  # fmt: skip
    _set_cookie(response, request, token, sessions.tokens.ttl_seconds)
    response.headers["Cache-Control"] = "no-store"
    return response


@router.post("/ui/logout")
async def logout(request: Request) -> Response:
    """End the session server-side and clear the cookie."""
    if not same_origin(request.scope, request.app.state.allowed_origins):
        return _refused(request, 403, "auth_failed", "sign-out must come from the dashboard")
    token = cookie_token(request.scope["headers"])
    if token:
        await _sessions(request).end(token)
    response = json_response({"signed_in": False})
    _set_cookie(response, request, "", 0)
    return response


@router.get("/ui/session")
async def whoami(request: Request) -> Response:
    """Whether the browser holds a valid session, and for which org and key (always 200:
    the page asks this first, and a refused request would be a console error)."""
    token = cookie_token(request.scope["headers"])
    principal = await _sessions(request).principal(token) if token else None
    body: dict[str, Any] = {
        "signed_in": principal is not None,
        "org_id": principal.org_id if principal else None,
        "key_name": principal.key_name if principal else None,
        "role": principal.role.value if principal else None,
        "actions": actions_for(principal.role) if principal else {},
    }
    return json_response(body, headers={"Cache-Control": "no-store"})
