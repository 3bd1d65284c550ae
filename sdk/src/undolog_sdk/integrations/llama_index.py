"""UndoLog for LlamaIndex agents (`pip install 'undolog[llama-index]'`).

`undolog_llama_tool(fn, tier=...)` (or `undolog_llama_tools(fns, tiers=...)`) makes a LlamaIndex
`FunctionTool` whose calls go through UndoLog, in the session of the running task
(`async with run_with_session(session): handler = agent.run(...); ...; await handler`):

- SAFE and COMPENSABLE calls run as with `@undolog_tool`: exactly once per session step, a
  repeated call replays its recorded result without running the body;
- an IRREVERSIBLE call waiting for its UndoLog approval uses LlamaIndex's own
  human-in-the-loop events: the tool writes `UndoLogApprovalRequired` (an `InputRequiredEvent`
  carrying the approval id, tool, args and step) to the run's event stream and waits for the
  matching `UndoLogDecision` (a `HumanResponseEvent`). Once a person has decided in UndoLog,
  `handler.ctx.send_event(event.decided())` resumes the call: LlamaIndex replays the tool step,
  an approved call runs once and the agent gets its result; a rejected one is an error result
  (`ApprovalRejected`), and a call still pending is an error result naming its approval.

A tool's exception is LlamaIndex's error result for the model, as for any tool. A failed run
(an exception out of `await handler`) rolls the session back when it leaves the
`run_with_session` block with it (compensations run newest first); `await session.rollback()`
does it by hand, e.g. after a run that ended on a tool error.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any

from llama_index.core.tools import FunctionTool
from llama_index.core.workflow import Context, HumanResponseEvent, InputRequiredEvent

from undolog_sdk.client import UndoLogClient
from undolog_sdk.decorators import (
    AwaitingApprovalError,
    _classified,
    _spec_for,
    undolog_tool,
)
from undolog_sdk.session import get_current_session
from undolog_sdk.tier import CompensationDescriptor, ToolTier

__all__ = [
    "UndoLogApprovalRequired",
    "UndoLogDecision",
    "undolog_llama_tool",
    "undolog_llama_tools",
]


class UndoLogDecision(HumanResponseEvent):
    """Tells a waiting call that its UndoLog approval was decided: the call asks UndoLog again
    (an approved call runs once, a rejected one is an error result)."""

    approval_id: str


class UndoLogApprovalRequired(InputRequiredEvent):
    """An IRREVERSIBLE call waits for its UndoLog approval; its body did not run.

    Attributes:
        approval_id: decide it with `undolog approvals approve <id>` or
            `POST /approvals/{id}/approve` (an approver key).
        tool_name: the UndoLog tool (the function's name).
        tool_args: the call's arguments.
        step_index: the call's step in the session.
        session_id: the UndoLog session.
        retry_after: the proxy's hint, in seconds, for when to ask again.
    """

    approval_id: str
    tool_name: str
    tool_args: dict[str, Any]
    step_index: int
    session_id: str
    retry_after: int | None = None

    def decided(self) -> UndoLogDecision:
        """The event to send (`handler.ctx.send_event(...)`) once a person has decided."""
        return UndoLogDecision(approval_id=self.approval_id)


def undolog_llama_tool(
    fn: Callable[..., Awaitable[Any]],
    *,
    tier: ToolTier | str | None = None,
    compensation: CompensationDescriptor | None = None,
    client: UndoLogClient | None = None,
    name: str | None = None,
    description: str | None = None,
) -> FunctionTool:
    """LlamaIndex's `FunctionTool` for `fn`, its calls through UndoLog.

    Args:
        fn: an async function, or an `@undolog_tool` function (whose tier, compensation and
            client apply; then give no `tier`).
        tier: the tool's classification (required for a plain function).
        compensation: how to undo it; required for COMPENSABLE.
        client: the UndoLog client; by default the session's or one from the environment.
        name, description: as for `FunctionTool.from_defaults` (by default the function's name,
            signature and docstring).

    Raises:
        ValueError: no tier, or a tier given for an `@undolog_tool` function; a COMPENSABLE
            tier without a compensation.
        TypeError: `fn` is not `async def`.
    """
    spec = _spec_for(fn, tier, compensation, client)
    wrapped = undolog_tool(spec.tier, spec.compensation, client=spec.client)(spec.fn)
    # The schema and description come from the function itself, not from the wrapper below.
    metadata = FunctionTool.from_defaults(
        async_fn=spec.fn, name=name, description=description
    ).metadata

    @functools.wraps(spec.fn)
    async def invoke(ctx: Context, **kwargs: Any) -> Any:
        # LlamaIndex replays this whole step when the decision arrives: the call is asked of
        # UndoLog again, and runs only if UndoLog approved it.
        try:
            return await wrapped(**kwargs)
        except AwaitingApprovalError as waiting:
            session = get_current_session()
            required = UndoLogApprovalRequired(
                approval_id=waiting.approval_id,
                tool_name=waiting.tool_name,
                tool_args=dict(kwargs),
                step_index=waiting.step_index,
                session_id=session.session_id if session is not None else "",
                retry_after=waiting.retry_after,
            )
            await ctx.wait_for_event(
                UndoLogDecision,
                waiter_event=required,
                waiter_id=f"undolog:{waiting.approval_id}",
                requirements={"approval_id": waiting.approval_id},
                timeout=None,
            )
            # The decision came, yet UndoLog still waits: the model is told (an error result).
            raise

    # LlamaIndex passes the run's `Context` to a tool whose signature asks for one (the class
    # itself, not the string this module's annotations are); the schema is `metadata`'s.
    del invoke.__wrapped__
    invoke.__annotations__["ctx"] = Context
    return FunctionTool(async_fn=invoke, metadata=metadata)


def undolog_llama_tools(
    fns: Iterable[Callable[..., Awaitable[Any]]],
    *,
    tiers: Mapping[str, ToolTier | str],
    compensations: Mapping[str, CompensationDescriptor] | None = None,
    client: UndoLogClient | None = None,
) -> list[FunctionTool]:
    """`undolog_llama_tool` for each function, its tier (and compensation) looked up by the
    function's name, as `wrap_tools` does.

    Raises:
        ValueError: as `wrap_tools`: a function with no tier, a tier that is not one, a stray
            compensation, a COMPENSABLE function without a compensation.
    """
    return [
        undolog_llama_tool(fn, tier=tier, compensation=compensation, client=client)
        for fn, tier, compensation in _classified(fns, tiers, compensations)
    ]
