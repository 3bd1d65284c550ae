"""UndoLog for Pydantic AI (`pip install 'undolog[pydantic-ai]'`).

`undolog_pydantic_tool(fn, tier=...)` (or `undolog_pydantic_tools(fns, tiers=...)`) makes a
Pydantic AI `Tool` whose calls go through UndoLog, in the session of the running task
(`async with run_with_session(session): await agent.run(...)`):

- SAFE and COMPENSABLE calls run as with `@undolog_tool`, but a call's step is the step of the
  model's tool-call id (`UndoLogSession.step_for_call`), not the session's counter: exactly
  once per tool call, and a repeated call replays its recorded result without running the
  body;
- an IRREVERSIBLE call waiting for its UndoLog approval raises Pydantic AI's own
  `ApprovalRequired`, carrying the approval in its metadata: the run ends with
  `DeferredToolRequests` (the agent's `output_type` must include it), and
  `undolog_approval(requests, tool_call_id)` reads the approval (id, tool, args, step). Once a
  person has decided in UndoLog, `await undolog_decisions(requests)` builds the
  `DeferredToolResults` to resume with: an approved call runs once, a rejected one is denied.

The call id is in the message history, so a run resumed in a new process (the history and
the requests saved as JSON, a session with the same `session_id`) signs each call as before:
it finds the call's approval, and an approved call runs once.

A failed run rolls the session back when it leaves the `run_with_session` block with an error
(compensations run newest first); `await session.rollback()` does it by hand.
"""

from __future__ import annotations

import inspect
import typing
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

from pydantic_ai import (
    ApprovalRequired,
    DeferredToolRequests,
    DeferredToolResults,
    RunContext,
    Tool,
)
from pydantic_ai.tools import ToolDenied

from undolog_sdk.client import UndoLogClient
from undolog_sdk.decorators import (
    AwaitingApprovalError,
    _classified,
    _client_for,
    _run_tool,
    _spec_for,
)
from undolog_sdk.session import UndoLogSession, get_current_session
from undolog_sdk.tier import CompensationDescriptor, ToolTier

__all__ = [
    "METADATA_KEY",
    "UndoLogApproval",
    "undolog_approval",
    "undolog_decisions",
    "undolog_pydantic_tool",
    "undolog_pydantic_tools",
]

METADATA_KEY = "undolog"
"""The key of the UndoLog approval in a deferred call's metadata."""

_APPROVED = frozenset({"approved", "auto_approved"})
_REFUSED = frozenset({"rejected", "timed_out"})


@dataclass(frozen=True)
class UndoLogApproval:
    """The UndoLog approval behind one of Pydantic AI's deferred approvals.

    Attributes:
        approval_id: decide it with `undolog approvals approve <id>` or
            `POST /approvals/{id}/approve` (an approver key).
        tool_name: the UndoLog tool (the function's name).
        step_index: the call's step in the session.
        session_id: the UndoLog session.
        retry_after: the proxy's hint, in seconds, for when to ask again.
    """

    approval_id: str
    tool_name: str
    step_index: int
    session_id: str
    retry_after: int | None = None


def undolog_approval(requests: DeferredToolRequests, tool_call_id: str) -> UndoLogApproval | None:
    """The UndoLog approval behind a deferred approval, or None when the call is not UndoLog's
    (another tool's `requires_approval`)."""
    data = requests.metadata.get(tool_call_id, {}).get(METADATA_KEY)
    return UndoLogApproval(**data) if isinstance(data, dict) else None


async def undolog_decisions(
    requests: DeferredToolRequests,
    session: UndoLogSession | None = None,
    client: UndoLogClient | None = None,
) -> DeferredToolResults:
    """The `DeferredToolResults` that match what people decided in UndoLog.

    An approved call is approved (the resumed run runs it, once); a rejected or timed-out one
    is denied (the model is told, the tool never runs). Calls still pending, and deferred calls
    that are not UndoLog's, are left out: resume once `requests.remaining(results)` is None, or
    add your own answers for the others.
    """
    session = session or get_current_session()
    if session is None:
        raise RuntimeError("undolog_decisions needs the run's UndoLogSession")
    c = _client_for(client, session)
    results = DeferredToolResults()
    for call in requests.approvals:
        approval = undolog_approval(requests, call.tool_call_id)
        if approval is None:
            continue
        record = await c.get_approval(session.org_id, approval.approval_id)
        status = str(record.get("status"))
        if status in _APPROVED:
            results.approvals[call.tool_call_id] = True
        elif status in _REFUSED:
            reason = f": {record['reason']}" if record.get("reason") else ""
            results.approvals[call.tool_call_id] = ToolDenied(
                f"UndoLog approval {approval.approval_id} for '{approval.tool_name}' was "
                f"{status.replace('_', ' ')}{reason}; the tool did not run."
            )
    return results


def undolog_pydantic_tool(
    fn: Callable[..., Awaitable[Any]],
    *,
    tier: ToolTier | str | None = None,
    compensation: CompensationDescriptor | None = None,
    client: UndoLogClient | None = None,
    name: str | None = None,
    description: str | None = None,
) -> Tool[Any]:
    """Pydantic AI's `Tool` for `fn`, its calls through UndoLog.

    Args:
        fn: an async function, or an `@undolog_tool` function (whose tier, compensation and
            client apply; then give no `tier`).
        tier: the tool's classification (required for a plain function).
        compensation: how to undo it; required for COMPENSABLE.
        client: the UndoLog client; by default the session's or one from the environment.
        name, description: as for `Tool` (by default the function's name and docstring).

    Raises:
        ValueError: no tier, or a tier given for an `@undolog_tool` function; a COMPENSABLE
            tier without a compensation.
        TypeError: `fn` is not `async def`.
    """
    spec = _spec_for(fn, tier, compensation, client)

    async def invoke(ctx: RunContext[Any], *args: Any, **kwargs: Any) -> Any:
        session = get_current_session()
        try:
            return await _run_tool(spec, session, args, kwargs, call_id=ctx.tool_call_id)
        except AwaitingApprovalError as waiting:
            approval = UndoLogApproval(
                waiting.approval_id,
                waiting.tool_name,
                waiting.step_index,
                session.session_id if isinstance(session, UndoLogSession) else "",
                waiting.retry_after,
            )
            raise ApprovalRequired(metadata={METADATA_KEY: asdict(approval)}) from None

    # Pydantic AI reads the tool's parameters, docstring and type hints from the function:
    # the function's own, after the `RunContext` that carries the model's tool-call id.
    hints = typing.get_type_hints(spec.fn, include_extras=True)
    context = inspect.Parameter(
        "ctx", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=RunContext[Any]
    )
    params = [
        p.replace(annotation=hints.get(name, p.annotation))
        for name, p in spec.signature.parameters.items()
    ]
    invoke.__name__ = spec.name
    invoke.__qualname__ = spec.fn.__qualname__
    invoke.__module__ = spec.fn.__module__
    invoke.__doc__ = spec.fn.__doc__
    invoke.__annotations__ = {"ctx": RunContext[Any], **hints}
    invoke.__signature__ = spec.signature.replace(  # type: ignore[attr-defined]
        parameters=[context, *params],
        return_annotation=hints.get("return", inspect.Signature.empty),
    )
    return Tool(invoke, takes_ctx=True, name=name, description=description)


def undolog_pydantic_tools(
    fns: Iterable[Callable[..., Awaitable[Any]]],
    *,
    tiers: Mapping[str, ToolTier | str],
    compensations: Mapping[str, CompensationDescriptor] | None = None,
    client: UndoLogClient | None = None,
) -> list[Tool[Any]]:
    """`undolog_pydantic_tool` for each function, its tier (and compensation) looked up by the
    function's name, as `wrap_tools` does.

    Raises:
        ValueError: as `wrap_tools`: a function with no tier, a tier that is not one, a stray
            compensation, a COMPENSABLE function without a compensation.
    """
    return [
        undolog_pydantic_tool(fn, tier=tier, compensation=compensation, client=client)
        for fn, tier, compensation in _classified(fns, tiers, compensations)
    ]
