"""The Pydantic AI integration against the real `pydantic_ai` package, a scripted model
(`FunctionModel`, no network) and a real proxy (uvicorn on loopback), both stores: an
IRREVERSIBLE call is Pydantic AI's own deferred approval carrying the UndoLog approval;
approving it in UndoLog and resuming runs the tool once; a restarted agent replays; a failed
run rolls back.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pydantic_ai")

from pydantic_ai import Agent, DeferredToolRequests, DeferredToolResults, Tool
from pydantic_ai.messages import (
    ModelMessage,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.tools import ToolApproved

from tests.integrations.booking import booking_tools
from tests.integrations.conftest import Restarts, approve
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
from undolog_sdk.integrations.pydantic_ai import (
    undolog_approval,
    undolog_decisions,
    undolog_pydantic_tool,
    undolog_pydantic_tools,
)

NOWHERE = "http://127.0.0.1:9"  # a proxy that is not there
UNBOOK = CompensationDescriptor.new("pydantic_unbook_seat")
unbooked: list[str] = []


@compensation("pydantic_unbook_seat")
async def unbook_seat(*, original_args: dict[str, Any], **_: Any) -> None:
    unbooked.append(original_args["seat"])


def scripted(steps: list[ModelResponse | str]) -> FunctionModel:
    """A model that answers its n-th request with `steps[n]`: the same on every run, since the
    step is read from the history (a resumed run continues where it stopped)."""

    def respond(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        step = steps[sum(isinstance(m, ModelResponse) for m in messages)]
        return ModelResponse(parts=[TextPart(step)]) if isinstance(step, str) else step

    return FunctionModel(respond)


def call(tool: str, args: dict[str, Any], call_id: str) -> ModelResponse:
    return ModelResponse(parts=[ToolCallPart(tool, args, tool_call_id=call_id)])


SCRIPT: list[ModelResponse | str] = [
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

        self.tools: list[Tool[Any]] = [
            *undolog_pydantic_tools(
                [lookup, book_seat],
                tiers={"lookup": "safe", "book_seat": ToolTier.COMPENSABLE},
                compensations={"book_seat": UNBOOK},
                client=client,
            ),
            undolog_pydantic_tool(cancel_flight),
        ]

    def agent(self, steps: list[ModelResponse | str] = SCRIPT) -> Agent[None, Any]:
        return Agent(scripted(steps), tools=self.tools, output_type=[str, DeferredToolRequests])


def returns(messages: list[ModelMessage]) -> dict[str, Any]:
    """What the model was told each tool call returned, by call id."""
    return {
        part.tool_call_id: part.content
        for m in messages
        for part in getattr(m, "parts", [])
        if isinstance(part, ToolReturnPart)
    }


async def test_an_irreversible_call_is_a_deferred_approval_and_runs_once_approved(
    proxy: ProxyHarness, client: UndoLogClient
) -> None:
    tools = Tools(client)
    agent = tools.agent()
    session = UndoLogSession(org_id=proxy.org_id)
    async with run_with_session(session):
        first = await agent.run("cancel UL1")
    requests = first.output
    assert isinstance(requests, DeferredToolRequests)
    (deferred,) = requests.approvals
    assert (deferred.tool_name, deferred.args_as_dict()) == (
        "cancel_flight", {"flight": "UL1", "reason": "storm"},
    )  # fmt: skip
    approval = undolog_approval(requests, deferred.tool_call_id)
    assert approval is not None
    assert (approval.tool_name, approval.step_index, approval.session_id) == (
        "cancel_flight", session.step_for_call("c3"), session.session_id,
    )  # fmt: skip
    assert tools.calls == ["lookup ada", "book 1A"]  # the cancellation did not run
    view = session_view(proxy, session.session_id)
    assert view["state"] == "active"  # left normally while waiting: still open
    assert [a["id"] for a in view["approvals"]] == [approval.approval_id]

    async with run_with_session(session):
        undecided = await undolog_decisions(requests)
    assert undecided.approvals == {}  # not decided in UndoLog: nothing to resume with
    assert requests.remaining(undecided) is not None

    approve(proxy, approval.approval_id)
    async with run_with_session(session):
        results = await undolog_decisions(requests)
        assert results.approvals == {"c3": True}
        done = await agent.run(message_history=first.all_messages(), deferred_tool_results=results)
    assert done.output == "all done"
    assert tools.calls == ["lookup ada", "book 1A", "cancel UL1"]  # once
    assert returns(done.all_messages())["c3"] == "cancelled UL1"  # the agent got the result
    view = session_view(proxy, session.session_id)
    assert [(e["tool_name"], e["state"]) for e in view["effects"]] == [
        ("book_seat", "committed"), ("cancel_flight", "committed"),
    ]  # fmt: skip
    assert view["state"] == "completed"


async def test_a_restarted_agent_replays_recorded_calls_and_runs_the_approved_one_once(
    proxy: ProxyHarness, client: UndoLogClient
) -> None:
    tools = Tools(client)
    session = UndoLogSession(org_id=proxy.org_id)
    async with run_with_session(session):
        first = await tools.agent().run("cancel UL1")
    assert isinstance(first.output, DeferredToolRequests)
    approval = undolog_approval(first.output, "c3")
    assert approval is not None
    approve(proxy, approval.approval_id)

    # The agent restarts from the beginning in the same session, with a fresh process's state.
    for _ in range(2):
        restarted = Tools(client)
        again = UndoLogSession(org_id=proxy.org_id, session_id=session.session_id)
        async with run_with_session(again):
            done = await restarted.agent().run("cancel UL1")
        assert done.output == "all done"
        assert returns(done.all_messages()) == {
            "c1": "passenger ada", "c2": {"booked": "1A"}, "c3": "cancelled UL1",
        }  # fmt: skip
        tools.calls += restarted.calls
    # The booking never ran again; the cancellation ran once, on the first restart; SAFE
    # lookups run every time.
    assert tools.calls == [
        "lookup ada", "book 1A", "lookup ada", "cancel UL1", "lookup ada",
    ]  # fmt: skip
    assert session_view(proxy, session.session_id)["state"] == "completed"


def test_a_resume_in_a_new_process_finds_its_approval_and_runs_the_approved_call_once(
    proxy: ProxyHarness, tmp_path: Path
) -> None:
    """Pydantic AI's own resume (`message_history` + `deferred_tool_results`, saved as JSON),
    each phase in a new process: the resumed call is the same UndoLog call (its step comes
    from the model's tool-call id, not from a counter in the process)."""
    run = Restarts(proxy, "pydantic_ai", tmp_path)
    started = run("start")
    (waiting,) = started["waiting"]
    assert (waiting["tool_name"], waiting["session_id"]) == ("cancel_flight", run.session_id)
    assert run.ran() == ["lookup ada", "book 1A"]

    # Resumed before anyone decided: it stops at the same approval and opens no other.
    assert run("resume")["waiting"] == [waiting]
    assert run.ran() == ["lookup ada", "book 1A"]

    approve(proxy, waiting["approval_id"])
    done = run("resume")
    assert done["output"] == "all done"
    assert done["returns"]["c3"] == "cancelled UL1"  # the model got the result
    assert run.ran() == ["lookup ada", "book 1A", "cancel UL1"]  # once

    # A restart from the beginning in yet another process replays the recorded calls.
    again = run("restart")
    assert again["output"] == "all done"
    assert again["returns"] == {
        "c1": "passenger ada", "c2": {"booked": "1A"}, "c3": "cancelled UL1",
    }  # fmt: skip
    assert run.ran() == ["lookup ada", "book 1A", "cancel UL1", "lookup ada"]  # SAFE only
    view = session_view(proxy, run.session_id)
    assert [(a["id"], a["status"]) for a in view["approvals"]] == [
        (waiting["approval_id"], "approved"),
    ]  # fmt: skip
    assert [(e["tool_name"], e["state"]) for e in view["effects"]] == [
        ("book_seat", "committed"), ("cancel_flight", "committed"),
    ]  # fmt: skip
    assert view["state"] == "completed"


async def test_a_call_rejected_in_undolog_is_denied_in_the_run_and_never_runs(
    proxy: ProxyHarness, client: UndoLogClient
) -> None:
    tools = Tools(client)
    agent = tools.agent()
    session = UndoLogSession(org_id=proxy.org_id)
    async with run_with_session(session):
        first = await agent.run("cancel UL1")
        assert isinstance(first.output, DeferredToolRequests)
        approval = undolog_approval(first.output, "c3")
        assert approval is not None
        approve(proxy, approval.approval_id, "reject")
        results = await undolog_decisions(first.output)
        done = await agent.run(message_history=first.all_messages(), deferred_tool_results=results)
    assert done.output == "all done"
    assert "cancel UL1" not in tools.calls
    told = str(returns(done.all_messages())["c3"])
    assert approval.approval_id in told and "rejected" in told


async def test_approving_only_in_pydantic_ai_defers_the_call_again(
    proxy: ProxyHarness, client: UndoLogClient
) -> None:
    tools = Tools(client)
    agent = tools.agent()
    session = UndoLogSession(org_id=proxy.org_id)
    async with run_with_session(session):
        first = await agent.run("cancel UL1")
        again = await agent.run(
            message_history=first.all_messages(),
            deferred_tool_results=DeferredToolResults(approvals={"c3": True}),
        )
    assert "cancel UL1" not in tools.calls  # UndoLog has not approved it
    assert isinstance(again.output, DeferredToolRequests)
    assert undolog_approval(again.output, "c3") == undolog_approval(first.output, "c3")
    view = session_view(proxy, session.session_id)
    assert view["state"] == "active"
    assert [a["status"] for a in view["approvals"]] == ["pending"]


async def test_overriding_the_arguments_is_a_new_call_that_needs_its_own_approval(
    proxy: ProxyHarness, client: UndoLogClient
) -> None:
    tools = Tools(client)
    agent = tools.agent()
    session = UndoLogSession(org_id=proxy.org_id)
    async with run_with_session(session):
        first = await agent.run("cancel UL1")
        assert isinstance(first.output, DeferredToolRequests)
        approval = undolog_approval(first.output, "c3")
        assert approval is not None
        approve(proxy, approval.approval_id)
        other = ToolApproved(override_args={"flight": "UL2", "reason": "storm"})
        again = await agent.run(
            message_history=first.all_messages(),
            deferred_tool_results=DeferredToolResults(approvals={"c3": other}),
        )
    assert tools.calls == ["lookup ada", "book 1A"]  # UL2 was never approved
    assert isinstance(again.output, DeferredToolRequests)
    second = undolog_approval(again.output, "c3")
    assert second is not None and second.approval_id != approval.approval_id


async def test_a_failed_run_rolls_the_session_back_newest_first(
    proxy: ProxyHarness, client: UndoLogClient
) -> None:
    tools = Tools(client)

    async def charge(cents: int) -> str:
        raise ConnectionError("the payment provider is down")

    failing = undolog_pydantic_tool(
        charge, tier=ToolTier.COMPENSABLE, compensation=UNBOOK, client=client
    )
    model = scripted(
        [
            call("book_seat", {"seat": "1A"}, "c1"),
            call("book_seat", {"seat": "2B"}, "c2"),
            call("charge", {"cents": 1999}, "c3"),
        ]
    )
    agent = Agent(model, tools=[*tools.tools, failing])
    unbooked.clear()
    session = UndoLogSession(org_id=proxy.org_id)
    with pytest.raises(ConnectionError, match="the payment provider is down"):
        async with run_with_session(session):
            await agent.run("book two")
    assert unbooked == ["2B", "1A"]  # compensations ran, newest first
    assert session_view(proxy, session.session_id)["state"] == "compensated"


async def test_safe_tools_run_without_a_session_and_the_proxy_never_hears_of_them() -> None:
    tools = Tools(UndoLogClient(NOWHERE))
    agent = tools.agent([call("lookup", {"name": "ada"}, "c1"), "ok"])
    done = await agent.run("who")
    assert done.output == "ok" and tools.calls == ["lookup ada"]


async def test_without_a_session_an_undolog_call_says_how_to_give_it_one() -> None:
    tools = Tools(UndoLogClient(NOWHERE))
    agent = tools.agent([call("book_seat", {"seat": "1A"}, "c1"), "ok"])
    with pytest.raises(RuntimeError, match="run_with_session"):
        await agent.run("book")
    assert tools.calls == []


def test_tools_keep_their_schema_and_docstring_and_need_a_tier() -> None:
    lookup, book, cancel = Tools(UndoLogClient(NOWHERE)).tools
    assert (lookup.name, lookup.description) == ("lookup", "Find a passenger.")
    assert cancel.function_schema.json_schema["required"] == ["flight", "reason"]
    assert set(book.function_schema.json_schema["properties"]) == {"seat"}

    async def purge(table: str) -> str:
        return table

    with pytest.raises(ValueError, match="no tier for 'purge'"):
        undolog_pydantic_tool(purge)
    with pytest.raises(ValueError, match="no tier for purge"):
        undolog_pydantic_tools([purge], tiers={})
    with pytest.raises(ValueError, match="COMPENSABLE tool needs a compensation"):
        undolog_pydantic_tool(purge, tier="compensable")


def test_the_module_exports_are_pinned_and_the_sdk_never_imports_the_framework() -> None:
    import undolog_sdk.integrations.pydantic_ai as module

    assert module.__all__ == [
        "METADATA_KEY",
        "UndoLogApproval",
        "undolog_approval",
        "undolog_decisions",
        "undolog_pydantic_tool",
        "undolog_pydantic_tools",
    ]
    code = (
        "import sys, undolog_sdk, undolog_sdk.decorators, undolog_sdk.integrations;"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] == 'pydantic_ai');"
        "print(bad); sys.exit(1 if bad else 0)"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr
