"""The proxy's OpenAPI document: what each route takes and every status it can send.

The routes parse and answer by hand (orjson, no model layer), so FastAPI alone would
describe them as `{}` with a 422 that is never sent (a bad request is a 400 here). This
module builds the document once from the app's routes and the table below: the request
bodies and query parameters, a response model (`schemas.py`) for each status a route sends,
the `X-Api-Key` security scheme on every route behind the key, and the routes the edge or
the MCP gateway serve outside FastAPI's routing (`/health`, `/metrics`, `/mcp`).
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from undolog.engine.pages import ANY_STATUS, MAX_RECENT_CALLS, SESSION_STATES
from undolog.proxy import schemas as s
from undolog.proxy.edge import PUBLIC_PATHS
from undolog.proxy.inputs import MAX_EVENT_ID
from undolog.proxy.pages import MAX_TEXT, NEXT_CURSOR_HEADER
from undolog.proxy.toolcall import COMMIT_HEADER
from undolog_sdk.wire import ApprovalStatus

__all__ = ["API_KEY_SCHEME", "build_openapi", "install_openapi"]

API_KEY_SCHEME = "ApiKey"
METRICS_SCHEME = "MetricsToken"
_REF = "#/components/schemas/{model}"

# What a status means, when the route does not say more.
_MEANING = {
    200: "OK",
    202: "Accepted: waiting for a person's approval",
    400: "invalid_request: the request is malformed (body, query, path)",
    401: "missing or unknown credentials",
    403: "auth_failed / forbidden: the key's role or organisation does not allow this",
    404: "not_found (or not visible to this key)",
    409: "conflict with the current state (error-codes reference)",
    413: "payload_too_large: the body exceeds max_body_bytes",
    429: "rate_limited: too many failed credentials from this address, or the key is over a "
    "quota (`quota`: calls, new_sessions, event_streams); Retry-After",
    502: "the tool server or a compensation failed",
    503: "the store is unavailable or busy (Retry-After when it has one)",
}

_KEYED = (400, 401, 403, 429, 503)  # every route behind the key: path, auth, rate, store
_BODY = (*_KEYED, 413)  # and a body too large


def _r(ok: type[BaseModel] | None, *errors: int, many: bool = False) -> dict[int, Any]:
    """200 with `ok` (a list of them if `many`) and the error statuses, all `ErrorBody`."""
    table: dict[int, Any] = {200: (ok, many)}
    for status in errors:
        table[status] = (s.ErrorBody, False)
    return table


# (method, path) → (request body model or None, {status: (model, is_list)}).
ROUTES: dict[tuple[str, str], tuple[type[BaseModel] | None, dict[int, Any]]] = {
    ("POST", "/mcp/tool_call"): (
        s.ToolCallBody,
        {**_r(s.ToolCallAnswer, *_BODY, 404, 409, 502), 202: (s.ToolCallPending, False)},
    ),
    ("GET", "/tools"): (None, _r(s.Tool, *_KEYED, many=True)),
    ("PUT", "/tools/{name}"): (s.ToolBody, _r(s.Tool, *_BODY)),
    ("GET", "/effects/{id}"): (None, _r(s.Effect, *_KEYED, 404)),
    ("POST", "/effects/{id}/commit"): (s.CommitBody, _r(s.Effect, *_BODY, 404, 409)),
    ("POST", "/effects/{id}/fail"): (s.FailBody, _r(s.Effect, *_BODY, 404, 409)),
    ("POST", "/effects/{id}/resolve"): (s.ResolveBody, _r(s.Effect, *_BODY, 404, 409)),
    ("GET", "/sessions"): (None, _r(s.Session, *_KEYED, many=True)),
    ("GET", "/sessions/{id}"): (None, _r(s.SessionView, *_KEYED, 404)),
    ("POST", "/sessions/{id}/rollback"): (
        s.UndoSelectionBody,
        _r(s.Rollback, *_BODY, 404, 409, 502),
    ),
    ("POST", "/sessions/{id}/complete"): (None, _r(s.SessionClosed, *_BODY, 404, 409)),
    ("POST", "/undo/{entry}/claim"): (None, _r(s.UndoClaim, *_BODY, 404, 409)),
    ("POST", "/undo/{entry}/complete"): (s.UndoReportBody, _r(s.UndoEntry, *_BODY, 404, 409)),
    ("POST", "/undo/{entry}/fail"): (s.UndoFailBody, _r(s.UndoEntry, *_BODY, 404, 409, 502)),
    ("POST", "/undo/{entry}/retry"): (None, _r(s.UndoEntry, *_BODY, 404, 409)),
    ("POST", "/undo/{entry}/resolve"): (s.NoteBody, _r(s.UndoEntry, *_BODY, 404, 409)),
    ("GET", "/approvals"): (None, _r(s.Approval, *_KEYED, many=True)),
    ("GET", "/approvals/{id}"): (None, _r(s.Approval, *_KEYED, 404)),  # 429: too many waits
    ("POST", "/approvals/{id}/approve"): (s.DecisionBody, _r(s.DecisionResult, *_BODY, 404, 409)),
    ("POST", "/approvals/{id}/reject"): (s.RejectBody, _r(s.DecisionResult, *_BODY, 404, 409)),
    ("GET", "/events"): (None, {**_r(None, *_KEYED), 200: ("sse", False)}),
    ("GET", "/events/recent"): (None, _r(s.RecentEvent, *_KEYED, 404, many=True)),
    ("GET", "/overview"): (None, _r(s.Overview, *_KEYED)),
    ("GET", "/webhooks/deliveries"): (None, _r(s.WebhookDelivery, *_KEYED, many=True)),
    ("GET", "/policy/rules"): (None, _r(s.PolicyRules, *_KEYED)),
    ("PUT", "/policy/rules"): (s.PolicyRulesBody, _r(s.PolicyRules, *_BODY)),
    ("POST", "/policy/dry-run"): (s.DryRunBody, _r(s.DryRunAnswer, *_BODY, 404)),
    ("GET", "/ready"): (None, {200: (s.Ready, False), 503: (s.ErrorBody, False)}),
}

# Bodies that are optional (an empty body is taken as `{}`).
_OPTIONAL_BODY = frozenset(
    {
        ("POST", "/approvals/{id}/approve"),
        ("POST", "/approvals/{id}/reject"),
        ("POST", "/sessions/{id}/rollback"),
    }
)

_CURSOR = {
    "name": "cursor", "in": "query", "required": False,
    "description": "the next page: the previous answer's X-UndoLog-Next-Cursor, unchanged",
    "schema": {"type": "string", "pattern": "^[A-Za-z0-9_-]{0,400}$"},
}  # fmt: skip
_RECENT_CALLS = {
    "name": "recent_calls", "in": "query", "required": False,
    "description": f"include each session's latest calls, 0 to {MAX_RECENT_CALLS}",
    "schema": {"type": "integer", "minimum": 0, "maximum": MAX_RECENT_CALLS, "default": 0},
}  # fmt: skip
_NEXT_CURSOR = {
    "description": "present when there is a next page: pass it as `cursor`",
    "schema": {"type": "string"},
}

_QUERY: dict[tuple[str, str], list[dict[str, Any]]] = {
    ("POST", "/mcp/tool_call"): [
        {"name": "X-UndoLog-Mode", "in": "header", "required": False,
         "description": "who runs the tool; overrides the body's `mode` (empty: 400)",
         "schema": {"enum": ["proxy", "sdk"]}},
    ],
    ("GET", "/approvals"): [
        {"name": "state", "in": "query", "required": False,
         "description": "the approvals' status (default `pending`; `all`: every status)",
         "schema": {"enum": [*(str(v) for v in ApprovalStatus), ANY_STATUS],
                    "default": "pending"}},
        {"name": "limit", "in": "query", "required": False,
         "description": "1 to 500 (default 100; anything else is taken as 100)",
         "schema": {"type": "string", "default": "100"}},
        {"name": "tool", "in": "query", "required": False,
         "description": "only this tool's approvals",
         "schema": {"type": "string", "maxLength": MAX_TEXT, "pattern": s.STORABLE}},
        _CURSOR, _RECENT_CALLS,
    ],
    ("GET", "/approvals/{id}"): [
        {"name": "wait", "in": "query", "required": False,
         "description": "answer once the approval is decided, or after this many seconds "
                        "(then pending); 0 to 55, more is taken as 55 (docs/mcp.md)",
         "schema": {"type": "integer", "minimum": 0, "default": 0}},
        _RECENT_CALLS,
    ],
    ("GET", "/webhooks/deliveries"): [
        {"name": "state", "in": "query", "required": False,
         "description": "only the deliveries in this state",
         "schema": {"enum": ["pending", "delivered", "dead"]}},
        {"name": "limit", "in": "query", "required": False,
         "description": "1 to 500 (default 100; anything else: 400)",
         "schema": {"type": "integer", "minimum": 1, "maximum": 500, "default": 100}},
    ],
    ("GET", "/sessions"): [
        {"name": "limit", "in": "query", "required": False,
         "description": "1 to 500 (default 100; another integer is taken as 100)",
         "schema": {"type": "integer", "default": 100}},
        {"name": "state", "in": "query", "required": False,
         "description": "only sessions in this state",
         "schema": {"enum": sorted(SESSION_STATES)}},
        {"name": "q", "in": "query", "required": False,
         "description": "text in the session id, the creating key's name or a tool it called",
         "schema": {"type": "string", "maxLength": MAX_TEXT, "pattern": s.STORABLE}},
        _CURSOR,
    ],
    ("GET", "/events/recent"): [
        {"name": "limit", "in": "query", "required": False,
         "description": "how many of the latest events, 1 to 500 (default 50)",
         "schema": {"type": "integer", "minimum": 1, "maximum": 500, "default": 50}},
        {"name": "session_id", "in": "query", "required": False,
         "description": "only this session's events",
         "schema": {"type": "string", "maxLength": MAX_TEXT, "pattern": s.STORABLE}},
    ],
    ("GET", "/events"): [
        {"name": "last_event_id", "in": "query", "required": False,
         "description": "resume after this event id (for browsers; the header wins)",
         "schema": {"type": "integer", "minimum": 0, "maximum": MAX_EVENT_ID}},
        {"name": "Last-Event-ID", "in": "header", "required": False,
         "description": "resume after this event id: 0 to 2**63 - 1",
         "schema": {"type": "integer", "minimum": 0, "maximum": MAX_EVENT_ID}},
    ],
}  # fmt: skip

_MCP_DESCRIPTION = (
    "The MCP gateway (Streamable HTTP, JSON-RPC 2.0; see docs/mcp.md): `POST` sends a "
    "message, `GET` opens the server's event stream, `DELETE` ends the MCP session "
    "(`Mcp-Session-Id` header). Served by the MCP SDK outside FastAPI's routing: the answers "
    "follow the MCP specification, auth and limits are the proxy's."
)


def _link(operation_id: str, parameter: str, expression: str) -> dict[str, Any]:
    return {"operationId": operation_id, "parameters": {parameter: expression}}


# OpenAPI links: where an answer's ids lead (clients and stateful test tools follow them).
_EFFECT = "$response.body#/effect_id"
_SESSION = "$request.body#/session_id"
_APPROVAL = "$response.body#/approval_id"
_ENTRY = "$response.body#/undo_stack/0/entry_id"
LINKS: dict[tuple[str, str, int], dict[str, tuple[tuple[str, str], str, str]]] = {
    ("POST", "/mcp/tool_call", 200): {
        "GetEffect": (("GET", "/effects/{id}"), "id", _EFFECT),
        "CommitEffect": (("POST", "/effects/{id}/commit"), "id", _EFFECT),
        "FailEffect": (("POST", "/effects/{id}/fail"), "id", _EFFECT),
        "ResolveEffect": (("POST", "/effects/{id}/resolve"), "id", _EFFECT),
        "GetSession": (("GET", "/sessions/{id}"), "id", _SESSION),
        "RollbackSession": (("POST", "/sessions/{id}/rollback"), "id", _SESSION),
        "CompleteSession": (("POST", "/sessions/{id}/complete"), "id", _SESSION),
    },
    ("POST", "/mcp/tool_call", 202): {
        "GetApproval": (("GET", "/approvals/{id}"), "id", _APPROVAL),
        "Approve": (("POST", "/approvals/{id}/approve"), "id", _APPROVAL),
        "Reject": (("POST", "/approvals/{id}/reject"), "id", _APPROVAL),
        "GetSession": (("GET", "/sessions/{id}"), "id", _SESSION),
    },
    ("POST", "/sessions/{id}/rollback", 200): {
        "ClaimEntry": (("POST", "/undo/{entry}/claim"), "entry", _ENTRY),
        "RetryEntry": (("POST", "/undo/{entry}/retry"), "entry", _ENTRY),
        "ResolveEntry": (("POST", "/undo/{entry}/resolve"), "entry", _ENTRY),
    },
    ("POST", "/undo/{entry}/claim", 200): {
        "CompleteEntry": (("POST", "/undo/{entry}/complete"), "entry", "$response.body#/entry_id"),
        "FailEntry": (("POST", "/undo/{entry}/fail"), "entry", "$response.body#/entry_id"),
    },
}


def _content(model: Any, many: bool, schemas: dict[str, Any]) -> dict[str, Any]:
    if model == "sse":
        return {"text/event-stream": {"schema": {"type": "string"}}}
    if model is None:
        return {}
    ref: dict[str, Any] = {"$ref": _REF.format(model=model.__name__)}
    return {"application/json": {"schema": {"type": "array", "items": ref} if many else ref}}


_REQUEST_ID = {
    "description": "this request's id (the client's X-Request-Id if safe, else a new one)",
    "schema": {"type": "string"},
}
# The tool call's own headers.
_STEP_HEADER = {"description": "the call's step index", "schema": {"type": "string"}}
_COMMIT_HEADER = {
    "description": "`pending`: the result is held, its commit is still being written",
    "schema": {"enum": ["pending"]},
}


def _responses(table: dict[int, Any], schemas: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for status, (model, many) in sorted(table.items()):
        answer: dict[str, Any] = {"description": _MEANING[status]}
        content = _content(model, many, schemas)
        if content:
            answer["content"] = content
        headers: dict[str, Any] = {"X-Request-Id": _REQUEST_ID}
        if status in (409, 429, 503):  # in_progress, rate_limited, a busy store
            headers["Retry-After"] = {"description": "seconds", "schema": {"type": "string"}}
        answer["headers"] = headers
        out[str(status)] = answer
    return out


def _extra_paths(schemas: dict[str, Any]) -> dict[str, Any]:
    """The routes the edge and the MCP gateway serve outside FastAPI's routing."""
    error = _content(s.ErrorBody, False, schemas)
    health = {
        "summary": "Liveness: answers while the process serves HTTP",
        "operationId": "health",
        "security": [],
        "responses": {"200": {"description": "OK", "content": _content(s.Health, False, schemas)}},
    }
    metrics = {
        "summary": "Prometheus metrics (on this port only with a configured metrics_token)",
        "operationId": "metrics",
        "security": [{METRICS_SCHEME: []}],
        "responses": {
            "200": {"description": "the metrics, Prometheus text format",
                    "content": {"text/plain": {"schema": {"type": "string"}}}},
            "401": {"description": "missing or wrong bearer token", "content": error},
            "404": {"description": "no metrics_token configured: not served here",
                    "content": error},
            "429": {"description": _MEANING[429], "content": error},
        },
    }  # fmt: skip
    mcp: dict[str, Any] = {}
    for method in ("get", "post", "delete"):
        mcp[method] = {
            "summary": f"MCP gateway ({method.upper()})",
            "description": _MCP_DESCRIPTION,
            "operationId": f"mcp_{method}",
            "security": [{API_KEY_SCHEME: []}],
            "responses": {
                "200": {"description": "an MCP answer (JSON or an event stream)",
                        "content": {"application/json": {"schema": {}},
                                    "text/event-stream": {"schema": {"type": "string"}}}},
                **{str(k): {"description": _MEANING[k], "content": error}
                   for k in (401, 403, 429)},
            },
        }  # fmt: skip
        if method == "post":
            mcp[method]["requestBody"] = {
                "required": True,
                "content": {"application/json": {"schema": {"type": "object"}}},
            }
    return {"/health": {"get": health}, "/metrics": {"get": metrics}, "/mcp": mcp}


def _marked(schema: Any) -> Any:
    """`schema` with every `JsonValue` mark replaced by a reference to `JsonValue`."""
    if isinstance(schema, list):
        return [_marked(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    if schema.get(s.JSON_MARK):
        rest = {k: _marked(v) for k, v in schema.items() if k != s.JSON_MARK}
        return {"$ref": _REF.format(model="JsonValue"), **rest}
    return {k: _marked(v) for k, v in schema.items()}


def build_openapi(app: FastAPI) -> dict[str, Any]:
    """The document: FastAPI's paths and summaries, with the bodies and answers above."""
    doc = get_openapi(
        title=app.title,
        version=app.version,
        description=(
            "UndoLog's proxy: every tool call through an effect log, approvals, rollback. "
            "Authenticate with the `X-Api-Key` header; the key gives the org and the role."
        ),
        routes=app.routes,
    )
    bodies = [m for m, _ in ROUTES.values() if m is not None]
    models: set[type[BaseModel]] = {*bodies, s.ErrorBody, s.Health, s.Compensation}
    for _, table in ROUTES.values():
        models.update(m for m, _ in table.values() if isinstance(m, type))
    _, defs = models_json_schema(
        [(m, "serialization") for m in sorted(models, key=lambda m: m.__name__)],
        ref_template=_REF,
    )
    schemas: dict[str, Any] = _marked(dict(defs.get("$defs", {})))
    schemas["JsonValue"] = s.JSON_VALUE_SCHEMA
    doc["components"] = {
        "schemas": schemas,
        "securitySchemes": {
            API_KEY_SCHEME: {"type": "apiKey", "in": "header", "name": "X-Api-Key"},
            METRICS_SCHEME: {"type": "http", "scheme": "bearer",
                             "description": "the configured metrics_token"},
        },
    }  # fmt: skip
    for path, item in doc["paths"].items():
        for method, op in item.items():
            key = (method.upper(), path)
            body, table = ROUTES[key]
            public = path in PUBLIC_PATHS
            op["security"] = [] if public else [{API_KEY_SCHEME: []}]
            op["responses"] = _responses(table, schemas)
            params = [p for p in op.get("parameters", []) if p["in"] == "path"]
            for p in params:  # a NUL in a path is refused (400) before any route
                pattern = s.TOOL_NAME if path == "/tools/{name}" else s.STORABLE
                p["schema"] = {**p.get("schema", {}), "pattern": pattern}
            op["parameters"] = params + _QUERY.get(key, [])
            if not op["parameters"]:
                del op["parameters"]
            if body is not None:
                op["requestBody"] = {
                    "required": key not in _OPTIONAL_BODY,
                    # Inline (a copy of the component), for readers of the raw document.
                    "content": {"application/json": {"schema": dict(schemas[body.__name__])}},
                }  # fmt: skip
    ids = {
        (m.upper(), p): op["operationId"] for p, i in doc["paths"].items() for m, op in i.items()
    }
    for (method, path, status), links in LINKS.items():
        answer = doc["paths"][path][method.lower()]["responses"][str(status)]
        answer["links"] = {
            name: _link(ids[target], parameter, expression)
            for name, (target, parameter, expression) in links.items()
        }
    call = doc["paths"]["/mcp/tool_call"]["post"]
    for answered in ("200", "202"):
        call["responses"][answered]["headers"]["X-UndoLog-Step-Index"] = _STEP_HEADER
    call["responses"]["200"]["headers"][COMMIT_HEADER] = _COMMIT_HEADER
    for paged in ("/sessions", "/approvals"):
        doc["paths"][paged]["get"]["responses"]["200"]["headers"][NEXT_CURSOR_HEADER] = _NEXT_CURSOR
    doc["paths"].update(_extra_paths(schemas))
    return doc


def install_openapi(app: FastAPI) -> None:
    """Serve `build_openapi(app)` at `/openapi.json` (built once, on first use)."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = build_openapi(app)
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
