"""MCP Tasks (the 2025-11-25 spec's tasks utility) over the gateway's `tools/call`.

A handshake-era client that augments `tools/call` with `task` gets a `CreateTaskResult`
instead of the tool's result. A call that waits for a person is not held: its task is
`input_required` at once, naming the approval and where to decide it. Any other call runs as
it would without `task` (synchronously), and its task is created `completed` (or `failed`,
when the result is an error). `tasks/get` and `tasks/result` then answer from the store, so
any proxy process answers them (docs/mcp.md, "MCP Tasks"). The status a task ends in is
final: the first read that finds a waiting task ended keeps its answer with the task, so a
later move of its effect (an in-doubt effect resolved, say) does not change it:

| the call | task status | `tasks/result` |
|---|---|---|
| ended at once | `completed` / `failed` (`isError`) | the answer it gave, kept with the task |
| approval pending | `input_required` | blocks until the task ends |
| approved, its run not finished | `working` | blocks until the task ends |
| the approved run committed | `completed` / `failed` (`isError`) | its result, replayed |
| the approved run failed, or is in doubt | `failed` | the refusal `tools/call` gives |
| rejected / timed out | `failed` | the refusal |

Task ids are random (UUID4) and looked up within the caller's org; an agent key sees only the
tasks its own calls created. Anything else, a malformed id included (it never reaches the store),
is "task not found" (`-32602`). `tasks/list` and
`tasks/cancel` are not served (nor declared).
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import orjson
from mcp import MCPError
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel import NotificationOptions, Server
from mcp_types import (
    INVALID_PARAMS,
    INVALID_REQUEST,
    CallToolResult,
    ServerCapabilities,
    ServerTasksCapability,
    ServerTasksRequestsCapability,
    TasksCallCapability,
    TaskStatus,
    TasksToolsCapability,
)
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from undolog.answer_watch import AnswerWatch
from undolog.engine import Decision
from undolog.engine.model import now_us
from undolog.engine.states import REPLAYABLE_STATES
from undolog.mcp.requests import ANSWERS_KEY, WATCH_KEY, actor_of, approval_url, request_state
from undolog.mcp.results import approval_text, effect_meta, recorded_result, refusal
from undolog.services.waits import MAX_WAIT_SECONDS, TooManyWaits
from undolog.store.records import ApprovalRecord, EffectRecord, McpTaskRecord
from undolog_sdk.errors import (
    ApprovalRejected,
    ApprovalTimedOut,
    EffectInDoubt,
    ToolError,
)
from undolog_sdk.wire import ApprovalStatus, CallStatus, EffectState

if TYPE_CHECKING:
    from undolog.runtime import Runtime

__all__ = [
    "DEFAULT_TTL_MS",
    "MAX_TTL_MS",
    "MIN_TTL_MS",
    "RELATED_TASK",
    "TASK_CALL_KEY",
    "McpTasks",
    "TaskCall",
    "TaskServer",
    "TaskView",
    "task_view",
]

RELATED_TASK = "io.modelcontextprotocol/related-task"
IMMEDIATE_RESPONSE = "io.modelcontextprotocol/model-immediate-response"
TASK_CALL_KEY = "undolog_task_call"  # scope state: what `tools/call` left for its task

# A task lives as long as its client asks, within these bounds (the spec lets a receiver
# override the requested ttl); it may be deleted once its ttl has passed since its creation.
DEFAULT_TTL_MS = 24 * 3600 * 1000
MIN_TTL_MS = 60 * 1000
MAX_TTL_MS = 7 * 24 * 3600 * 1000
EXPIRED_BATCH = 100  # expired tasks deleted per task created

NOT_FOUND = "Failed to retrieve task: Task not found"

TASKS_CAPABILITY = ServerTasksCapability(
    requests=ServerTasksRequestsCapability(tools=TasksToolsCapability(call=TasksCallCapability()))
)


class TaskServer(Server[Any]):
    """The lowlevel server, declaring task-augmented `tools/call` in the handshake era (the
    lowlevel server derives its capabilities from its handlers, and has none for tasks)."""

    def get_capabilities(
        self,
        notification_options: NotificationOptions | None = None,
        experimental_capabilities: dict[str, dict[str, Any]] | None = None,
        extensions: dict[str, dict[str, Any]] | None = None,
        *,
        protocol_version: str | None = None,
    ) -> ServerCapabilities:
        capabilities = super().get_capabilities(
            notification_options,
            experimental_capabilities,
            extensions,
            protocol_version=protocol_version,
        )
        if protocol_version in MODERN_PROTOCOL_VERSIONS:
            return capabilities  # 2026-07-28: tasks are an extension there, not served
        return capabilities.model_copy(update={"tasks": TASKS_CAPABILITY})


@dataclass(frozen=True, slots=True)
class TaskCall:
    """What a task-augmented `tools/call` leaves for its task: its session, and the engine's
    decision when the call waits for a person (`waiting`) or its answer ends a recorded call."""

    session_id: str
    decision: Decision
    waiting: bool


@dataclass(frozen=True, slots=True)
class TaskView:
    """A task as it stands: its status and, once it has ended, the answer (`CallToolResult`
    wire JSON) and whether that answer ends a recorded call (its delivery is marked)."""

    status: TaskStatus
    message: str | None
    updated_us: int
    result: dict[str, Any] | None = None
    answers_effect: bool = False

    @property
    def ended(self) -> bool:
        return self.result is not None


def _ended(result: CallToolResult | dict[str, Any], updated_us: int, *, answers: bool) -> TaskView:
    wire = (
        result.model_dump(by_alias=True, mode="json", exclude_none=True)
        if isinstance(result, CallToolResult)
        else result
    )
    failed = bool(wire.get("isError"))
    status: TaskStatus = "failed" if failed else "completed"
    message = "The tool call ended with an error." if failed else "The tool call completed."
    return TaskView(status, message, updated_us, wire, answers)


def task_view(
    task: McpTaskRecord,
    approval: ApprovalRecord | None,
    effect: EffectRecord | None,
    waiting_message: str,
) -> TaskView | None:
    """The task's state from its rows (pure); None when they are gone (pruned)."""
    if task.result_json is not None:
        if task.ended_us is not None:  # it waited, then ended: the answer kept then
            return _ended(
                orjson.loads(task.result_json), task.ended_us, answers=task.answers_effect
            )
        return _ended(
            orjson.loads(task.result_json), task.created_us, answers=task.effect_id is not None
        )
    if approval is None or effect is None:
        return None
    updated = max(task.created_us, effect.updated_us, approval.decided_us or 0)
    state = effect.state
    if state in REPLAYABLE_STATES:
        result = effect_meta(
            recorded_result(effect.result_json),
            effect.effect_id,
            effect.step_index,
            CallStatus.REPLAYED,
        )
        return _ended(result, updated, answers=True)
    if state == EffectState.FAILED:
        failure = refusal(ToolError(effect.error or "the tool call failed"))
        return _ended(failure, updated, answers=True)
    if state == EffectState.REJECTED:
        return _ended(refusal(ApprovalRejected(approval.approval_id, approval.reason)), updated,
                      answers=False)  # fmt: skip
    if state == EffectState.TIMED_OUT:
        return _ended(refusal(ApprovalTimedOut(approval.approval_id)), updated, answers=False)
    if state == EffectState.IN_DOUBT:
        return _ended(refusal(EffectInDoubt(effect.effect_id)), updated, answers=False)
    if state == EffectState.AWAITING_APPROVAL and approval.status == ApprovalStatus.PENDING:
        return TaskView("input_required", waiting_message, updated)
    return TaskView("working", "Approved: the tool call is running.", updated)


def _iso(us: int) -> str:
    moment = datetime.fromtimestamp(us / 1_000_000, UTC)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


class McpTasks:
    """Creates tasks for task-augmented calls and answers `tasks/get` and `tasks/result`."""

    def __init__(self, approval_url_template: str | None) -> None:
        self.approval_url_template = approval_url_template

    # -- tools/call ----------------------------------------------------------------------------

    async def create(
        self, runtime: Runtime, ctx: ServerRequestContext[Any], answer: dict[str, Any]
    ) -> dict[str, Any]:
        """The `CreateTaskResult` of a task-augmented call whose `tools/call` answered
        `answer` (left aside while the call waits for a person)."""
        state = request_state(ctx)
        params = ctx.params if isinstance(ctx.params, dict) else {}
        call: TaskCall | None = state.pop(TASK_CALL_KEY, None)
        decision = call.decision if call is not None else None
        waiting = call is not None and call.waiting
        now = now_us()
        ttl = _ttl(params.get("task"))
        task = McpTaskRecord(
            task_id=str(uuid.uuid4()),
            org_id=str(state["org_id"]),
            owner_key_id=actor_of(state).key_id,
            session_id=call.session_id if call is not None else None,
            effect_id=decision.effect_id if decision is not None else None,
            approval_id=decision.approval_id if waiting and decision is not None else None,
            tool_name=str(params.get("name", "")),
            result_json=None if waiting else orjson.dumps(answer).decode(),
            created_us=now,
            ttl_ms=ttl,
            expires_us=now + ttl * 1000,
        )
        async with runtime.store.transaction() as q:
            await q.delete_expired_mcp_tasks(task.org_id, now, EXPIRED_BATCH)
            await q.insert_mcp_task(task)
        view = (
            TaskView("input_required", self._waiting(task, ctx.request), now)
            if waiting
            else task_view(task, None, None, "")
        )
        assert view is not None
        result: dict[str, Any] = {"task": self._wire(runtime, task, view)}
        if waiting:
            result["_meta"] = {
                IMMEDIATE_RESPONSE: (
                    f"'{task.tool_name}' waits for a person to approve it (approval "
                    f"{task.approval_id}); it has not run. Task {task.task_id} ends when the "
                    "approval is decided: its result comes from tasks/result."
                )
            }
        return result

    # -- tasks/get, tasks/result ---------------------------------------------------------------

    async def get(
        self, runtime: Runtime, ctx: ServerRequestContext[Any], task_id: str
    ) -> dict[str, Any]:
        task = await self._find(runtime, ctx, task_id)
        view = await self._view(runtime, task, ctx.request)
        return self._wire(runtime, task, view)

    async def result(
        self, runtime: Runtime, ctx: ServerRequestContext[Any], task_id: str
    ) -> dict[str, Any]:
        """The task's answer: exactly what its `tools/call` answers, once the task has ended
        (until then this waits, woken by the effect's events, while the client is there)."""
        task = await self._find(runtime, ctx, task_id)
        view = await self._view(runtime, task, ctx.request)
        if not view.ended:
            view = await self._wait(runtime, ctx, task)
        assert view.result is not None
        state = request_state(ctx)
        answers = state.get(ANSWERS_KEY)
        if view.answers_effect and answers is not None and task.session_id and task.effect_id:
            # Delivered like a tools/call answer: an identical call after it is a new call.
            answers.append(runtime.deliveries.begin(task.org_id, task.session_id, task.effect_id))
        result = dict(view.result)
        result["_meta"] = {**(result.get("_meta") or {}), RELATED_TASK: {"taskId": task.task_id}}
        return result

    async def _wait(
        self, runtime: Runtime, ctx: ServerRequestContext[Any], task: McpTaskRecord
    ) -> TaskView:
        """Wait until the task ends, in rounds of the longest wait, while the client is
        connected. One wait slot of the key's and the process's caps for all of it."""
        state = request_state(ctx)
        watch = state.get(WATCH_KEY)
        left = watch.left if isinstance(watch, AnswerWatch) else asyncio.Event()
        waits = runtime.waits
        effect_id = task.effect_id
        if waits is None or effect_id is None:  # pragma: no cover - every runtime has waits
            raise MCPError(INVALID_REQUEST, "this server does not hold long waits")
        latest: list[TaskView] = []  # the last view read

        async def ended() -> bool:
            latest[:] = [await self._view(runtime, task, ctx.request)]
            return latest[0].ended

        with contextlib.ExitStack() as stack:
            try:
                stack.enter_context(waits.slot(str(state.get("key_id") or "")))
            except TooManyWaits as exc:
                raise MCPError(
                    INVALID_REQUEST,
                    f"{exc.message}; poll tasks/get instead",
                    {"code": exc.code, "retry_after": exc.retry_after},
                ) from None
            gone = asyncio.ensure_future(left.wait())
            try:
                while True:
                    waiting = asyncio.ensure_future(
                        waits.until(task.org_id, effect_id, ended, MAX_WAIT_SECONDS)
                    )
                    await asyncio.wait({waiting, gone}, return_when=asyncio.FIRST_COMPLETED)
                    if waiting.done() and waiting.result():
                        return latest[0]
                    if gone.done():
                        waiting.cancel()
                        with contextlib.suppress(asyncio.CancelledError):
                            await waiting
                        raise MCPError(INVALID_REQUEST, "the client left before the task ended")
            finally:
                gone.cancel()

    async def _find(
        self, runtime: Runtime, ctx: ServerRequestContext[Any], task_id: str
    ) -> McpTaskRecord:
        """The caller's task: in its org, created by its own key if it is an agent key, and
        not expired. Any other id is not found (the same answer, whatever the reason)."""
        state = request_state(ctx)
        org_id = state.get("org_id")
        if org_id is None:
            raise MCPError(INVALID_REQUEST, "the gateway is not serving this request")
        if not _is_task_id(task_id):  # never sent to the store (PostgreSQL refuses NUL in text)
            raise MCPError(INVALID_PARAMS, NOT_FOUND)
        async with runtime.store.reader() as q:
            task = await q.get_mcp_task(str(org_id), task_id)
        if task is None or task.expires_us <= now_us():
            raise MCPError(INVALID_PARAMS, NOT_FOUND)
        if not actor_of(state).may_use(task.owner_key_id):
            raise MCPError(INVALID_PARAMS, NOT_FOUND)
        return task

    async def _view(self, runtime: Runtime, task: McpTaskRecord, request: Any) -> TaskView:
        approval = effect = None
        if task.result_json is None and task.approval_id and task.effect_id:
            async with runtime.store.reader() as q:
                approval = await q.get_approval(task.org_id, task.approval_id)
                effect = await q.get_effect(task.org_id, task.effect_id)
        view = task_view(task, approval, effect, self._waiting(task, request))
        if view is None:  # its session was pruned (retention)
            raise MCPError(INVALID_PARAMS, NOT_FOUND)
        if task.result_json is None and view.ended:
            return await self._keep(runtime, task, view)
        return view

    async def _keep(self, runtime: Runtime, task: McpTaskRecord, view: TaskView) -> TaskView:
        """Keep the answer of a task that has just ended: the status a task ends in is final
        (the spec), while its effect may still move (an in-doubt effect resolved later, a
        failed one run again). The first answer kept stands, whichever process keeps it."""
        assert view.result is not None
        answer = orjson.dumps(view.result).decode()
        async with runtime.store.transaction() as q:
            kept = await q.end_mcp_task(
                task.org_id, task.task_id, answer, view.updated_us, view.answers_effect
            )
            if kept:
                return view
            current = await q.get_mcp_task(task.org_id, task.task_id)
        ended = task_view(current, None, None, "") if current is not None else None
        if ended is None:  # deleted meanwhile (expired)
            raise MCPError(INVALID_PARAMS, NOT_FOUND)
        return ended

    def _waiting(self, task: McpTaskRecord, request: Any) -> str:
        approval_id = task.approval_id or ""
        url = approval_url(self.approval_url_template, approval_id, request)
        return (
            approval_text(task.tool_name, approval_id)
            + f" Approve it at {url}. The task ends when the approval is decided: tasks/result "
            "then returns the tool's result, or the refusal."
        )

    @staticmethod
    def _wire(runtime: Runtime, task: McpTaskRecord, view: TaskView) -> dict[str, Any]:
        """A `Task` as the wire spells it."""
        wire: dict[str, Any] = {
            "taskId": task.task_id,
            "status": view.status,
            "createdAt": _iso(task.created_us),
            "lastUpdatedAt": _iso(view.updated_us),
            "ttl": task.ttl_ms,
            "pollInterval": max(1, runtime.retry_after_seconds) * 1000,
        }
        if view.message:
            wire["statusMessage"] = view.message
        return wire


def _is_task_id(task_id: str) -> bool:
    """Whether `task_id` is spelt as this server makes task ids (a UUID, lower-case, dashed)."""
    if len(task_id) != 36:
        return False
    try:
        return str(uuid.UUID(task_id)) == task_id
    except ValueError:
        return False


def _ttl(requested: Any) -> int:
    """The task's ttl in milliseconds: the client's, within our bounds."""
    ttl = requested.get("ttl") if isinstance(requested, dict) else None
    if not isinstance(ttl, int) or isinstance(ttl, bool):
        return DEFAULT_TTL_MS
    return min(max(ttl, MIN_TTL_MS), MAX_TTL_MS)
