"""The demo tool server: the upstream the UndoLog proxy calls in the demo, tests and benchmarks.

It speaks the upstream tool server protocol (docs/upstreams.md: `POST /tools/{name}` answered
with a ToolResult) and keeps every effect in memory — sent messages, account balances, transfers,
records — so a test can check that a rollback really undid what a call did. It also counts how
many times each idempotency key ran each tool and logs every call in order, which is how tests
prove exactly-once execution and LIFO compensation. Some tools exist only to misbehave on demand
(`flaky`, `slow`, `broken`, `fail`) so failure paths can be driven from a test, and `echo` is as
cheap as a tool can be, for benchmarks.

Given a secret (`undolog demo-tools --secret`, or `UNDOLOG_DEMO_TOOLS_SECRET`), it accepts only
calls whose signature verifies (`undolog_sdk.upstream.verify_request`: bound to the method,
path, tool, body, org and effect, within a short window) and answers anything else 401;
without one it trusts `X-UndoLog-Org` as sent. Either way each org gets its own state. The
inspection routes (`/counters`, `/state`, `/calls`, `PUT /balances/...`, `POST /reset`, ...)
read and change every org's state without authentication, so they exist only when asked for
(`inspect=True`: `undolog demo-tools --inspect`, `undolog serve --demo`, tests); they take
`?org=` to show one org (default: every org merged).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import orjson
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from undolog.demo.args import count_arg, forward_ref, number_arg, str_arg
from undolog.demo.state import (
    DEFAULT_BALANCE,
    NO_IDEMPOTENCY_KEY,
    Args,
    DemoToolState,
    TenantState,
    ToolFailure,
    TransportFault,
)
from undolog.logs import uvicorn_log_config
from undolog_sdk.errors import InvalidUpstreamSignature
from undolog_sdk.upstream import ORG_HEADER, verify_request

__all__ = [
    "DEFAULT_BALANCE",
    "IDEMPOTENT_TOOLS",
    "TOOLS",
    "DemoToolState",
    "TenantState",
    "create_demo_tools_app",
    "run_demo_tools",
]

_JSON = "application/json"


def _maybe_fail(state: TenantState, tool: str, args: Args, key: str) -> None:
    """Let a compensation fail `fail_times` times per idempotency key before it succeeds."""
    fail_times = count_arg(args, "fail_times")
    if fail_times:
        state.fail_first(tool, key, fail_times)


# --- the tools --------------------------------------------------------------------------------


async def _send_email(state: TenantState, args: Args, key: str) -> Any:
    to = str_arg(args, "to")
    subject = str_arg(args, "subject")
    message_id = state.next_id("msg")
    state.messages[message_id] = {
        "message_id": message_id,
        "to": to,
        "subject": subject,
        "body": args.get("body"),
        "status": "sent",
    }
    return {"message_id": message_id, "to": to, "status": "sent"}


async def _undo_send_email(state: TenantState, args: Args, key: str) -> Any:
    message_id = forward_ref(args, "message_id")
    message = state.messages.get(message_id)
    if message is None:
        raise ToolFailure(404, f"unknown message '{message_id}'")
    _maybe_fail(state, "undo_send_email", args, key)
    # Recalling twice is harmless, so a retried compensation succeeds.
    message["status"] = "recalled"
    return {"recalled": message_id}


async def _transfer_funds(state: TenantState, args: Args, key: str) -> Any:
    source = str_arg(args, "from_account")
    target = str_arg(args, "to_account")
    amount = number_arg(args, "amount")
    if amount <= 0:
        raise ToolFailure(400, "argument 'amount' must be positive")
    available = state.balance(source)
    if available < amount:
        raise ToolFailure(
            422, f"insufficient funds in '{source}': balance {available}, requested {amount}"
        )
    state.balances[source] = available - amount
    state.balances[target] = state.balance(target) + amount
    transfer_id = state.next_id("txn")
    transfer = {
        "transfer_id": transfer_id,
        "from_account": source,
        "to_account": target,
        "amount": amount,
    }
    state.transfers[transfer_id] = {**transfer, "status": "completed"}
    return transfer


async def _reverse_transfer(state: TenantState, args: Args, key: str) -> Any:
    transfer_id = forward_ref(args, "transfer_id")
    transfer = state.transfers.get(transfer_id)
    if transfer is None:
        raise ToolFailure(404, f"unknown transfer '{transfer_id}'")
    _maybe_fail(state, "reverse_transfer", args, key)
    if transfer["status"] != "reversed":
        # A reversal is unconditional (the money left once, it comes back even if spent since).
        amount = transfer["amount"]
        state.balances[transfer["to_account"]] = state.balance(transfer["to_account"]) - amount
        state.balances[transfer["from_account"]] = state.balance(transfer["from_account"]) + amount
        transfer["status"] = "reversed"
    return {"reversed": transfer_id}


async def _create_record(state: TenantState, args: Args, key: str) -> Any:
    table = str_arg(args, "table")
    record_id = state.next_id("rec")
    state.records[record_id] = {
        "record_id": record_id,
        "table": table,
        "data": args.get("data"),
        "status": "active",
    }
    return {"record_id": record_id}


async def _delete_record(state: TenantState, args: Args, key: str) -> Any:
    record_id = forward_ref(args, "record_id")
    record = state.records.get(record_id)
    if record is None:
        raise ToolFailure(404, f"unknown record '{record_id}'")
    _maybe_fail(state, "delete_record", args, key)
    record["status"] = "deleted"
    return {"deleted": record_id}


async def _search_web(state: TenantState, args: Args, key: str) -> Any:
    query = str_arg(args, "query")
    slug = "-".join(query.lower().split())
    results = [
        {
            "title": f"Result {rank} for {query}",
            "url": f"https://example.com/search/{slug}/{rank}",
            "snippet": f"A deterministic demo result about {query}.",
        }
        for rank in (1, 2, 3)
    ]
    return {"query": query, "results": results}


async def _delete_database(state: TenantState, args: Args, key: str) -> Any:
    db_name = str_arg(args, "db_name")
    state.deleted_databases.append(db_name)
    return {"db_name": db_name, "status": "deleted"}


async def _publish_to_production(state: TenantState, args: Args, key: str) -> Any:
    artifact = str_arg(args, "artifact")
    state.published_artifacts.append(artifact)
    return {"artifact": artifact, "status": "published"}


async def _echo(state: TenantState, args: Args, key: str) -> Any:
    return args


async def _flaky(state: TenantState, args: Args, key: str) -> Any:
    fail_times = count_arg(args, "fail_times")
    flaky_key = args.get("key")
    if not isinstance(flaky_key, str):
        flaky_key = key
    attempt = state.fail_first("flaky", flaky_key, fail_times)
    return {"key": flaky_key, "attempt": attempt}


async def _slow(state: TenantState, args: Args, key: str) -> Any:
    seconds = number_arg(args, "seconds")
    # The delay is the behaviour under test (a tool still running when the proxy dies).
    await asyncio.sleep(seconds)
    return {"slept": seconds}


async def _broken(state: TenantState, args: Args, key: str) -> Any:
    raise TransportFault("the demo tool 'broken' crashed")


async def _fail(state: TenantState, args: Args, key: str) -> Any:
    raise ToolFailure(500, "tool failed on purpose")


ToolHandler = Callable[[TenantState, Args, str], Awaitable[Any]]

TOOLS: dict[str, ToolHandler] = {
    "send_email": _send_email,
    "undo_send_email": _undo_send_email,
    "transfer_funds": _transfer_funds,
    "reverse_transfer": _reverse_transfer,
    "create_record": _create_record,
    "delete_record": _delete_record,
    "search_web": _search_web,
    "delete_database": _delete_database,
    "publish_to_production": _publish_to_production,
    "echo": _echo,
    "flaky": _flaky,
    "slow": _slow,
    "broken": _broken,
    "fail": _fail,
}
"""Every demo tool by name. Each takes (state, args, idempotency key) and returns the output."""

IDEMPOTENT_TOOLS = frozenset({"undo_send_email", "reverse_transfer", "delete_record", "echo"})
"""Tools that honour the Idempotency-Key, as an upstream that makes re-execution harmless does.
The forward tools do not, so a test can see it when UndoLog runs one twice."""


async def _run_tool(state: TenantState, name: str, args: Args, key: str) -> Any:
    """Run a tool, deduplicating by key for `IDEMPOTENT_TOOLS`; count successful runs."""
    handler = TOOLS[name]
    dedupe = name in IDEMPOTENT_TOOLS and key != NO_IDEMPOTENCY_KEY
    slot = (name, key)
    if dedupe:
        if slot in state.completed:
            return state.completed[slot]
        running = state.inflight.get(slot)
        if running is not None:
            return await asyncio.shield(running)
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        state.inflight[slot] = future
    try:
        output = await handler(state, args, key)
    except BaseException as exc:
        if dedupe:
            state.inflight.pop(slot, None)
            if not future.done():
                future.set_exception(exc)
                future.exception()  # retrieved: a waiter-less failure is not an error
        raise
    per_key = state.executions.setdefault(name, {})
    per_key[key] = per_key.get(key, 0) + 1
    if dedupe:
        state.completed[slot] = output
        state.inflight.pop(slot, None)
        future.set_result(output)
    return output


# --- HTTP -------------------------------------------------------------------------------------


def _json(data: Any, status: int = 200) -> Response:
    return Response(orjson.dumps(data), status_code=status, media_type=_JSON)


def _tool_result(status: int, *, output: Any = None, error: str | None = None) -> Response:
    body = {"success": error is None, "output": output, "error": error}
    return Response(orjson.dumps(body), status_code=status, media_type=_JSON)


def _optional_str(body: dict[str, Any], name: str) -> str | None:
    value = body.get(name)
    if value is not None and not isinstance(value, str):
        raise ToolFailure(400, f"malformed request body: '{name}' must be a string or null")
    return value


def _state(request: Request) -> DemoToolState:
    state: DemoToolState = request.app.state.demo
    return state


def _caller_org(request: Request, raw: bytes) -> str | None:
    """The calling org: verified when the server has a secret (None: forged, unsigned, or
    signed for another request), else `X-UndoLog-Org` as sent ("" when absent)."""
    secret: str | None = request.app.state.secret
    if secret is None:
        return request.headers.get(ORG_HEADER, "")
    try:
        verified = verify_request(secret, request.headers, request.method, request.url.path, raw)
    except InvalidUpstreamSignature:
        return None
    # The path is signed; the tool named beside it must be the one this route runs.
    return verified.org_id if verified.tool == request.path_params["name"] else None


def _org_param(request: Request) -> str | None:
    """`?org=` of an inspection route: one org's view; absent: every org merged."""
    return request.query_params.get("org")


async def call_tool(request: Request) -> Response:
    """`POST /tools/{name}`: run one tool and answer with a ToolResult.

    Every call that names a known tool and has a well-formed body is counted and logged before
    the tool runs, whether it then succeeds or fails.
    """
    name: str = request.path_params["name"]
    raw = await request.body()
    bad_json: orjson.JSONDecodeError | None = None
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        body, bad_json = None, exc
    org = _caller_org(request, raw)
    if org is None:
        return _tool_result(401, error="missing or invalid X-UndoLog-Signature")
    if name not in TOOLS:
        return _tool_result(404, error=f"unknown tool '{name}'")
    if bad_json is not None:
        return _tool_result(400, error=f"malformed request body: {bad_json}")
    try:
        if not isinstance(body, dict):
            raise ToolFailure(400, "malformed request body: expected a JSON object")
        args = body.get("args", {})
        if not isinstance(args, dict):
            raise ToolFailure(400, "malformed request body: 'args' must be an object")
        session_id = _optional_str(body, "session_id")
        effect_id = _optional_str(body, "effect_id")
    except ToolFailure as failure:
        return _tool_result(failure.status, error=failure.error)

    state = _state(request)
    key = request.headers.get("idempotency-key") or effect_id or NO_IDEMPOTENCY_KEY
    state.record_call(
        name,
        key,
        args,
        request_id=request.headers.get("x-request-id"),
        session_id=session_id,
        effect_id=effect_id,
        org=org,
    )
    try:
        output = await _run_tool(state.tenant(org), name, args, key)
    except ToolFailure as failure:
        return _tool_result(failure.status, error=failure.error)
    except TransportFault as fault:
        return Response(str(fault), status_code=500, media_type="text/plain")
    return _tool_result(200, output=output)


async def health(request: Request) -> Response:
    return _json({"status": "ok"})


def _view(request: Request) -> DemoToolState | TenantState:
    """One org's state (`?org=`), or every org merged."""
    org = _org_param(request)
    state = _state(request)
    return state if org is None else state.tenant(org)


async def counters(request: Request) -> Response:
    return _json(_view(request).counters)


async def tool_counters(request: Request) -> Response:
    return _json(_view(request).counters.get(request.path_params["tool"], {}))


async def executions(request: Request) -> Response:
    return _json(_view(request).executions.get(request.path_params["tool"], {}))


async def calls(request: Request) -> Response:
    org = _org_param(request)
    return _json([c for c in _state(request).calls if org is None or c["org"] == org])


async def state_snapshot(request: Request) -> Response:
    return _json(_view(request).snapshot())


async def set_balance(request: Request) -> Response:
    """`PUT /balances/{account}` with `{"balance": n}`: give an account a starting balance."""
    account: str = request.path_params["account"]
    try:
        body = orjson.loads(await request.body())
        balance = number_arg(body, "balance") if isinstance(body, dict) else None
    except (orjson.JSONDecodeError, ToolFailure):
        balance = None
    if balance is None:
        return _json({"error": 'expected a JSON body {"balance": <number>}'}, status=400)
    _state(request).tenant(_org_param(request) or "").balances[account] = balance
    return _json({"account": account, "balance": balance})


async def reset(request: Request) -> Response:
    _state(request).reset()
    return _json({"status": "reset"})


_INSPECTION = [
    Route("/counters", counters, methods=["GET"]),
    Route("/counters/{tool}", tool_counters, methods=["GET"]),
    Route("/executions/{tool}", executions, methods=["GET"]),
    Route("/calls", calls, methods=["GET"]),
    Route("/state", state_snapshot, methods=["GET"]),
    Route("/balances/{account}", set_balance, methods=["PUT"]),
    Route("/reset", reset, methods=["POST"]),
]


def create_demo_tools_app(
    state: DemoToolState | None = None, *, secret: str | None = None, inspect: bool = False
) -> Starlette:
    """Build the demo tool server.

    Args:
        state: where the tools keep their effects; a fresh one when omitted. It is also
            reachable as `app.state.demo`.
        secret: the upstream secret the proxy signs calls with; given, a call whose
            signature does not verify is answered 401 and not run.
        inspect: also serve the inspection and control routes (`/counters`,
            `/counters/{tool}`, `/executions/{tool}`, `/calls`, `/state`,
            `PUT /balances/{account}`, `POST /reset`). They are not authenticated and show
            (or reset) every org's state, so they are off unless asked for: without them
            those paths answer 404.

    Returns:
        The Starlette app: `POST /tools/{name}` and `/health`, plus the inspection routes
        when `inspect`.
    """
    routes = [
        Route("/tools/{name}", call_tool, methods=["POST"]),
        Route("/health", health, methods=["GET"]),
    ]
    app = Starlette(routes=routes + (_INSPECTION if inspect else []))
    app.state.demo = state if state is not None else DemoToolState()
    app.state.secret = secret or None
    return app


async def run_demo_tools(
    host: str, port: int, *, secret: str | None = None, inspect: bool = False
) -> None:
    """Serve the demo tool server with uvicorn until a signal or cancellation stops it.

    Used by `undolog demo-tools`, and as a task beside the proxy by `undolog serve --demo`:
    cancelling the task shuts the server down and closes its listening socket.
    """
    config = uvicorn.Config(
        create_demo_tools_app(secret=secret, inspect=inspect),
        host=host,
        port=port,
        log_level="info",
        access_log=False,
        log_config=uvicorn_log_config(),
    )
    server = uvicorn.Server(config)
    try:
        await server.serve()
    except asyncio.CancelledError:
        # uvicorn leaves its listening socket open when its task is cancelled.
        if server.started:
            await server.shutdown()
        raise
