"""`/mcp`: UndoLog as an MCP server (Streamable HTTP) in front of the upstream MCP servers.

Both protocol eras are served by one stateless `StreamableHTTPSessionManager` of the official
`mcp` package: a request whose `MCP-Protocol-Version` header names a 2026-07-28-era version goes
to the modern single-exchange path, anything else to the handshake era (2025-11-25) without
server-side sessions. Every request has already passed the proxy's edge, so it carries the API
key's org in `scope["state"]["org_id"]`.

Upstreams belong to orgs (docs/mcp.md, "Orgs"): every handler works on the calling org's view
of them (`UpstreamPool.for_org`), so an org lists, calls, reads and gets only through the
upstreams open to it, and each upstream is told which org is asking.

`tools/list` merges the upstreams' tools under their prefixes. `tools/call` goes through the
engine like any call: the session comes from the `X-UndoLog-Session-Id` header (or the
`undolog/session_id` key of `_meta`), the engine assigns the step, and:

| engine answer | MCP answer |
|---|---|
| Execute | the upstream runs it; its `CallToolResult` is recorded and returned |
| Replay | the recorded `CallToolResult`; the upstream does not run |
| AwaitingApproval | an `isError` result naming the approval and how to retry (*) |
| a refusal (`in_progress`, `approval_rejected`, `session_closed`, ...) | an `isError` result |
| bad input, an unknown tool | a JSON-RPC error (`-32602`) |
| the engine's own failure | a JSON-RPC error (`-32603`) |

(*) A 2026-07-28 client that can open URLs (URL-mode elicitation) gets the spec's
`input_required` result instead: its user is sent to the approval page, and the client's
automatic retry returns the result once the call is approved (or the plain answer if not yet).

An MCP client never sends a step, so the engine assigns one: a call identical (same tool, same
arguments) to an earlier call of the session whose answer this client has not received (still
running, awaiting approval, or sent when the client had gone) is a retry of it; any other call
takes the session's next step. The gateway tells the engine which answers went out
(`undolog.services.delivery`): a retry after an approval returns the approved run's result, a write
whose answer was lost is not run twice, and a deliberate repeat runs again.

Resources and prompts have no side effects, so they pass through and nothing is recorded:
`prompts/list` and `resources/list`/`resources/templates/list` merge the upstreams' (prompts
under the prefixes, resource URIs unchanged), `prompts/get` and `resources/read` go to the
upstream the item came from (`UpstreamPool` has the routing rule). The lowlevel server derives
its capabilities from its handlers, so these are added, and the `resources` and `prompts`
capabilities advertised, once an upstream has declared them; resource subscriptions are not
served.

A 2025-11-25 client may augment `tools/call` with `task` (the spec's tasks utility): it gets a
task instead of the result, `input_required` while the call waits for a person, and the result
from `tasks/result` (`undolog.mcp.tasks`).
"""

from __future__ import annotations

import contextlib
import contextvars
import uuid
from collections.abc import AsyncIterator, Iterable
from typing import TYPE_CHECKING, Any

import orjson
from mcp import MCPError
from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp_types import (
    INTERNAL_ERROR,
    INVALID_PARAMS,
    INVALID_REQUEST,
    METHOD_NOT_FOUND,
    CallToolRequestParams,
    CallToolResult,
    ElicitRequest,
    ElicitRequestURLParams,
    GetPromptRequestParams,
    GetPromptResult,
    GetTaskPayloadRequestParams,
    GetTaskRequestParams,
    InputRequiredResult,
    ListPromptsResult,
    ListResourcesResult,
    ListResourceTemplatesResult,
    ListToolsResult,
    PaginatedRequestParams,
    ReadResourceRequestParams,
    ReadResourceResult,
    ToolExecution,
)
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

import undolog
from undolog.answer_watch import AnswerWatch
from undolog.engine import Decision
from undolog.mcp.config import McpSettings, check_mcp_orgs
from undolog.mcp.errors import mapped, same_origin
from undolog.mcp.link import Capability
from undolog.mcp.requests import (
    ANSWERS_KEY,
    SESSION_HEADER,
    SESSION_META_KEY,
    WATCH_KEY,
    actor_of,
    approval_url,
    asks_for_task,
    can_open_urls,
    request_state,
    session_id_of,
    traceparent_from,
)
from undolog.mcp.results import awaiting, awaiting_text, recorded_result, refusal, with_meta
from undolog.mcp.tasks import TASK_CALL_KEY, McpTasks, TaskCall, TaskServer
from undolog.mcp.toolserver import ToolServerTools
from undolog.mcp.upstreams import GatewayTool, OrgUpstreams, UpstreamPool
from undolog.services.calls import Call, CallOutcome, CallStatus, refused, run_call
from undolog.services.decisions import wait_for_decision
from undolog.services.delivery import Delivery
from undolog.services.executor import ToolTransportError
from undolog.services.waits import TooManyWaits
from undolog_sdk.errors import (
    InvalidRequest,
    ToolError,
    ToolNotRegistered,
    UndoLogError,
)
from undolog_sdk.signature import canonical_json
from undolog_sdk.tier import ToolTier

if TYPE_CHECKING:
    from undolog.runtime import Runtime

__all__ = ["SESSION_HEADER", "SESSION_META_KEY", "McpGateway"]

APPROVAL_INPUT = "undolog_approval"  # the key of our request in an `input_required` result

# Tools a handshake-era client may call as tasks (`tools/list`, `execution.taskSupport`).
TASK_OPTIONAL = ToolExecution(task_support="optional")

# The org of the request being handled, for the one hook the MCP server calls without a request
# context (`get_tool_input_schema`): a tool's schema is looked up among the caller's tools.
_CALLER: contextvars.ContextVar[str | None] = contextvars.ContextVar("mcp_caller", default=None)


class McpGateway:
    """The `/mcp` ASGI endpoint; `serving(runtime)` runs it inside the proxy's lifespan."""

    def __init__(
        self, settings: McpSettings, *, timeout_seconds: float, org_ids: Iterable[str] = ()
    ) -> None:
        """`org_ids`: the config's orgs, whose upstreams are connected at start.

        Raises:
            ValueError: an upstream several orgs would share unknowingly (`check_mcp_orgs`):
                settings built in code are refused as a config file is.
        """
        self._org_ids = tuple(org_ids)
        check_mcp_orgs(settings, self._org_ids)
        self.settings = settings
        self.pool = UpstreamPool(settings.upstreams, timeout_seconds=timeout_seconds)
        # The HTTP tool server's tools published as they are (`serve --demo`'s demo tools).
        self.tool_server = ToolServerTools(settings.tool_server_tools)
        self.tasks = McpTasks(settings.approval_url)
        self.server = TaskServer(
            "undolog",
            version=undolog.__version__,
            instructions=(
                "Tools of several MCP servers behind UndoLog: calls are recorded exactly once, "
                "can be undone, and irreversible ones wait for a person's approval."
            ),
            # The 2026-07-28 path checks a call's `Mcp-Param-*` headers against the tool's
            # schema: from the tools already listed, not a fresh listing of every upstream.
            get_tool_input_schema=self._input_schema,
            on_list_tools=self._list_tools,
            on_call_tool=self._call_tool,
        )
        self.server.add_request_handler("tasks/get", GetTaskRequestParams, self._get_task)
        self.server.add_request_handler(
            "tasks/result", GetTaskPayloadRequestParams, self._task_result
        )
        self.server.middleware.append(self._as_task)
        self._manager: StreamableHTTPSessionManager | None = None
        self._runtime: Runtime | None = None
        self._registered: dict[tuple[str, str], tuple[str, str | None]] = {}
        self._advertised: set[Capability] = set()

    @contextlib.asynccontextmanager
    async def serving(self, runtime: Runtime) -> AsyncIterator[None]:
        """Connect the upstreams, route their tools from the executor, serve `/mcp`."""
        await self.pool.start(self._org_ids)
        routed = bool(self.pool.upstreams)  # no upstreams: keep the executor's path bare
        if routed:
            runtime.executor.routers.append(self.pool)
        self._runtime = runtime
        # Stateless: no server-side MCP sessions (the UndoLog session is the client's header),
        # so any proxy instance can answer any request. JSON answers: one response per POST.
        # A manager runs once: a new one per lifespan.
        manager = StreamableHTTPSessionManager(self.server, stateless=True, json_response=True)
        try:
            async with manager.run():
                self._manager = manager
                yield
        finally:
            self._manager = None
            self._runtime = None
            if routed:
                runtime.executor.routers.remove(self.pool)
            await self.pool.close()

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
        origin = headers.get("origin")
        if (
            origin
            and origin not in self.settings.allowed_origins
            and not same_origin(origin, headers.get("host"))
        ):
            # The spec: a server MUST validate Origin, and answer 403 to an invalid one
            # (a web page must not reach a local server through the user's browser).
            body = orjson.dumps(
                {
                    "jsonrpc": "2.0",
                    "id": None,
                    "error": {"code": INVALID_REQUEST, "message": "Origin not allowed"},
                }
            )
            await send(
                {
                    "type": "http.response.start",
                    "status": 403,
                    "headers": [(b"content-type", b"application/json")],
                }
            )
            await send({"type": "http.response.body", "body": body})
            return
        if self._manager is None or self._runtime is None:  # pragma: no cover - lifespan
            raise RuntimeError("the MCP gateway is not running")
        org_id = scope.get("state", {}).get("org_id")
        if org_id is not None:
            _CALLER.set(org_id)  # this request's task (and those it starts) only
            await self.pool.for_org(org_id).ready()  # an org's first request connects it
        self._advertise()
        if scope["method"] != "POST":
            await self._manager.handle_request(scope, receive, send)
            return
        # The edge has read the body already: past it, `receive` only reports the client
        # leaving, which is what tells a lost answer from a delivered one.
        first = await receive()
        replayed = False

        async def receive_body() -> Any:
            nonlocal replayed
            if not replayed:
                replayed = True
                return first
            return await receive()

        answers: list[Delivery] = []
        watch = AnswerWatch(receive)
        scope.setdefault("state", {}).update({ANSWERS_KEY: answers, WATCH_KEY: watch})
        try:
            await self._manager.handle_request(scope, receive_body, watch.wrap(send))
        finally:
            await watch.close()
            if answers:
                await self._runtime.deliveries.finish(answers, sent=watch.sent)

    def _advertise(self) -> None:
        """Serve resources and prompts once an upstream has declared them (see the docstring).

        Before each request, so that `initialize` and `server/discover` advertise them. A
        handler stays once added: a client told of a capability may use it later.
        """
        new = self.pool.offered() - self._advertised
        add = self.server.add_request_handler
        if "resources" in new:
            add("resources/list", PaginatedRequestParams, self._list_resources)
            add("resources/templates/list", PaginatedRequestParams, self._list_templates)
            add("resources/read", ReadResourceRequestParams, self._read_resource)
        if "prompts" in new:
            add("prompts/list", PaginatedRequestParams, self._list_prompts)
            add("prompts/get", GetPromptRequestParams, self._get_prompt)
        self._advertised |= new

    # -- MCP handlers --------------------------------------------------------------------------

    def _upstreams(self, ctx: ServerRequestContext[Any]) -> OrgUpstreams:
        """The calling org's upstreams."""
        org_id = request_state(ctx).get("org_id")
        if org_id is None:
            raise MCPError(INVALID_REQUEST, "the gateway is not serving this request")
        return self.pool.for_org(str(org_id))

    def _input_schema(self, name: str) -> dict[str, Any] | None:
        org_id = _CALLER.get()
        published = self.tool_server.get(org_id, name) if org_id is not None else None
        if published is not None:
            return dict(published.input_schema)
        tool = self.pool.for_org(org_id).get(name) if org_id is not None else None
        return tool.tool.input_schema if tool is not None else None

    @mapped
    async def _list_tools(
        self, ctx: ServerRequestContext[Any], params: PaginatedRequestParams | None
    ) -> ListToolsResult:
        tools = [t.tool for t in await self._upstreams(ctx).refresh_tools()]
        if self._runtime is not None:
            org_id = str(request_state(ctx).get("org_id"))
            tools += await self.tool_server.listed(self._runtime, org_id)
        if ctx.protocol_version not in MODERN_PROTOCOL_VERSIONS:
            tools = [t.model_copy(update={"execution": TASK_OPTIONAL}) for t in tools]
        return ListToolsResult(tools=tools)

    # Resources and prompts are read-only: straight to the upstreams, nothing is recorded. The
    # pool raises `MCPError`s (unknown item, upstream down, the upstream's own error).

    @mapped
    async def _list_resources(
        self, ctx: ServerRequestContext[Any], params: PaginatedRequestParams | None
    ) -> ListResourcesResult:
        return ListResourcesResult(resources=await self._upstreams(ctx).list_resources())

    @mapped
    async def _list_templates(
        self, ctx: ServerRequestContext[Any], params: PaginatedRequestParams | None
    ) -> ListResourceTemplatesResult:
        templates = await self._upstreams(ctx).list_resource_templates()
        return ListResourceTemplatesResult(resource_templates=templates)

    @mapped
    async def _read_resource(
        self, ctx: ServerRequestContext[Any], params: ReadResourceRequestParams
    ) -> ReadResourceResult:
        return await self._upstreams(ctx).read_resource(params.uri)

    @mapped
    async def _list_prompts(
        self, ctx: ServerRequestContext[Any], params: PaginatedRequestParams | None
    ) -> ListPromptsResult:
        return ListPromptsResult(prompts=await self._upstreams(ctx).list_prompts())

    @mapped
    async def _get_prompt(
        self, ctx: ServerRequestContext[Any], params: GetPromptRequestParams
    ) -> GetPromptResult:
        return await self._upstreams(ctx).get_prompt(params.name, params.arguments)

    @mapped
    async def _call_tool(
        self, ctx: ServerRequestContext[Any], params: CallToolRequestParams
    ) -> CallToolResult | InputRequiredResult:
        """`tools/call`: the MCP adapter over `undolog.services.calls.run_call`."""
        runtime = self._runtime
        state = request_state(ctx)
        org_id = state.get("org_id")
        if runtime is None or org_id is None:
            raise MCPError(INVALID_REQUEST, "the gateway is not serving this request")
        args = params.arguments or {}
        session_id = session_id_of(ctx, ctx.request)
        request_id = state.get("request_id") or str(uuid.uuid4())
        upstreams = self.pool.for_org(org_id)  # another org's upstream's tool is unknown here
        tool = upstreams.get(params.name)
        published_tier = None
        if tool is None and self.tool_server.get(org_id, params.name) is not None:
            published_tier = await self.tool_server.tier(runtime, org_id, params.name)
        if tool is None and published_tier is None:
            await upstreams.refresh_tools()
            tool = upstreams.get(params.name)
        if tool is None and published_tier is None:
            down = upstreams.unavailable(params.name)  # probably a real tool: nothing is recorded
            if down is not None:
                return refusal(ToolError(down))
            raise MCPError(INVALID_PARAMS, f"Unknown tool: {params.name}")
        tier = tool.tier if tool is not None else published_tier
        if session_id is None:
            if tier == ToolTier.SAFE.value:  # a read needs no session: nothing is recorded
                try:
                    if tool is None:
                        return await self.tool_server.pass_through(
                            runtime, org_id, params.name, args, request_id
                        )
                    return await upstreams.call_upstream(tool.name, args)
                except ToolTransportError as exc:
                    return refusal(ToolError(str(exc)))
            raise MCPError(
                INVALID_PARAMS,
                f"'{params.name}' is recorded by UndoLog and needs a session: send the header "
                "X-UndoLog-Session-Id (a UUID) or _meta['undolog/session_id']",
            )
        as_task = asks_for_task(ctx)  # not held for a decision: the task is the wait
        try:
            if tool is not None:  # a published tool's registration is the registry's own
                await self._register(runtime, org_id, tool)
        except UndoLogError as exc:
            log = runtime.log.bind(request_id=request_id, org_id=org_id, session_id=session_id)
            outcome = refused(exc, log)
        else:
            call = Call(
                org_id,
                session_id,
                params.name,
                args,
                actor=actor_of(state),
                traceparent=traceparent_from(ctx, ctx.request),
            )
            outcome = await run_call(runtime, call, request_id)
            pending = outcome.status is CallStatus.PENDING_APPROVAL
            if pending and not as_task and not self._asks_urls(ctx, params):
                outcome = await self._wait_for_decision(runtime, state, call, outcome, request_id)
        answered = outcome.answered
        if as_task:  # answered by its task (`_as_task`), and delivered by tasks/result
            pending = outcome.status is CallStatus.PENDING_APPROVAL
            decision = outcome.decision if pending else answered
            if decision is not None and decision.logged:
                state[TASK_CALL_KEY] = TaskCall(session_id, decision, waiting=pending)
        elif answered is not None:
            self._answering(runtime, state, org_id, session_id, answered)
        return self._render(ctx, params, outcome)

    async def _as_task(self, ctx: ServerRequestContext[Any], call_next: CallNext) -> HandlerResult:
        """Middleware: a task-augmented `tools/call` runs as any call (its protocol errors
        stay errors), then is answered with its task (`CreateTaskResult`, which the lowlevel
        server's result check for `tools/call` would refuse in a handler)."""
        if not asks_for_task(ctx):
            return await call_next(ctx)
        return await self._create_task(ctx, await call_next(ctx))

    @mapped
    async def _create_task(self, ctx: ServerRequestContext[Any], answer: Any) -> dict[str, Any]:
        runtime = self._runtime
        if runtime is None or not isinstance(answer, dict):  # pragma: no cover - lifespan
            raise MCPError(INVALID_REQUEST, "the gateway is not serving this request")
        return await self.tasks.create(runtime, ctx, answer)

    @mapped
    async def _get_task(
        self, ctx: ServerRequestContext[Any], params: GetTaskRequestParams
    ) -> dict[str, Any]:
        return await self.tasks.get(self._task_runtime(ctx), ctx, params.task_id)

    @mapped
    async def _task_result(
        self, ctx: ServerRequestContext[Any], params: GetTaskPayloadRequestParams
    ) -> dict[str, Any]:
        return await self.tasks.result(self._task_runtime(ctx), ctx, params.task_id)

    def _task_runtime(self, ctx: ServerRequestContext[Any]) -> Runtime:
        if ctx.protocol_version in MODERN_PROTOCOL_VERSIONS:  # tasks left the core there
            raise MCPError(METHOD_NOT_FOUND, "Method not found")
        if self._runtime is None:  # pragma: no cover - lifespan
            raise MCPError(INVALID_REQUEST, "the gateway is not serving this request")
        return self._runtime

    def _render(
        self, ctx: ServerRequestContext[Any], params: CallToolRequestParams, outcome: CallOutcome
    ) -> CallToolResult | InputRequiredResult:
        """A call's outcome as MCP answers it (the table in the module docstring)."""
        error = outcome.error
        if outcome.status is CallStatus.INTERCEPT_FAILED:
            assert error is not None
            raise MCPError(INTERNAL_ERROR, f"UndoLog could not record the call: {error.message}")
        if outcome.status is CallStatus.REFUSED and isinstance(error, InvalidRequest):
            raise MCPError(INVALID_PARAMS, error.message)
        if error is not None:  # refused by UndoLog, or the upstream gave no result
            return refusal(error)
        decision = outcome.decision
        assert decision is not None
        runtime = self._runtime
        retry_after = runtime.retry_after_seconds if runtime is not None else 0
        if outcome.status is CallStatus.REPLAYED:
            return with_meta(recorded_result(outcome.result_json), decision, CallStatus.REPLAYED)
        if outcome.status is CallStatus.PENDING_APPROVAL:
            # A client that has already answered our request is not asked again: it gets the
            # plain answer, and retries when it sees fit.
            if self._asks_urls(ctx, params):
                return self._input_required(decision, ctx.request, retry_after)
            return awaiting(decision, retry_after)
        status = CallStatus.EXECUTED if decision.logged else "passed_through"  # SAFE: not recorded
        return with_meta(recorded_result(outcome.result_json), decision, status)

    # -- helpers -------------------------------------------------------------------------------

    @staticmethod
    def _asks_urls(ctx: ServerRequestContext[Any], params: CallToolRequestParams) -> bool:
        """Whether a pending approval is answered with `input_required` (a URL to open)."""
        return params.input_responses is None and can_open_urls(ctx)

    async def _wait_for_decision(
        self,
        runtime: Runtime,
        state: dict[str, Any],
        call: Call,
        pending: CallOutcome,
        request_id: str,
    ) -> CallOutcome:
        """Hold a call that waits for a person up to `approval_wait_seconds`: once it is
        decided (and an approved run has finished), the call again — the approved run's
        result replayed, or the refusal. Otherwise, or over the wait caps, `pending`."""
        decision = pending.decision
        if decision is None or decision.approval_id is None:
            return pending
        try:
            decided = await wait_for_decision(
                runtime, call.org_id, decision.approval_id, decision.effect_id,
                key_id=str(state.get("key_id") or ""),
                seconds=self.settings.approval_wait_seconds, run_finished=True,
            )  # fmt: skip
        except TooManyWaits:
            return pending
        return await run_call(runtime, call, request_id) if decided else pending

    def _input_required(
        self, decision: Decision, request: Any, retry_after: int
    ) -> InputRequiredResult:
        """The spec's way to pause a call for a person: send the user to the approval page."""
        assert decision.approval_id is not None
        url = approval_url(self.settings.approval_url, decision.approval_id, request)
        ask = ElicitRequestURLParams(
            message=awaiting_text(decision, retry_after) + f" Approve it at {url}",
            url=url,
        )
        return InputRequiredResult(input_requests={APPROVAL_INPUT: ElicitRequest(params=ask)})

    async def _register(self, runtime: Runtime, org_id: str, tool: GatewayTool) -> None:
        """Register the tool for the org with its current tier (once per process and policy,
        and again whenever the stored tier is not the gateway's: the config always wins,
        whatever the registry was told since)."""
        compensation = tool.compensation()
        policy = (tool.tier, canonical_json(compensation) if compensation else None)
        if self._registered.get((org_id, tool.name)) == policy:
            try:
                stored = await runtime.engine.get_tool(org_id, tool.name)  # cached briefly
            except ToolNotRegistered:
                stored = None
            if stored is not None and stored.tier == tool.tier:
                return
        await runtime.engine.register_tool(
            org_id, tool.name, tier=tool.tier, compensation=compensation
        )
        self._registered[(org_id, tool.name)] = policy

    @staticmethod
    def _answering(
        runtime: Runtime, state: dict[str, Any], org_id: str, session_id: str, decision: Decision
    ) -> None:
        """This answer ends a recorded call: `__call__` marks it delivered once it is sent."""
        answers = state.get(ANSWERS_KEY)
        if decision.logged and answers is not None:
            answers.append(runtime.deliveries.begin(org_id, session_id, decision.effect_id))
