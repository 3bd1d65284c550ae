"""UndoLog for the OpenAI Agents SDK (`pip install 'undolog[openai-agents]'`).

`undolog_function_tool(fn, tier=...)` (or `undolog_function_tools(fns, tiers=...)`) turns an
async function into the SDK's `FunctionTool` whose calls go through UndoLog, in the session of
the running task (`async with run_with_session(session): await Runner.run(...)`):

- SAFE and COMPENSABLE calls run as with `@undolog_tool`, but a call's step is the step of the
  model's call id (`UndoLogSession.step_for_call`), not the session's counter: exactly once
  per tool call, and a repeated call replays its recorded result without running the body;
- an IRREVERSIBLE call is asked of UndoLog *before* it runs, through the tool's
  `needs_approval` policy: while its UndoLog approval is pending, the run stops with the SDK's
  own approval interruption (`result.interruptions`), and `undolog_approval(item)` names the
  UndoLog approval behind it (id, tool, args, step). Once a person has decided in UndoLog,
  `await apply_undolog_decisions(state)` approves (or rejects) the SDK's items to match, and
  `Runner.run(agent, state)` resumes: an approved call runs once, and a re-run of the session
  replays it. The call id is in the `RunState`, so a state restored from JSON in a new process
  (with a session of the same `session_id`) resumes the same way: `apply_undolog_decisions`
  finds its approvals on the proxy.

A failed run rolls the session back when it leaves the `run_with_session` block with an error
(compensations run newest first); `await session.rollback()` does it by hand.
"""

from __future__ import annotations

import inspect
import typing
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from agents import (
    AgentsException,
    FunctionTool,
    RunContextWrapper,
    RunState,
    UserError,
    function_tool,
)
from agents.items import ToolApprovalItem
from agents.tool import default_tool_error_function
from agents.tool_context import ToolContext

from undolog_sdk.client import UndoLogClient
from undolog_sdk.decorators import (
    AwaitingApprovalError,
    _ask,
    _Asked,
    _awaiting,
    _carry_out,
    _classified,
    _client_for,
    _spec_for,
    _ToolSpec,
)
from undolog_sdk.errors import NotFound, UndoLogError
from undolog_sdk.session import UndoLogSession, get_current_session
from undolog_sdk.tier import CompensationDescriptor, ToolTier

__all__ = [
    "ApprovalStillPending",
    "UndoLogApproval",
    "apply_undolog_decisions",
    "undolog_approval",
    "undolog_function_tool",
    "undolog_function_tools",
]

ToolErrorFunction = Callable[[RunContextWrapper[Any], Exception], Any]

_APPROVED = frozenset({"approved", "auto_approved"})
_REFUSED = frozenset({"rejected", "timed_out"})


class ApprovalStillPending(AwaitingApprovalError, AgentsException):
    """A call approved in the run's state whose UndoLog approval still waits: it did not run.

    It ends the run as is (an `AgentsException`, which the SDK does not wrap) and is an
    `AwaitingApprovalError`, so leaving the `run_with_session` block with it keeps the session
    open. Decide the approval in UndoLog, then resume.
    """

    @classmethod
    def of(cls, waiting: AwaitingApprovalError) -> ApprovalStillPending:
        error = cls(waiting.approval_id, waiting.tool_name, waiting.step_index)
        error.retry_after = waiting.retry_after
        error.run_data = None
        return error


@dataclass(frozen=True)
class UndoLogApproval:
    """The UndoLog approval behind one of the SDK's approval interruptions.

    Attributes:
        approval_id: decide it with `undolog approvals approve <id>` or
            `POST /approvals/{id}/approve` (an approver key).
        tool_name: the UndoLog tool (the function's name).
        args: the call's arguments, as UndoLog signed them.
        step_index: the call's step in the session.
        session_id: the UndoLog session.
        call_id: the model's tool call id (the SDK item's `raw_item.call_id`).
        retry_after: the proxy's hint, in seconds, for when to ask again.
    """

    approval_id: str
    tool_name: str
    args: dict[str, Any]
    step_index: int
    session_id: str
    call_id: str
    retry_after: int | None = None


# (session id, model call id) → the pending approval an interruption stands for. An entry
# goes when its call runs.
_pending: dict[tuple[str, str], UndoLogApproval] = {}


def undolog_approval(
    item: ToolApprovalItem, session: UndoLogSession | None = None
) -> UndoLogApproval | None:
    """The UndoLog approval behind an approval interruption of `session` (by default the
    current one), or None when the interruption is not UndoLog's (another tool's policy).

    In a process that restored the run's state from JSON, it is known once
    `apply_undolog_decisions(state)` has looked it up."""
    session = session or get_current_session()
    call_id = _call_id_of(item)
    if session is None or call_id is None:
        return None
    return _pending.get((session.session_id, call_id))


async def apply_undolog_decisions(
    state: RunState[Any, Any],
    session: UndoLogSession | None = None,
    client: UndoLogClient | None = None,
) -> list[UndoLogApproval]:
    """Approve or reject the run's UndoLog interruptions as people decided them in UndoLog.

    An approved call is approved in `state` (the resumed run runs it, once); a rejected or
    timed-out one is rejected (the model is told, the tool never runs). Returns the approvals
    still pending: resuming now stops at them again.
    """
    session = session or get_current_session()
    if session is None:
        raise RuntimeError("apply_undolog_decisions needs the run's UndoLogSession")
    c = _client_for(client, session)
    pending = []
    restored = _Restored(c, session)
    for item in state.get_interruptions():
        approval = undolog_approval(item, session) or await restored.approval(item)
        if approval is None:
            continue
        record = await c.get_approval(session.org_id, approval.approval_id)
        status = str(record.get("status"))
        if status in _APPROVED:
            state.approve(item)
        elif status in _REFUSED:
            _pending.pop((session.session_id, approval.call_id), None)  # it will never run
            reason = f": {record['reason']}" if record.get("reason") else ""
            state.reject(
                item,
                rejection_message=(
                    f"UndoLog approval {approval.approval_id} for '{approval.tool_name}' was "
                    f"{status.replace('_', ' ')}{reason}; the tool did not run."
                ),
            )
        else:
            pending.append(approval)
    return pending


def undolog_function_tool(
    fn: Callable[..., Awaitable[Any]],
    *,
    tier: ToolTier | str | None = None,
    compensation: CompensationDescriptor | None = None,
    client: UndoLogClient | None = None,
    name_override: str | None = None,
    description_override: str | None = None,
    failure_error_function: ToolErrorFunction | None = default_tool_error_function,
) -> FunctionTool:
    """The SDK's `FunctionTool` for `fn`, its calls through UndoLog.

    Args:
        fn: an async function, or an `@undolog_tool` function (whose tier, compensation and
            client apply; then give no `tier`).
        tier: the tool's classification (required for a plain function).
        compensation: how to undo it; required for COMPENSABLE.
        client: the UndoLog client; by default the session's or one from the environment.
        name_override, description_override: as for `function_tool`.
        failure_error_function: as for `function_tool`: turns a tool's error into the message
            the model sees (None: the error ends the run). A call whose UndoLog approval
            still waits always ends the run (`ApprovalStillPending`).

    Raises:
        ValueError: no tier, or a tier given for an `@undolog_tool` function; a COMPENSABLE
            tier without a compensation.
        TypeError: `fn` is not `async def`.
    """
    spec = _spec_for(fn, tier, compensation, client)
    tool = _UndoLogTool(spec)
    return function_tool(
        tool.invoker(),
        name_override=name_override,
        description_override=description_override,
        failure_error_function=_pending_ends_the_run(failure_error_function),
        needs_approval=tool.needs_approval if spec.tier.requires_approval else False,
    )


def undolog_function_tools(
    fns: Iterable[Callable[..., Awaitable[Any]]],
    *,
    tiers: Mapping[str, ToolTier | str],
    compensations: Mapping[str, CompensationDescriptor] | None = None,
    client: UndoLogClient | None = None,
) -> list[FunctionTool]:
    """`undolog_function_tool` for each function, its tier (and compensation) looked up by the
    function's name, as `wrap_tools` does.

    Raises:
        ValueError: as `wrap_tools`: a function with no tier, a tier that is not one, a stray
            compensation, a COMPENSABLE function without a compensation.
    """
    return [
        undolog_function_tool(fn, tier=tier, compensation=compensation, client=client)
        for fn, tier, compensation in _classified(fns, tiers, compensations)
    ]


class _NoSession(UserError):
    """A tool call outside any session: a mistake in the program, so it ends the run."""


class _UndoLogTool:
    """One tool: its `needs_approval` policy and its invoker, which hand the proxy's decision
    from one to the other (asking twice would find the call already executing)."""

    def __init__(self, spec: _ToolSpec) -> None:
        self.spec = spec
        # (session id, model call id) → what the policy learnt for a call it let through.
        self._decided: dict[tuple[str, str], _Asked | UndoLogError] = {}

    def _session(self) -> UndoLogSession:
        session = get_current_session()
        if session is None:
            raise _NoSession(
                f"tool '{self.spec.name}' needs an UndoLogSession: run the agent inside "
                "`async with run_with_session(session)`"
            )
        return session

    def _call_args(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        bound = self.spec.signature.bind(*args, **kwargs)
        bound.apply_defaults()
        return dict(bound.arguments)

    async def needs_approval(
        self, _ctx: RunContextWrapper[Any], params: dict[str, Any], call_id: str
    ) -> bool:
        """Ask UndoLog about the call now: interrupt the run while its approval is pending."""
        session = self._session()
        spec = self.spec
        c = _client_for(spec.client, session)
        call_args = self._call_args(**params)
        key = (session.session_id, call_id)
        step = session.step_for_call(call_id)
        try:
            asked = await _ask(c, session, spec.name, spec.tier, spec.compensation, call_args, step)
        except UndoLogError as exc:  # rejected, timed out...: the invocation raises it
            self._decided[key] = exc
            return False
        if asked.decision.outcome != "AwaitingApproval":
            self._decided[key] = asked  # Execute or Replay: the invocation carries it out
            return False
        waiting = _awaiting(session, asked, spec.name)
        _pending[key] = UndoLogApproval(
            waiting.approval_id,
            spec.name,
            call_args,
            waiting.step_index,
            session.session_id,
            call_id,
            waiting.retry_after,
        )
        return True

    def invoker(self) -> Callable[..., Awaitable[Any]]:
        """The function `function_tool` wraps: the tool's own parameters (its schema and
        docstring), after the `ToolContext` that carries the model's call id."""
        spec = self.spec

        async def invoke(ctx: ToolContext[Any], *args: Any, **kwargs: Any) -> Any:
            if spec.tier.is_safe:
                return await spec.fn(*args, **kwargs)
            session = self._session()
            c = _client_for(spec.client, session)
            key = (session.session_id, ctx.tool_call_id)
            _pending.pop(key, None)
            decided = self._decided.pop(key, None)
            if isinstance(decided, UndoLogError):
                raise decided
            if decided is None:
                call_args = self._call_args(*args, **kwargs)
                step = session.step_for_call(ctx.tool_call_id)
                decided = await _ask(
                    c, session, spec.name, spec.tier, spec.compensation, call_args, step
                )
            try:
                return await _carry_out(c, session, decided, spec.name, spec.fn, args, kwargs)
            except AwaitingApprovalError as waiting:
                raise ApprovalStillPending.of(waiting) from None

        hints = typing.get_type_hints(spec.fn, include_extras=True)
        context = inspect.Parameter(
            "ctx", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=ToolContext[Any]
        )
        params = [
            p.replace(annotation=hints.get(name, p.annotation))
            for name, p in spec.signature.parameters.items()
        ]
        invoke.__name__ = spec.name
        invoke.__qualname__ = spec.name
        invoke.__doc__ = spec.fn.__doc__
        invoke.__annotations__ = {"ctx": ToolContext[Any], **hints}
        invoke.__signature__ = spec.signature.replace(  # type: ignore[attr-defined]
            parameters=[context, *params]
        )
        return invoke


def _pending_ends_the_run(
    failure_error_function: ToolErrorFunction | None,
) -> ToolErrorFunction | None:
    if failure_error_function is None:
        return None

    def on_error(ctx: RunContextWrapper[Any], error: Exception) -> Any:
        if isinstance(error, ApprovalStillPending | _NoSession):
            return None  # the SDK raises the error when its formatter gives no message
        return failure_error_function(ctx, error)

    return on_error


class _Restored:
    """The UndoLog approvals of interruptions this process did not see happen (a `RunState`
    restored from JSON in a new process): a call's step follows from its call id, so its
    approval is the newest one of the session for that tool at that step. The session is
    read from the proxy once, when the first such interruption asks."""

    def __init__(self, c: UndoLogClient, session: UndoLogSession) -> None:
        self._c = c
        self._session = session
        self._view: dict[str, Any] | None = None

    async def approval(self, item: ToolApprovalItem) -> UndoLogApproval | None:
        session = self._session
        call_id = _call_id_of(item)
        if not call_id:
            return None
        if self._view is None:
            try:
                self._view = await self._c._call(
                    "GET", f"/sessions/{session.session_id}", session.org_id
                )
            except NotFound:  # the proxy has never seen the session: nothing of UndoLog's
                self._view = {}
        step = session.step_for_call(call_id)
        effects = {
            e.get("effect_id")
            for e in self._view.get("effects", [])
            if e.get("step_index") == step and e.get("tool_name") == item.tool_name
        }
        found = [a for a in self._view.get("approvals", []) if a.get("effect_id") in effects]
        if not found:
            return None
        newest = max(found, key=lambda a: str(a.get("created_at") or ""))
        args = newest.get("args")
        approval = UndoLogApproval(
            str(newest.get("id")),
            str(newest.get("tool_name")),
            args if isinstance(args, dict) else {},
            step,
            session.session_id,
            call_id,
        )
        _pending[(session.session_id, call_id)] = approval
        return approval


def _call_id_of(item: ToolApprovalItem) -> str | None:
    raw = item.raw_item
    call_id: object = raw.get("call_id") if isinstance(raw, dict) else getattr(raw, "call_id", None)
    return call_id if isinstance(call_id, str) else None
