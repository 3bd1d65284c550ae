"""LangGraph: UndoLog tools for a `ToolNode` or a prebuilt agent (langchain's `create_agent`).

`langgraph_tools(fns, tiers=..., compensations=...)` classifies plain async functions as
`wrap_tools` does and returns LangChain `StructuredTool`s (same names, docstrings, argument
schemas) to hand to `ToolNode(...)` or `create_agent(...)`. Run the graph (`ainvoke`,
`astream`) inside `run_with_session(session)`; each call of a tool then goes through UndoLog:

- **approval**: an IRREVERSIBLE call becomes a LangGraph `interrupt()` whose value is the
  approval request (`approval_requests(result)` picks them out of `result["__interrupt__"]`):
  its `approval_id`, `tool`, `args`, `step_index`, `session_id`, `retry_after` and `undo_plan`
  (what a rollback of the session would undo now, newest first). A person approves or rejects
  it in UndoLog; `Command(resume=...)` (any value) then asks UndoLog again: approved, the call
  runs once and the agent gets its result; still pending, the graph interrupts again with the
  same approval; rejected or timed out, the agent gets an error tool message and goes on.
- **replay**: the step of a call is its place among the tool calls of the conversation
  (`state["messages"]`, which the checkpointer persists), so the node LangGraph re-runs on a
  resume — in this process or another one that loaded the checkpoint — or a restarted agent
  that makes the same calls, maps each call to its recorded effect: its result comes back and
  its body does not run again.
- **conversations**: the session id given names the thread's first session. A run that finds
  its session closed — completed by an earlier turn, or halted by a rejected call — goes on in
  the next session of the thread's chain (`next_session_id`, a UUID v5 derived from the
  previous id, so every process finds the same one); the session object follows it.
- **rollback**: a tool that raises fails its effect and, unless the `ToolNode` handles the
  error, fails the graph run; leaving the session block with that error rolls the session
  back (compensations run newest first): the calls of the current turn, not earlier turns'.
  A rejection keeps what its session did: the halted session's undo stack stays for a person
  to roll back.

Requires the `langgraph` extra (`pip install 'undolog[langgraph]'`). Tools run asynchronously
only (`ainvoke`/`astream`).
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import typing
import uuid
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from langchain_core.tools import StructuredTool, ToolException
from langgraph.prebuilt import ToolRuntime
from langgraph.types import Interrupt, interrupt

from undolog_sdk.client import UndoLogClient, default_client
from undolog_sdk.decorators import AwaitingApprovalError, wrap_tools
from undolog_sdk.errors import ApprovalRejected, ApprovalTimedOut, NotFound, SessionClosed
from undolog_sdk.session import UndoLogSession, get_current_session, require_current_session
from undolog_sdk.signature import call_signature
from undolog_sdk.tier import CompensationDescriptor, ToolTier

__all__ = [
    "APPROVAL_TYPE",
    "approval_requests",
    "langgraph_tool",
    "langgraph_tools",
    "next_session_id",
    "undo_plan",
]

APPROVAL_TYPE = "undolog_approval"
"""The `type` of an interrupt value that is an UndoLog approval request."""

# The parameter through which the ToolNode hands a tool its `ToolRuntime` (the graph state and
# the tool call id). Injected: it is not part of the schema the model sees.
RUNTIME_PARAM = "undolog_runtime"


def langgraph_tools(
    fns: Iterable[Callable[..., Awaitable[Any]]],
    *,
    tiers: Mapping[str, ToolTier | str],
    compensations: Mapping[str, CompensationDescriptor] | None = None,
    client: UndoLogClient | None = None,
) -> list[StructuredTool]:
    """Classify plain async functions (as `wrap_tools`) and make each a LangGraph tool.

    Raises:
        ValueError, TypeError: as `wrap_tools` (no tier, an unknown tier, a stray or missing
            compensation, a function that is not `async def`).
    """
    fns = list(fns)
    wrapped = wrap_tools(fns, tiers=tiers, compensations=compensations, client=client)
    return [
        _as_tool(fn, w, ToolTier(tiers[fn.__name__]), client)
        for fn, w in zip(fns, wrapped, strict=True)
    ]


def langgraph_tool(
    fn: Callable[..., Awaitable[Any]],
    tier: ToolTier | str,
    compensation: CompensationDescriptor | None = None,
    *,
    client: UndoLogClient | None = None,
) -> StructuredTool:
    """One plain async function as a LangGraph tool of the given tier."""
    compensations = {fn.__name__: compensation} if compensation is not None else None
    tools = langgraph_tools(
        [fn], tiers={fn.__name__: tier}, compensations=compensations, client=client
    )
    return tools[0]


def approval_requests(result: Mapping[str, Any] | Iterable[Interrupt]) -> list[dict[str, Any]]:
    """The UndoLog approval requests among a graph run's interrupts.

    Takes the result of `graph.ainvoke(...)` (its `__interrupt__`) or the interrupts themselves
    (`(await graph.aget_state(config)).interrupts`).
    """
    interrupts = result.get("__interrupt__", ()) if isinstance(result, Mapping) else result
    return [
        dict(i.value)
        for i in interrupts
        if isinstance(i.value, Mapping) and i.value.get("type") == APPROVAL_TYPE
    ]


def _as_tool(
    fn: Callable[..., Awaitable[Any]],
    wrapped: Callable[..., Awaitable[Any]],
    tier: ToolTier,
    client: UndoLogClient | None,
) -> StructuredTool:
    name = fn.__name__
    signature = inspect.signature(fn)
    if RUNTIME_PARAM in signature.parameters:
        raise ValueError(f"tool '{name}': the parameter name '{RUNTIME_PARAM}' is reserved")

    async def run(**kwargs: Any) -> Any:
        runtime = kwargs.pop(RUNTIME_PARAM, None)
        place = _place_of(runtime if isinstance(runtime, ToolRuntime) else None)
        with _Turn.joined(place) as turn:
            if tier.is_safe:
                return await wrapped(**kwargs)
            session = require_current_session()
            bound = signature.bind(**kwargs)
            bound.apply_defaults()
            call = _Call(name, dict(bound.arguments), session, runtime, client, place, turn)
            return await call.run(wrapped, kwargs)

    # The schema LangChain builds from `run` is the function's own, plus the injected runtime.
    hints = typing.get_type_hints(fn)
    params = [
        p.replace(annotation=hints.get(p.name, p.annotation)) for p in signature.parameters.values()
    ]
    params.append(
        inspect.Parameter(
            RUNTIME_PARAM, inspect.Parameter.KEYWORD_ONLY, default=None, annotation=ToolRuntime
        )
    )
    run.__signature__ = signature.replace(  # type: ignore[attr-defined]
        parameters=params, return_annotation=hints.get("return", signature.return_annotation)
    )
    run.__annotations__ = {**hints, RUNTIME_PARAM: ToolRuntime}
    run.__name__ = name
    run.__doc__ = fn.__doc__
    return StructuredTool.from_function(
        coroutine=run,
        name=name,
        description=inspect.getdoc(fn) or name,
        handle_tool_error=True,  # a ToolException (a rejected approval) becomes an error message
    )


class _Call:
    """One tool call of a graph run: its step, and how it meets an approval."""

    def __init__(
        self,
        name: str,
        args: dict[str, Any],
        session: UndoLogSession,
        runtime: Any,
        client: UndoLogClient | None,
        place: _Place | None,
        turn: _Turn | None,
    ) -> None:
        self.name = name
        self.args = args
        self.session = session
        self.runtime = runtime if isinstance(runtime, ToolRuntime) else None
        self.client = client
        self.step = place.step if place is not None else None
        self.turn = turn

    async def run(self, wrapped: Callable[..., Awaitable[Any]], kwargs: dict[str, Any]) -> Any:
        while True:
            view = self._view()
            try:
                return await wrapped(**kwargs, _session=view)
            except AwaitingApprovalError as waiting:
                if self.runtime is None:  # not run by a ToolNode: nothing to interrupt
                    raise
                if self.turn is not None:  # the plan then shows what its siblings did
                    await self.turn.settle_others()
                request = await self._request(waiting, view)
                # The first time, this stops the graph (GraphInterrupt). On a resume it returns
                # the resume value, whatever it is: UndoLog decides, so ask it again.
                interrupt(request)
            except SessionClosed as closed:
                # An earlier turn completed the session, or a rejection halted it: the thread
                # goes on in the next session of its chain (the same one in every process).
                following = await _open_session_after(self._client(view), view, closed)
                self.session.session_id = following  # the run's later calls go there directly
            except (ApprovalRejected, ApprovalTimedOut) as refused:
                self._forget(view)
                raise ToolException(await self._refusal(refused, view)) from None
            finally:
                self._merge(view)

    async def _refusal(
        self, refused: ApprovalRejected | ApprovalTimedOut, view: UndoLogSession
    ) -> str:
        """What the agent reads as the tool's result when its call will not run."""
        text = f"UndoLog: the call of '{self.name}' will not run ({refused.code}): {refused}"
        if not isinstance(refused, ApprovalRejected):
            return text
        # The rejection halted the session; what it did stays in place, and the message says
        # so (and to whom), so the refund of an earlier charge is never silently forgotten.
        plan = await undo_plan(self._client(view), view.org_id, view.session_id)
        kept = ", ".join(f"{p['tool']} (undone by {p['compensation']})" for p in plan)
        return (
            f"{text}. UndoLog session {view.session_id} is halted: its earlier calls stay in "
            f"place ({kept or 'nothing to undo'}) until a person rolls it back; later calls go "
            "on in a new session."
        )

    def _client(self, view: UndoLogSession) -> UndoLogClient:
        return self.client or view.client or self.session.client or default_client()

    def _view(self) -> UndoLogSession:
        """The session as this call sees it: the run's own, or (when the graph state gives the
        call a step) a view of it pinned to that step, sharing its pending approvals."""
        if self.step is None:
            return self.session
        view = UndoLogSession(
            org_id=self.session.org_id,
            session_id=self.session.session_id,
            _step_index=self.step - 1,
            client=self.session.client,
        )
        view._awaiting = self.session._awaiting
        return view

    def _merge(self, view: UndoLogSession) -> None:
        if view is self.session:
            return
        self.session._used = self.session._used or view._used
        if self.session.client is None:
            self.session.client = view.client

    def _forget(self, view: UndoLogSession) -> None:
        """A refused call waits for nothing any more."""
        step = self.step if self.step is not None else view._step_index + 1
        try:
            signed = call_signature(view.session_id, step, self.name, self.args)
        except ValueError:
            return
        self.session._awaiting.pop(signed, None)

    async def _request(
        self, waiting: AwaitingApprovalError, view: UndoLogSession
    ) -> dict[str, Any]:
        client = self._client(view)
        return {
            "type": APPROVAL_TYPE,
            "approval_id": waiting.approval_id,
            "tool": self.name,
            "args": self.args,
            "step_index": waiting.step_index,
            "session_id": view.session_id,
            "tool_call_id": self.runtime.tool_call_id if self.runtime is not None else None,
            "retry_after": waiting.retry_after,
            "undo_plan": await undo_plan(client, view.org_id, view.session_id),
        }


_CHAIN = uuid.UUID("5b0c2f55-6d1e-4c44-9a53-2f1d3c8e7a10")
"""The namespace of `next_session_id` (a fixed value: every process derives the same chain)."""

# The session states a thread goes on from into the next session of its chain: a turn that
# ended, a rejection. A session rolled back or failed stops the run instead (someone, or
# something, ended it on purpose).
_CONTINUED = frozenset({"completed", "halted"})

# How many closed sessions a run walks past before it gives up (a thread that many turns
# long is far beyond any conversation; the bound keeps a bug from looping).
_MAX_CHAIN = 10_000


def next_session_id(session_id: str) -> str:
    """The session a LangGraph thread goes on in once `session_id` is closed (completed by
    an earlier turn, or halted by a rejection): a UUID v5 derived from it, so every process
    finds the same chain. `next_session_id(next_session_id(s))` follows it further."""
    return str(uuid.uuid5(_CHAIN, session_id))


async def _open_session_after(
    client: UndoLogClient, view: UndoLogSession, closed: SessionClosed
) -> str:
    """The first session of the chain after `view`'s that is open (active, or not yet
    known to the proxy).

    Raises:
        SessionClosed: the closed session (or one after it) was rolled back or failed.
    """
    session_id = view.session_id
    for _ in range(_MAX_CHAIN):
        try:
            state = (await client._call("GET", f"/sessions/{session_id}", view.org_id))["state"]
        except NotFound:
            return session_id
        if state == "active" and session_id != view.session_id:
            return session_id
        if state not in _CONTINUED:
            raise SessionClosed(session_id, state) from closed
        session_id = next_session_id(session_id)
    raise closed


async def undo_plan(client: UndoLogClient, org_id: str, session_id: str) -> list[dict[str, Any]]:
    """What rolling the session back would undo now, in the order it would (newest first):
    each committed call whose compensation has not run, with that compensation."""
    view = await client._call("GET", f"/sessions/{session_id}", org_id)
    effects = {e["effect_id"]: e for e in view.get("effects", [])}
    plan = []
    for entry in view.get("undo_stack", []):  # top of the stack first
        effect = effects.get(entry["effect_id"])
        if entry["state"] != "pending" or effect is None or effect["state"] != "committed":
            continue
        plan.append(
            {
                "tool": effect["tool_name"],
                "args": effect["args"],
                "step_index": effect["step_index"],
                "effect_id": effect["effect_id"],
                "compensation": entry["fn_name"],
                "compensation_args": entry["args"],
            }
        )
    return plan


@dataclass(frozen=True)
class _Place:
    step: int
    turn: tuple[str, ...]
    """The ids of the tool calls of the model turn that made this call."""


def _place_of(runtime: ToolRuntime | None) -> _Place | None:
    """The call's step: its place (1, 2, ...) among the tool calls of the conversation; or None
    when the graph state has no messages holding it (then the session's counter orders it).

    The same conversation gives every call the same step on every run: when LangGraph re-runs
    a node after a resume, and when a restarted agent makes the same calls.
    """
    if runtime is None or not runtime.tool_call_id:
        return None
    state = runtime.state
    messages = state.get("messages") if isinstance(state, Mapping) else None
    if messages is None:
        messages = getattr(state, "messages", None)
    if not isinstance(messages, list):
        return None
    turns = [
        [str(call.get("id")) for call in (getattr(message, "tool_calls", None) or [])]
        for message in messages
    ]
    before = sum(len(ids) for ids in turns)
    # The newest message holding the id: some models reuse ids across turns.
    for ids in reversed(turns):
        before -= len(ids)
        if runtime.tool_call_id in ids:
            return _Place(before + ids.index(runtime.tool_call_id) + 1, tuple(ids))
    return None


class _Turn:
    """The calls of one model turn running in this process.

    A `ToolNode` runs the calls of a turn together (`asyncio.gather`): when one of them stops
    the graph for an approval, the others would go on running unseen by LangGraph. So a call
    about to interrupt first waits until each of its siblings has finished or is about to
    interrupt too; LangGraph re-runs the node on the resume, and what finished replays.
    """

    _running: ClassVar[dict[tuple[str, ...], set[asyncio.Future[None]]]] = {}

    def __init__(self, key: tuple[str, ...]) -> None:
        self.key = key
        self.settled: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    @classmethod
    @contextlib.contextmanager
    def joined(cls, place: _Place | None) -> Iterator[_Turn | None]:
        if place is None or len(place.turn) < 2:
            yield None
            return
        current = get_current_session()  # calls of other runs never wait for these
        turn = cls((str(id(current)), *place.turn))
        cls._running.setdefault(turn.key, set()).add(turn.settled)
        try:
            yield turn
        finally:
            turn._settle()

    def _settle(self) -> None:
        if not self.settled.done():
            self.settled.set_result(None)
        running = self._running.get(self.key)
        if running is not None:
            running.discard(self.settled)
            if not running:
                del self._running[self.key]

    async def settle_others(self) -> None:
        self._settle()
        others = list(self._running.get(self.key, ()))
        if others:
            await asyncio.wait(others)
