"""The OpenAI Agents SDK integration against the real `agents` package, a scripted model (no
network) and a real proxy (uvicorn on loopback), both stores: an IRREVERSIBLE call surfaces as
the SDK's own approval interruption carrying the UndoLog approval; approving it in UndoLog and
resuming runs the tool once; a restarted agent replays; a failed run rolls back.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("agents")

from agents import Agent, FunctionTool, RunConfig, Runner, UserError
from agents.testing import ScriptedModel, assistant_message, function_call

from tests.integrations.booking import booking_tools
from tests.integrations.conftest import Restarts, approve
from tests.proxy.conftest import ProxyHarness
from tests.sdk.helpers import session_view
from undolog_sdk import (
    AwaitingApprovalError,
    CompensationDescriptor,
    ToolTier,
    UndoLogClient,
    UndoLogSession,
    run_with_session,
)
from undolog_sdk.compensation import compensation
from undolog_sdk.integrations.openai_agents import (
    ApprovalStillPending,
    apply_undolog_decisions,
    undolog_approval,
    undolog_function_tool,
    undolog_function_tools,
)

NO_TRACING = RunConfig(tracing_disabled=True)
NOWHERE = "http://127.0.0.1:9"  # a proxy that is not there
UNBOOK = CompensationDescriptor.new("agents_unbook_seat")
unbooked: list[str] = []


@compensation("agents_unbook_seat")
async def unbook_seat(*, original_args: dict[str, Any], **_: Any) -> None:
    unbooked.append(original_args["seat"])


class Tools:
    """A booking agent's tools, counting the runs of each body."""

    def __init__(self, client: UndoLogClient) -> None:
        booking = booking_tools(client)
        self.calls = booking.calls
        lookup, book_seat, cancel_flight = booking.lookup, booking.book_seat, booking.cancel_flight

        self.tools: list[FunctionTool] = [
            *undolog_function_tools(
                [lookup, book_seat],
                tiers={"lookup": "safe", "book_seat": ToolTier.COMPENSABLE},
                compensations={"book_seat": UNBOOK},
                client=client,
            ),
            undolog_function_tool(cancel_flight),
        ]

    def agent(self, steps: Sequence[Any]) -> tuple[Agent[Any], ScriptedModel]:
        model = ScriptedModel(steps)
        return Agent(name="booker", model=model, tools=list(self.tools)), model


def script() -> list[Any]:
    """Look up, book a seat, cancel the flight, then say so."""
    return [
        [function_call("lookup", {"name": "ada"}, call_id="c1")],
        [function_call("book_seat", {"seat": "1A"}, call_id="c2")],
        [function_call("cancel_flight", {"flight": "UL1", "reason": "storm"}, call_id="c3")],
        [assistant_message("all done")],
    ]


def tool_outputs(model: ScriptedModel) -> list[str]:
    """What the model was told the tools returned, in order."""
    call = model.last_call
    assert call is not None
    items = call.input if isinstance(call.input, list) else []
    return [str(i["output"]) for i in items if i.get("type") == "function_call_output"]


async def test_an_irreversible_call_is_the_sdks_approval_interruption_and_runs_once_approved(
    proxy: ProxyHarness, client: UndoLogClient
) -> None:
    tools = Tools(client)
    agent, model = tools.agent(script())
    session = UndoLogSession(org_id=proxy.org_id)
    async with run_with_session(session):
        first = await Runner.run(agent, "cancel UL1", run_config=NO_TRACING)
    assert first.final_output is None
    (item,) = first.interruptions
    approval = undolog_approval(item, session)
    assert approval is not None
    assert (approval.tool_name, approval.args, approval.step_index, approval.call_id) == (
        "cancel_flight", {"flight": "UL1", "reason": "storm"}, session.step_for_call("c3"), "c3",
    )  # fmt: skip
    assert tools.calls == ["lookup ada", "book 1A"]  # the cancellation did not run
    view = session_view(proxy, session.session_id)
    assert view["state"] == "active"  # left normally while waiting: still open
    assert [a["id"] for a in view["approvals"]] == [approval.approval_id]

    state = first.to_state()
    async with run_with_session(session):
        # Not decided in UndoLog yet: nothing is approved in the SDK's state.
        assert await apply_undolog_decisions(state) == [approval]
        resumed = await Runner.run(agent, state, run_config=NO_TRACING)
    assert [undolog_approval(i, session) for i in resumed.interruptions] == [approval]
    assert tools.calls == ["lookup ada", "book 1A"]

    approve(proxy, approval.approval_id)
    state = resumed.to_state()
    async with run_with_session(session):
        assert await apply_undolog_decisions(state) == []
        done = await Runner.run(agent, state, run_config=NO_TRACING)
    assert done.final_output == "all done"
    assert tools.calls == ["lookup ada", "book 1A", "cancel UL1"]  # once
    assert tool_outputs(model)[-1] == "cancelled UL1"  # the agent got the result
    view = session_view(proxy, session.session_id)
    assert [(e["tool_name"], e["state"]) for e in view["effects"]] == [
        ("book_seat", "committed"), ("cancel_flight", "committed"),
    ]  # fmt: skip
    assert view["state"] == "completed"


async def test_a_restarted_agent_replays_recorded_calls_and_runs_the_approved_one_once(
    proxy: ProxyHarness, client: UndoLogClient
) -> None:
    tools = Tools(client)
    agent, _ = tools.agent(script())
    session = UndoLogSession(org_id=proxy.org_id)
    async with run_with_session(session):
        first = await Runner.run(agent, "cancel UL1", run_config=NO_TRACING)
    approval = undolog_approval(first.interruptions[0], session)
    assert approval is not None
    approve(proxy, approval.approval_id)

    # The agent restarts from the beginning in the same session, with a fresh process's state.
    for _ in range(2):
        restarted = Tools(client)
        agent, model = restarted.agent(script())
        again = UndoLogSession(org_id=proxy.org_id, session_id=session.session_id)
        async with run_with_session(again):
            done = await Runner.run(agent, "cancel UL1", run_config=NO_TRACING)
        assert done.final_output == "all done" and not done.interruptions
        assert tool_outputs(model) == ["passenger ada", "{'booked': '1A'}", "cancelled UL1"]
        tools.calls += restarted.calls
    # The booking never ran again; the cancellation ran once, on the first restart; SAFE
    # lookups run every time.
    assert tools.calls == [
        "lookup ada", "book 1A", "lookup ada", "cancel UL1", "lookup ada",
    ]  # fmt: skip
    assert session_view(proxy, session.session_id)["state"] == "completed"


def test_a_run_state_restored_from_json_in_a_new_process_runs_the_approved_call_once(
    proxy: ProxyHarness, tmp_path: Path
) -> None:
    """The SDK's own resume (`RunState.to_string` / `RunState.from_string`), each phase in a
    new process: the resumed call is the same UndoLog call (its step comes from the model's
    call id, not from a counter in the process)."""
    run = Restarts(proxy, "openai_agents", tmp_path)
    started = run("start")
    assert started["output"] is None
    (waiting,) = started["waiting"]
    assert (waiting["tool_name"], waiting["call_id"], waiting["session_id"]) == (
        "cancel_flight", "c3", run.session_id,
    )  # fmt: skip
    assert waiting["args"] == {"flight": "UL1", "reason": "storm"}
    assert run.ran() == ["lookup ada", "book 1A"]

    # Resumed before anyone decided: the restored state finds the same approval, the run
    # stops at it again, and no other approval is opened.
    pending = run("resume")
    restored = {**waiting, "retry_after": None}  # read from the session, not asked again
    assert pending["still_pending"] == [restored]
    assert pending["waiting"] == [restored]
    assert run.ran() == ["lookup ada", "book 1A"]

    approve(proxy, waiting["approval_id"])
    done = run("resume")
    assert done["still_pending"] == [] and done["waiting"] == []
    assert done["output"] == "all done"
    assert done["returns"][-1] == "cancelled UL1"  # the model got the result
    assert run.ran() == ["lookup ada", "book 1A", "cancel UL1"]  # once

    # A restart from the beginning in yet another process replays the recorded calls.
    again = run("restart")
    assert again["output"] == "all done" and again["waiting"] == []
    assert again["returns"] == ["passenger ada", "{'booked': '1A'}", "cancelled UL1"]
    assert run.ran() == ["lookup ada", "book 1A", "cancel UL1", "lookup ada"]  # SAFE only
    view = session_view(proxy, run.session_id)
    assert [(a["id"], a["status"]) for a in view["approvals"]] == [
        (waiting["approval_id"], "approved"),
    ]  # fmt: skip
    assert [(e["tool_name"], e["state"]) for e in view["effects"]] == [
        ("book_seat", "committed"), ("cancel_flight", "committed"),
    ]  # fmt: skip
    assert view["state"] == "completed"


async def test_a_call_rejected_in_undolog_is_rejected_in_the_run_and_never_runs(
    proxy: ProxyHarness, client: UndoLogClient
) -> None:
    tools = Tools(client)
    agent, model = tools.agent(script())
    session = UndoLogSession(org_id=proxy.org_id)
    async with run_with_session(session):
        first = await Runner.run(agent, "cancel UL1", run_config=NO_TRACING)
        approval = undolog_approval(first.interruptions[0])
        assert approval is not None
        approve(proxy, approval.approval_id, "reject")
        state = first.to_state()
        assert await apply_undolog_decisions(state) == []
        done = await Runner.run(agent, state, run_config=NO_TRACING)
    assert done.final_output == "all done"
    assert "cancel UL1" not in tools.calls
    told = tool_outputs(model)[-1]
    assert approval.approval_id in told and "rejected" in told


async def test_a_failed_run_rolls_the_session_back_newest_first(
    proxy: ProxyHarness, client: UndoLogClient
) -> None:
    tools = Tools(client)

    async def charge(cents: int) -> str:
        raise ConnectionError("the payment provider is down")

    failing = undolog_function_tool(
        charge,
        tier=ToolTier.COMPENSABLE,
        compensation=UNBOOK,
        client=client,
        failure_error_function=None,  # the tool's error ends the run
    )
    model = ScriptedModel(
        [
            [function_call("book_seat", {"seat": "1A"}, call_id="c1")],
            [function_call("book_seat", {"seat": "2B"}, call_id="c2")],
            [function_call("charge", {"cents": 1999}, call_id="c3")],
        ]
    )
    agent = Agent(name="booker", model=model, tools=[*tools.tools, failing])
    unbooked.clear()
    session = UndoLogSession(org_id=proxy.org_id)
    with pytest.raises(UserError, match="Error running tool charge") as raised:
        async with run_with_session(session):
            await Runner.run(agent, "book two", run_config=NO_TRACING)
    assert isinstance(raised.value.__cause__, ConnectionError)
    assert unbooked == ["2B", "1A"]  # compensations ran, newest first
    view = session_view(proxy, session.session_id)
    assert view["state"] == "compensated"


async def test_safe_tools_run_without_a_session_and_the_proxy_never_hears_of_them() -> None:
    tools = Tools(UndoLogClient(NOWHERE))
    model = ScriptedModel(
        [[function_call("lookup", {"name": "ada"}, call_id="c1")], [assistant_message("ok")]]
    )
    agent = Agent(name="reader", model=model, tools=tools.tools)
    done = await Runner.run(agent, "who", run_config=NO_TRACING)
    assert done.final_output == "ok" and tools.calls == ["lookup ada"]


async def test_without_a_session_an_undolog_call_says_how_to_give_it_one() -> None:
    tools = Tools(UndoLogClient(NOWHERE))
    book = function_call("book_seat", {"seat": "1A"}, call_id="c1")
    cancel = function_call("cancel_flight", {"flight": "UL1", "reason": "x"}, call_id="c2")
    for call in (book, cancel):
        agent, _ = tools.agent([[call], [assistant_message("ok")]])
        with pytest.raises(UserError, match=r"run_with_session\(session\)"):
            await Runner.run(agent, "go", run_config=NO_TRACING)
    assert tools.calls == []


def test_tools_keep_their_schema_and_docstring_and_need_a_tier() -> None:
    lookup, book, cancel = Tools(UndoLogClient(NOWHERE)).tools
    assert (lookup.name, lookup.description) == ("lookup", "Find a passenger.")
    assert cancel.params_json_schema["required"] == ["flight", "reason"]
    assert set(book.params_json_schema["properties"]) == {"seat"}  # no ctx, no _session
    assert lookup.needs_approval is False and book.needs_approval is False
    assert callable(cancel.needs_approval)

    async def purge(table: str) -> str:
        return table

    with pytest.raises(ValueError, match="no tier for 'purge'"):
        undolog_function_tool(purge)
    with pytest.raises(ValueError, match="no tier for purge"):
        undolog_function_tools([purge], tiers={})
    with pytest.raises(ValueError, match="COMPENSABLE tool needs a compensation"):
        undolog_function_tool(purge, tier="compensable")


async def test_approving_only_in_the_sdk_ends_the_run_waiting_and_keeps_the_session_open(
    proxy: ProxyHarness, client: UndoLogClient
) -> None:
    tools = Tools(client)
    agent, _ = tools.agent(script())
    session = UndoLogSession(org_id=proxy.org_id)
    async with run_with_session(session):
        first = await Runner.run(agent, "cancel UL1", run_config=NO_TRACING)
    state = first.to_state()
    state.approve(first.interruptions[0])  # UndoLog has not approved it
    with pytest.raises(ApprovalStillPending) as raised:
        async with run_with_session(session):
            await Runner.run(agent, state, run_config=NO_TRACING)
    assert isinstance(raised.value, AwaitingApprovalError)
    assert raised.value.tool_name == "cancel_flight"
    assert "cancel UL1" not in tools.calls
    view = session_view(proxy, session.session_id)
    assert view["state"] == "active"  # not rolled back: the approval still waits
    assert [a["status"] for a in view["approvals"]] == ["pending"]


def test_the_module_exports_are_pinned_and_the_sdk_never_imports_the_framework() -> None:
    import undolog_sdk.integrations.openai_agents as module

    assert module.__all__ == [
        "ApprovalStillPending",
        "UndoLogApproval",
        "apply_undolog_decisions",
        "undolog_approval",
        "undolog_function_tool",
        "undolog_function_tools",
    ]
    code = (
        "import sys, pkgutil, importlib, undolog_sdk;"
        "[importlib.import_module(m.name) for m in pkgutil.iter_modules("
        "undolog_sdk.__path__, 'undolog_sdk.') if m.name != 'undolog_sdk.integrations'];"
        "import undolog_sdk.integrations;"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('agents', 'pydantic_ai'));"
        "print(bad); sys.exit(1 if bad else 0)"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr
