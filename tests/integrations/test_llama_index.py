"""The LlamaIndex integration against the real `llama_index.core` package, a scripted model
(`MockFunctionCallingLLM` with a response generator, no network) and a real proxy (uvicorn on
loopback), both stores: an IRREVERSIBLE call is LlamaIndex's own human-in-the-loop event
carrying the UndoLog approval; approving it in UndoLog and sending the decision runs the tool
once; a restarted agent replays; a failed run rolls back.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Sequence
from typing import Any

import pytest

pytest.importorskip("llama_index.core")

from llama_index.core.agent.workflow import AgentOutput, FunctionAgent, ToolCallResult
from llama_index.core.base.llms.types import ChatMessage, MessageRole, ToolCallBlock
from llama_index.core.llms.mock import MockFunctionCallingLLM
from llama_index.core.tools import FunctionTool

from tests.integrations.booking import booking_tools
from tests.integrations.conftest import approve
from tests.proxy.conftest import ProxyHarness
from tests.sdk.helpers import session_view
from undolog_sdk import (
    CompensationDescriptor,
    ToolTier,
    UndoLogClient,
    UndoLogSession,
    run_with_session,
)
from undolog_sdk.compensation import compensation
from undolog_sdk.integrations.llama_index import (
    UndoLogApprovalRequired,
    undolog_llama_tool,
    undolog_llama_tools,
)

# llama_index's workflows list an agent's steps with `inspect.getmembers`, which touches
# pydantic's deprecated instance attributes (`__fields__`, `model_computed_fields`...): pydantic
# deprecation warnings, errors under our filterwarnings.
pytestmark = pytest.mark.filterwarnings("ignore::pydantic.warnings.PydanticDeprecationWarning")

NOWHERE = "http://127.0.0.1:9"  # a proxy that is not there
UNBOOK = CompensationDescriptor.new("llama_unbook_seat")
unbooked: list[str] = []


@compensation("llama_unbook_seat")
async def unbook_seat(*, original_args: dict[str, Any], **_: Any) -> None:
    unbooked.append(original_args["seat"])


Step = ChatMessage | str | Exception


def call(tool: str, args: dict[str, Any], call_id: str) -> ChatMessage:
    block = ToolCallBlock(tool_call_id=call_id, tool_name=tool, tool_kwargs=args)
    return ChatMessage(role=MessageRole.ASSISTANT, blocks=[block])


def scripted(steps: list[Step]) -> MockFunctionCallingLLM:
    """A model that answers its n-th request with `steps[n]` (an exception is raised): the
    same on every run, since the step is read from the conversation."""

    def respond(messages: Sequence[ChatMessage], **_: Any) -> ChatMessage:
        step = steps[sum(m.role == MessageRole.ASSISTANT for m in messages)]
        if isinstance(step, Exception):
            raise step
        if isinstance(step, str):
            return ChatMessage(role=MessageRole.ASSISTANT, content=step)
        return step

    return MockFunctionCallingLLM(response_generator=respond)


SCRIPT: list[Step] = [
    call("lookup", {"name": "ada"}, "c1"),
    call("book_seat", {"seat": "1A"}, "c2"),
    call("cancel_flight", {"flight": "UL1", "reason": "storm"}, "c3"),
    "all done",
]


class Tools:
    """A booking agent's tools, counting the runs of each body."""

    def __init__(self, client: UndoLogClient) -> None:
        booking = booking_tools(client)
        self.calls = booking.calls
        lookup, book_seat, cancel_flight = booking.lookup, booking.book_seat, booking.cancel_flight

        self.tools: list[FunctionTool] = [
            *undolog_llama_tools(
                [lookup, book_seat],
                tiers={"lookup": "safe", "book_seat": ToolTier.COMPENSABLE},
                compensations={"book_seat": UNBOOK},
                client=client,
            ),
            undolog_llama_tool(cancel_flight),
        ]

    def agent(self, steps: list[Step] = SCRIPT, *extra: FunctionTool) -> FunctionAgent:
        return FunctionAgent(tools=[*self.tools, *extra], llm=scripted(steps), streaming=False)


class Run:
    """What one agent run streamed: the approvals asked for and the tool results."""

    def __init__(self) -> None:
        self.approvals: list[UndoLogApprovalRequired] = []
        self.results: dict[str, Any] = {}
        self.errors: dict[str, str] = {}
        self.output: AgentOutput | None = None


async def run_agent(
    agent: FunctionAgent,
    on_approval: Any = None,
    *,
    stop_at_approval: bool = False,
    seen: Run | None = None,
) -> Run:
    """Run the agent to its end, calling `on_approval(event, handler)` for each approval."""
    seen = seen or Run()
    handler = agent.run("cancel UL1")
    async for event in handler.stream_events():
        if isinstance(event, UndoLogApprovalRequired):
            seen.approvals.append(event)
            if stop_at_approval:
                await handler.cancel_run()
                return seen
            await on_approval(event, handler)
        elif isinstance(event, ToolCallResult):
            output = event.tool_output
            if output.is_error:
                seen.errors[event.tool_id] = str(output.content)
            else:
                seen.results[event.tool_id] = output.raw_output
    seen.output = await handler
    return seen


async def test_an_irreversible_call_is_an_input_required_event_and_runs_once_approved(
    proxy: ProxyHarness, client: UndoLogClient
) -> None:
    tools = Tools(client)
    session = UndoLogSession(org_id=proxy.org_id)

    async def decide(event: UndoLogApprovalRequired, handler: Any) -> None:
        assert tools.calls == ["lookup ada", "book 1A"]  # the cancellation did not run
        view = session_view(proxy, session.session_id)
        assert [a["id"] for a in view["approvals"]] == [event.approval_id]
        approve(proxy, event.approval_id)
        handler.ctx.send_event(event.decided())

    async with run_with_session(session):
        done = await run_agent(tools.agent(), decide)
    (event,) = done.approvals
    assert (event.tool_name, event.tool_args, event.step_index, event.session_id) == (
        "cancel_flight", {"flight": "UL1", "reason": "storm"}, 2, session.session_id,
    )  # fmt: skip
    assert tools.calls == ["lookup ada", "book 1A", "cancel UL1"]  # once
    assert done.results["c3"] == "cancelled UL1"  # the agent got the result
    assert done.output is not None and done.output.response.content == "all done"
    view = session_view(proxy, session.session_id)
    assert [(e["tool_name"], e["state"]) for e in view["effects"]] == [
        ("book_seat", "committed"), ("cancel_flight", "committed"),
    ]  # fmt: skip
    assert view["state"] == "completed"


async def test_a_decision_sent_before_undolog_decided_is_an_error_naming_the_approval(
    proxy: ProxyHarness, client: UndoLogClient
) -> None:
    tools = Tools(client)
    session = UndoLogSession(org_id=proxy.org_id)

    async def too_soon(event: UndoLogApprovalRequired, handler: Any) -> None:
        handler.ctx.send_event(event.decided())  # nobody approved it in UndoLog

    async with run_with_session(session):
        done = await run_agent(tools.agent(), too_soon)
    (event,) = done.approvals
    assert "cancel UL1" not in tools.calls
    assert event.approval_id in done.errors["c3"] and "awaits approval" in done.errors["c3"]
    view = session_view(proxy, session.session_id)
    assert view["state"] == "active"  # left normally while waiting: still open
    assert [a["status"] for a in view["approvals"]] == ["pending"]


async def test_a_call_rejected_in_undolog_is_an_error_result_and_never_runs(
    proxy: ProxyHarness, client: UndoLogClient
) -> None:
    tools = Tools(client)
    session = UndoLogSession(org_id=proxy.org_id)

    async def reject(event: UndoLogApprovalRequired, handler: Any) -> None:
        approve(proxy, event.approval_id, "reject")
        handler.ctx.send_event(event.decided())

    async with run_with_session(session):
        done = await run_agent(tools.agent(), reject)
    (event,) = done.approvals
    assert "cancel UL1" not in tools.calls
    assert event.approval_id in done.errors["c3"] and "rejected" in done.errors["c3"]
    assert done.output is not None and done.output.response.content == "all done"


async def test_a_restarted_agent_replays_recorded_calls_and_runs_the_approved_one_once(
    proxy: ProxyHarness, client: UndoLogClient
) -> None:
    tools = Tools(client)
    session = UndoLogSession(org_id=proxy.org_id)
    async with run_with_session(session):
        first = await run_agent(tools.agent(), stop_at_approval=True)  # the process stops
    (event,) = first.approvals
    approve(proxy, event.approval_id)

    # The agent restarts from the beginning in the same session, with a fresh process's state.
    for _ in range(2):
        restarted = Tools(client)
        again = UndoLogSession(org_id=proxy.org_id, session_id=session.session_id)
        async with run_with_session(again):
            done = await run_agent(restarted.agent())
        assert done.approvals == []
        assert done.results == {
            "c1": "passenger ada", "c2": {"booked": "1A"}, "c3": "cancelled UL1",
        }  # fmt: skip
        tools.calls += restarted.calls
    # The booking never ran again; the cancellation ran once, on the first restart; SAFE
    # lookups run every time.
    assert tools.calls == [
        "lookup ada", "book 1A", "lookup ada", "cancel UL1", "lookup ada",
    ]  # fmt: skip
    assert session_view(proxy, session.session_id)["state"] == "completed"


async def test_a_failed_run_rolls_the_session_back_newest_first(
    proxy: ProxyHarness, client: UndoLogClient
) -> None:
    tools = Tools(client)

    async def charge(cents: int) -> str:
        """Charge the card."""
        raise ConnectionError("the payment provider is down")

    failing = undolog_llama_tool(
        charge, tier=ToolTier.COMPENSABLE, compensation=UNBOOK, client=client
    )
    agent = tools.agent(
        [
            call("book_seat", {"seat": "1A"}, "c1"),
            call("book_seat", {"seat": "2B"}, "c2"),
            call("charge", {"cents": 1999}, "c3"),
            RuntimeError("the model gave up"),
        ],
        failing,
    )
    unbooked.clear()
    session = UndoLogSession(org_id=proxy.org_id)
    done = Run()
    with pytest.raises(Exception, match="the model gave up"):
        async with run_with_session(session):
            await run_agent(agent, seen=done)
    assert "payment provider is down" in done.errors["c3"]  # the model was told first
    assert unbooked == ["2B", "1A"]  # compensations ran, newest first
    view = session_view(proxy, session.session_id)
    assert view["state"] == "compensated"


async def test_safe_tools_run_without_a_session_and_the_proxy_never_hears_of_them() -> None:
    tools = Tools(UndoLogClient(NOWHERE))
    done = await run_agent(tools.agent([call("lookup", {"name": "ada"}, "c1"), "ok"]))
    assert done.results == {"c1": "passenger ada"} and tools.calls == ["lookup ada"]
    assert done.output is not None and done.output.response.content == "ok"


async def test_without_a_session_an_undolog_call_is_an_error_saying_how_to_give_it_one() -> None:
    tools = Tools(UndoLogClient(NOWHERE))
    done = await run_agent(tools.agent([call("book_seat", {"seat": "1A"}, "c1"), "ok"]))
    assert "run_with_session" in done.errors["c1"]
    assert tools.calls == []


def test_tools_keep_their_schema_and_docstring_and_need_a_tier() -> None:
    lookup, book, cancel = Tools(UndoLogClient(NOWHERE)).tools
    assert lookup.metadata.name == "lookup"
    assert lookup.metadata.description.endswith("Find a passenger.")
    assert lookup.requires_context  # LlamaIndex hands the tool its run's Context
    assert cancel.metadata.get_parameters_dict()["required"] == ["flight", "reason"]
    assert set(book.metadata.get_parameters_dict()["properties"]) == {"seat"}

    async def purge(table: str) -> str:
        return table

    with pytest.raises(ValueError, match="no tier for 'purge'"):
        undolog_llama_tool(purge)
    with pytest.raises(ValueError, match="no tier for purge"):
        undolog_llama_tools([purge], tiers={})
    with pytest.raises(ValueError, match="COMPENSABLE tool needs a compensation"):
        undolog_llama_tool(purge, tier="compensable")


def test_the_module_exports_are_pinned_and_the_sdk_never_imports_the_framework() -> None:
    import undolog_sdk.integrations.llama_index as module

    assert module.__all__ == [
        "UndoLogApprovalRequired",
        "UndoLogDecision",
        "undolog_llama_tool",
        "undolog_llama_tools",
    ]
    code = (
        "import sys, undolog_sdk, undolog_sdk.decorators, undolog_sdk.integrations;"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('llama_index', 'workflows'));"
        "print(bad); sys.exit(1 if bad else 0)"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr
