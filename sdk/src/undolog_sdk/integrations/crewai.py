"""UndoLog for CrewAI (`pip install 'undolog[crewai]'`).

`undolog_crewai_tool(fn, tier=...)` (or `undolog_crewai_tools(fns, tiers=...)`) makes a CrewAI
`BaseTool` whose calls go through UndoLog, in the session of the running crew. CrewAI runs a
crew in a worker thread and each tool call on an event loop of its own; run the crew with
`await undolog_kickoff(crew, inputs)` inside `async with run_with_session(session)`, so that
every call reaches UndoLog through the session's event loop (and its client's connections):

- SAFE and COMPENSABLE calls run as with `@undolog_tool`: exactly once per session step, a
  repeated call replays its recorded result without running the body;
- an IRREVERSIBLE call waiting for its UndoLog approval does not run: its tool result tells the
  agent so, naming the approval (CrewAI has no way for a tool to pause a crew for a person), and
  `on_approval` (if given) receives an `UndoLogApproval` (id, tool, args, step, session). Once a
  person has decided in UndoLog, run the crew again with the same session: its recorded calls
  replay, an approved call runs once, a rejected one is an error result for the agent.

The tools' results never enter CrewAI's tool cache: every call is UndoLog's to answer. CrewAI
gives no tool the model's tool-call id, so a call's step is the session's call order (as for
any `@undolog_tool`): a restarted crew replays when it makes the same calls in the same order.

A tool's exception is CrewAI's error result for the agent, as for any tool. A crew that fails
(an exception out of `undolog_kickoff`) rolls the session back when it leaves the
`run_with_session` block with it (compensations run newest first); `await session.rollback()`
does it by hand.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import inspect
import typing
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from crewai.tools import BaseTool
from pydantic import BaseModel, PrivateAttr, create_model

from undolog_sdk.client import UndoLogClient
from undolog_sdk.decorators import (
    AwaitingApprovalError,
    _classified,
    _spec_for,
    _spec_of,
    undolog_tool,
)
from undolog_sdk.session import get_current_session
from undolog_sdk.tier import CompensationDescriptor, ToolTier

__all__ = [
    "UndoLogApproval",
    "UndoLogCrewTool",
    "undolog_crewai_tool",
    "undolog_crewai_tools",
    "undolog_kickoff",
]

_home_loop: contextvars.ContextVar[asyncio.AbstractEventLoop | None] = contextvars.ContextVar(
    "undolog_crewai_home_loop", default=None
)


@dataclass(frozen=True)
class UndoLogApproval:
    """An IRREVERSIBLE call that waits for its UndoLog approval; its body did not run.

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

    def message(self) -> str:
        """The tool result the agent gets."""
        return (
            f"UndoLog: '{self.tool_name}' needs a person's approval (approval "
            f"{self.approval_id}); it did not run. Do not call it again in this run: it runs "
            "once approved, when the crew is run again."
        )


async def undolog_kickoff(crew: Any, inputs: dict[str, Any] | None = None) -> Any:
    """Run `crew` (`crew.kickoff_async(inputs=...)`) with its UndoLog tools' calls sent through
    this event loop, in the current session. Returns the crew's output."""
    token = _home_loop.set(asyncio.get_running_loop())
    try:
        return await crew.kickoff_async(inputs=inputs)
    finally:
        _home_loop.reset(token)


class UndoLogCrewTool(BaseTool):
    """A CrewAI tool whose calls go through UndoLog (made by `undolog_crewai_tool`)."""

    _call: Callable[..., Awaitable[Any]] = PrivateAttr()
    _on_approval: Callable[[UndoLogApproval], Any] | None = PrivateAttr(default=None)

    async def _run(self, **kwargs: Any) -> Any:
        # CrewAI awaits this on its own event loop (or `asyncio.run`s it in its worker
        # thread): the call itself runs on the loop `undolog_kickoff` runs on.
        home = _home_loop.get()
        if home is None or home is asyncio.get_running_loop():
            return await self._through_undolog(kwargs)
        if home.is_closed():
            raise RuntimeError("the event loop of `undolog_kickoff` is closed")
        return await asyncio.wrap_future(
            asyncio.run_coroutine_threadsafe(self._through_undolog(kwargs), home)
        )

    async def _arun(self, **kwargs: Any) -> Any:
        return await self._run(**kwargs)

    def to_structured_tool(self) -> Any:
        # CrewAI's agents call the structured tool; before 1.7 it did not carry the tool's
        # `cache_function`, and its results went to CrewAI's tool cache.
        structured = super().to_structured_tool()
        setattr(structured, "cache_function", _never_cache)  # noqa: B010  # none before 1.7
        return structured

    async def _through_undolog(self, kwargs: dict[str, Any]) -> Any:
        try:
            return await self._call(**kwargs)
        except AwaitingApprovalError as waiting:
            session = get_current_session()
            approval = UndoLogApproval(
                approval_id=waiting.approval_id,
                tool_name=waiting.tool_name,
                tool_args=dict(kwargs),
                step_index=waiting.step_index,
                session_id=session.session_id if session is not None else "",
                retry_after=waiting.retry_after,
            )
            if self._on_approval is not None:
                self._on_approval(approval)
            return approval.message()


def _never_cache(_args: Any = None, _result: Any = None) -> bool:
    return False


def _args_schema(fn: Callable[..., Any], name: str) -> type[BaseModel]:
    """The tool's parameters as a pydantic model, from `fn`'s signature and type hints."""
    hints = typing.get_type_hints(fn)
    fields: dict[str, Any] = {}
    for param in inspect.signature(fn).parameters.values():
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD) or param.name == "_session":
            continue
        default = ... if param.default is param.empty else param.default
        fields[param.name] = (hints.get(param.name, Any), default)
    model: type[BaseModel] = create_model(f"{name}_args", **fields)
    return model


def _as_async(fn: Callable[..., Any]) -> Callable[..., Awaitable[Any]]:
    """A plain (sync) function as an async one that runs it in a worker thread."""
    if inspect.iscoroutinefunction(fn) or _spec_of(fn) is not None:
        return fn

    @functools.wraps(fn)
    async def in_thread(*args: Any, **kwargs: Any) -> Any:
        return await asyncio.to_thread(fn, *args, **kwargs)

    return in_thread


def undolog_crewai_tool(
    fn: Callable[..., Any],
    *,
    tier: ToolTier | str | None = None,
    compensation: CompensationDescriptor | None = None,
    client: UndoLogClient | None = None,
    name: str | None = None,
    description: str | None = None,
    on_approval: Callable[[UndoLogApproval], Any] | None = None,
) -> UndoLogCrewTool:
    """CrewAI's tool for `fn`, its calls through UndoLog.

    Args:
        fn: a function (`async def`, or a plain one, run in a worker thread), or an
            `@undolog_tool` function (whose tier, compensation and client apply; then give no
            `tier`).
        tier: the tool's classification (required for a plain function).
        compensation: how to undo it; required for COMPENSABLE.
        client: the UndoLog client; by default the session's or one from the environment.
        name, description: the tool's, for the agent (by default the function's name and
            docstring).
        on_approval: called with the `UndoLogApproval` of a call that waits for one (on the
            event loop of `undolog_kickoff`).

    Raises:
        ValueError: no tier, or a tier given for an `@undolog_tool` function; a COMPENSABLE
            tier without a compensation.
    """
    spec = _spec_for(_as_async(fn), tier, compensation, client)
    wrapped = undolog_tool(spec.tier, spec.compensation, client=spec.client)(spec.fn)
    original = inspect.unwrap(spec.fn)
    tool_name = name or spec.name
    made = UndoLogCrewTool(
        name=tool_name,
        description=description or inspect.getdoc(original) or tool_name,
        args_schema=_args_schema(original, tool_name),
        cache_function=_never_cache,
    )
    made._call = wrapped
    made._on_approval = on_approval
    return made


def undolog_crewai_tools(
    fns: Iterable[Callable[..., Any]],
    *,
    tiers: Mapping[str, ToolTier | str],
    compensations: Mapping[str, CompensationDescriptor] | None = None,
    client: UndoLogClient | None = None,
    on_approval: Callable[[UndoLogApproval], Any] | None = None,
) -> list[UndoLogCrewTool]:
    """`undolog_crewai_tool` for each function, its tier (and compensation) looked up by the
    function's name, as `wrap_tools` does.

    Raises:
        ValueError: as `wrap_tools`: a function with no tier, a tier that is not one, a stray
            compensation, a COMPENSABLE function without a compensation.
    """
    return [
        undolog_crewai_tool(
            fn, tier=tier, compensation=compensation, client=client, on_approval=on_approval
        )
        for fn, tier, compensation in _classified(
            [_as_async(fn) for fn in fns], tiers, compensations
        )
    ]
