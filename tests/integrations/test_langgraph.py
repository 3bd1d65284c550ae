"""The LangGraph integration against the real `langgraph` package: a scripted chat model (no
network) drives a graph whose tools go through a real proxy (uvicorn on loopback), both stores.

What it maps, and the test that shows it:
- approval: an IRREVERSIBLE call is an `interrupt()` carrying the approval (id, tool, args,
  undo plan); resuming after a person approves runs the tool once and the agent gets its result
  (`test_an_irreversible_call_interrupts_and_runs_once_when_resumed_after_approval`);
- replay: a resumed node and a restarted agent get recorded results without running bodies
  again (`test_a_resumed_node_replays_the_calls_it_already_made`,
  `test_a_restarted_agent_replays_what_its_first_run_did`), and a thread resumed from its
  checkpoint elsewhere maps its call to the approval
  (`test_a_graph_resumed_from_its_checkpoint_elsewhere_runs_the_approved_call`), also from a
  disk checkpoint in a new OS process
  (`test_a_graph_resumed_by_another_process_from_its_disk_checkpoint_runs_the_approved_call_once`);
- conversations: a later user turn and the calls after a rejection go on in the thread's next
  session (`test_a_second_user_turn_on_the_same_thread_goes_on_in_the_threads_next_session`,
  `test_after_a_rejection_the_agent_goes_on_and_the_earlier_calls_stay_for_a_person`);
- rollback: a run that fails rolls the session back, newest first
  (`test_a_failed_run_rolls_the_session_back_newest_first`).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
import warnings
from pathlib import Path
from typing import Any

import pytest
from langchain.agents import create_agent
from langchain_core.messages import AIMessage, HumanMessage
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.types import Command

from tests.integrations.langgraph_helpers import (
    ScriptedModel,
    agent_graph,
    approve,
    calls_tools,
    thread,
    tool_messages,
)
from tests.proxy.conftest import ProxyHarness
from tests.sdk.helpers import session_view
from tests.support.servers import await_until
from undolog_sdk import CompensationDescriptor, UndoLogClient, UndoLogSession, run_with_session
from undolog_sdk.compensation import compensation
from undolog_sdk.integrations.langgraph import (
    APPROVAL_TYPE,
    approval_requests,
    langgraph_tool,
    langgraph_tools,
    next_session_id,
)


def make_tools(client: UndoLogClient, ran: list[str], undo: str = "unbook") -> list[Any]:
    async def find_seat(cabin: str) -> str:
        """Find a free seat."""
        ran.append(f"find {cabin}")
        return "1A"

    async def book(seat: str) -> dict[str, str]:
        """Book a seat."""
        ran.append(f"book {seat}")
        return {"booked": seat}

    async def drop(db: str) -> str:
        """Drop a database."""
        ran.append(f"drop {db}")
        return f"dropped {db}"

    async def explode(why: str) -> str:
        """Fail."""
        ran.append(f"explode {why}")
        raise LookupError(why)

    return langgraph_tools(
        [find_seat, book, drop, explode],
        tiers={"find_seat": "safe", "book": "compensable", "drop": "irreversible",
               "explode": "compensable"},
        compensations={"book": CompensationDescriptor.new(undo, {"why": "rolled back"}),
                       "explode": CompensationDescriptor.new(undo)},
        client=client,
    )  # fmt: skip


def prebuilt_agent(factory: str, model: ScriptedModel, tools: list[Any]) -> Any:
    if factory == "create_agent":
        return create_agent(model, tools, checkpointer=InMemorySaver())
    from langgraph.prebuilt import create_react_agent

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        return create_react_agent(model, tools, checkpointer=InMemorySaver())


async def test_an_irreversible_call_interrupts_and_runs_once_when_resumed_after_approval(
    proxy: ProxyHarness, client: UndoLogClient
) -> None:
    ran: list[str] = []
    model = ScriptedModel(
        script=[
            calls_tools(("find_seat", {"cabin": "eco"})),
            calls_tools(("book", {"seat": "1A"})),
            calls_tools(("drop", {"db": "prod"})),
            AIMessage("all done"),
        ]
    )
    graph, config = agent_graph(model, make_tools(client, ran)), thread()
    session = UndoLogSession(org_id=proxy.org_id)
    async with run_with_session(session):
        result = await graph.ainvoke({"messages": [HumanMessage("go")]}, config)
    (request,) = approval_requests(result)
    view = session_view(proxy, session.session_id)
    (approval,) = view["approvals"]
    book_effect = view["effects"][0]
    assert request == {
        "type": APPROVAL_TYPE,
        "approval_id": approval["id"],
        "tool": "drop",
        "args": {"db": "prod"},
        "step_index": 3,  # the third tool call of the conversation
        "session_id": session.session_id,
        "tool_call_id": model.script[2].tool_calls[0]["id"],
        "retry_after": request["retry_after"],
        "undo_plan": [
            {"tool": "book", "args": {"seat": "1A"}, "step_index": 2,
             "effect_id": book_effect["effect_id"], "compensation": "unbook",
             "compensation_args": {"why": "rolled back"}},
        ],
    }  # fmt: skip
    assert approval["status"] == "pending"
    assert view["state"] == "active"  # the block ended while the approval waits: still open
    assert ran == ["find eco", "book 1A"]

    # Resumed before anyone decided: the graph stops again at the same approval.
    async with run_with_session(UndoLogSession(proxy.org_id, session.session_id)):
        result = await graph.ainvoke(Command(resume="approved?"), config)
    assert [r["approval_id"] for r in approval_requests(result)] == [approval["id"]]
    assert ran == ["find eco", "book 1A"]

    approve(proxy, approval["id"])
    async with run_with_session(UndoLogSession(proxy.org_id, session.session_id)):
        result = await graph.ainvoke(Command(resume="approved"), config)
    assert "__interrupt__" not in result
    assert ran == ["find eco", "book 1A", "drop prod"]  # the approved call ran once
    assert tool_messages(result)[-1].content == "dropped prod"  # and the agent got its result
    assert result["messages"][-1].content == "all done"
    view = session_view(proxy, session.session_id)
    effects = [
        (e["tool_name"], e["step_index"], e["state"], e["attempts"]) for e in view["effects"]
    ]
    assert effects == [("book", 2, "committed", 1), ("drop", 3, "committed", 1)]
    assert view["state"] == "completed"


async def test_a_resumed_node_replays_the_calls_it_already_made(
    proxy: ProxyHarness, client: UndoLogClient
) -> None:
    """Two calls in one model turn, run by one `ToolNode`: LangGraph re-runs the whole node on
    the resume, and the call that already ran replays."""
    ran: list[str] = []
    model = ScriptedModel(
        script=[calls_tools(("drop", {"db": "old"}), ("book", {"seat": "2B"})), AIMessage("ok")]
    )
    graph, config = agent_graph(model, make_tools(client, ran)), thread()
    session = UndoLogSession(org_id=proxy.org_id)
    async with run_with_session(session):
        result = await graph.ainvoke({"messages": [HumanMessage("go")]}, config)
    (request,) = approval_requests(result)
    assert (request["tool"], request["step_index"]) == ("drop", 1)
    assert ran == ["book 2B"]  # the sibling finished before the graph stopped
    assert [(p["tool"], p["step_index"]) for p in request["undo_plan"]] == [("book", 2)]
    approve(proxy, request["approval_id"])
    async with run_with_session(UndoLogSession(proxy.org_id, session.session_id)):
        result = await graph.ainvoke(Command(resume=True), config)
    assert ran == ["book 2B", "drop old"]  # book replayed: its body did not run again
    assert [m.content for m in tool_messages(result)] == ["dropped old", '{"booked": "2B"}']
    effects = session_view(proxy, session.session_id)["effects"]
    assert [(e["tool_name"], e["step_index"], e["replay_count"]) for e in effects] == [
        ("drop", 1, 0), ("book", 2, 1),
    ]  # fmt: skip


async def test_a_restarted_agent_replays_what_its_first_run_did(
    proxy: ProxyHarness, client: UndoLogClient
) -> None:
    """The agent process dies after its first run stopped at the approval; a new one (a new
    graph, nothing checkpointed) runs the same conversation in the same UndoLog session."""
    ran: list[str] = []
    script = [
        calls_tools(("book", {"seat": "3C"})),
        calls_tools(("drop", {"db": "tmp"})),
        AIMessage("done"),
    ]
    session = UndoLogSession(org_id=proxy.org_id)
    async with run_with_session(session):
        first = await agent_graph(ScriptedModel(script=script), make_tools(client, ran)).ainvoke(
            {"messages": [HumanMessage("go")]}, thread()
        )
    (request,) = approval_requests(first)
    approve(proxy, request["approval_id"])

    restarted = agent_graph(ScriptedModel(script=script), make_tools(client, ran))
    async with run_with_session(UndoLogSession(proxy.org_id, session.session_id)):
        second = await restarted.ainvoke({"messages": [HumanMessage("go")]}, thread())
    assert ran == ["book 3C", "drop tmp"]  # book replayed, drop ran once
    assert [m.content for m in tool_messages(second)] == ['{"booked": "3C"}', "dropped tmp"]
    assert session_view(proxy, session.session_id)["state"] == "completed"


async def test_a_graph_resumed_from_its_checkpoint_elsewhere_runs_the_approved_call(
    proxy: ProxyHarness, client: UndoLogClient
) -> None:
    """Another agent process (new graph, tools, client and session object; the checkpoint
    store shared, as a database checkpointer would be) resumes the stopped thread: nothing of
    the first process's memory is needed to map the call to its approval."""
    ran: list[str] = []
    script = [calls_tools(("book", {"seat": "8H"})), calls_tools(("drop", {"db": "x"})),
              AIMessage("done")]  # fmt: skip
    checkpoints, config = InMemorySaver(), thread()

    session_id = str(uuid.uuid4())
    async with run_with_session(UndoLogSession(proxy.org_id, session_id)):
        first = await agent_graph(
            ScriptedModel(script=script), make_tools(client, ran), checkpoints
        ).ainvoke({"messages": [HumanMessage("go")]}, config)
    (request,) = approval_requests(first)
    approve(proxy, request["approval_id"])

    other_client = UndoLogClient(proxy.url, api_key=proxy.api_key)
    try:
        async with run_with_session(UndoLogSession(proxy.org_id, session_id)):
            second = await agent_graph(
                ScriptedModel(script=script), make_tools(other_client, ran), checkpoints
            ).ainvoke(Command(resume="ok"), config)
    finally:
        await other_client.aclose()
    assert ran == ["book 8H", "drop x"]
    assert tool_messages(second)[-1].content == "dropped x"
    assert session_view(proxy, session_id)["state"] == "completed"


async def test_a_failed_run_rolls_the_session_back_newest_first(
    proxy: ProxyHarness, client: UndoLogClient
) -> None:
    ran: list[str] = []
    undone: list[str] = []
    undo = f"unbook_{uuid.uuid4().hex[:8]}"

    @compensation(undo)
    async def unbook(*, original_args: dict[str, Any], **_: Any) -> None:
        undone.append(original_args.get("seat") or "?")

    model = ScriptedModel(
        script=[
            calls_tools(("book", {"seat": "4D"})),
            calls_tools(("book", {"seat": "5E"})),
            calls_tools(("explode", {"why": "no fuel"})),
            AIMessage("unreachable"),
        ]
    )
    graph = agent_graph(model, make_tools(client, ran, undo))
    session = UndoLogSession(org_id=proxy.org_id)
    with pytest.raises(LookupError, match="no fuel"):
        async with run_with_session(session):
            await graph.ainvoke({"messages": [HumanMessage("go")]}, thread())
    assert ran == ["book 4D", "book 5E", "explode no fuel"]
    assert undone == ["5E", "4D"]  # the failed call took no effect: nothing to undo for it
    view = session_view(proxy, session.session_id)
    assert view["state"] == "compensated"
    assert [(e["tool_name"], e["state"]) for e in view["effects"]] == [
        ("book", "compensated"), ("book", "compensated"), ("explode", "failed"),
    ]  # fmt: skip


async def test_a_rejected_call_reaches_the_agent_as_an_error_message(
    proxy: ProxyHarness, client: UndoLogClient
) -> None:
    ran: list[str] = []
    model = ScriptedModel(script=[calls_tools(("drop", {"db": "prod"})), AIMessage("understood")])
    graph, config = agent_graph(model, make_tools(client, ran)), thread()
    session = UndoLogSession(org_id=proxy.org_id)
    async with run_with_session(session):
        result = await graph.ainvoke({"messages": [HumanMessage("go")]}, config)
    (request,) = approval_requests(result)
    approve(proxy, request["approval_id"], "reject")
    async with run_with_session(UndoLogSession(proxy.org_id, session.session_id)):
        result = await graph.ainvoke(Command(resume="decided"), config)
    (message,) = tool_messages(result)
    assert message.status == "error"
    assert str(message.content).startswith(
        "UndoLog: the call of 'drop' will not run (approval_rejected): "
    )
    assert result["messages"][-1].content == "understood"
    assert ran == []
    # A rejection halts the session (the engine's rule): its recorded calls are over.
    assert session_view(proxy, session.session_id)["state"] == "halted"


async def test_an_approval_that_timed_out_reaches_the_agent_as_an_error_message(
    proxy_factory: Any,
) -> None:
    harness: ProxyHarness = proxy_factory(
        {"approval_timeout_seconds": 1}, approval_sweep_seconds=0.1
    )
    client = UndoLogClient(harness.url, api_key=harness.api_key)
    ran: list[str] = []
    model = ScriptedModel(script=[calls_tools(("drop", {"db": "prod"})), AIMessage("too late")])
    graph, config = agent_graph(model, make_tools(client, ran)), thread()
    session = UndoLogSession(org_id=harness.org_id)
    try:
        async with run_with_session(session):
            result = await graph.ainvoke({"messages": [HumanMessage("go")]}, config)
        (request,) = approval_requests(result)

        def timed_out() -> bool:
            with harness.client() as c:
                approval = c.get(f"/approvals/{request['approval_id']}").json()
            return bool(approval["status"] == "timed_out")

        await await_until(timed_out, what="the approval to time out")
        async with run_with_session(UndoLogSession(harness.org_id, session.session_id)):
            result = await graph.ainvoke(Command(resume="decided"), config)
    finally:
        await client.aclose()
    (message,) = tool_messages(result)
    assert message.status == "error"
    assert "(approval_timed_out)" in str(message.content)
    assert result["messages"][-1].content == "too late"
    assert ran == []


@pytest.mark.parametrize("factory", ["create_agent", "create_react_agent"])
async def test_the_prebuilt_agent_interrupts_and_resumes(
    proxy: ProxyHarness, client: UndoLogClient, factory: str
) -> None:
    """langchain's `create_agent` (and langgraph's deprecated `create_react_agent`, still
    shipped) dispatches each tool call as its own task; both calls of one turn map."""
    ran: list[str] = []
    model = ScriptedModel(
        script=[calls_tools(("book", {"seat": "6F"}), ("drop", {"db": "logs"})), AIMessage("ok")]
    )
    agent = prebuilt_agent(factory, model, make_tools(client, ran))
    config = thread()
    session = UndoLogSession(org_id=proxy.org_id)
    async with run_with_session(session):
        result = await agent.ainvoke({"messages": [HumanMessage("go")]}, config)
    (request,) = approval_requests(result)
    assert (request["tool"], request["args"], request["step_index"]) == ("drop", {"db": "logs"}, 2)
    # The call waited for its sibling before stopping the graph: the plan shows the booking.
    assert [(p["tool"], p["args"]) for p in request["undo_plan"]] == [("book", {"seat": "6F"})]
    approve(proxy, request["approval_id"])
    async with run_with_session(UndoLogSession(proxy.org_id, session.session_id)):
        result = await agent.ainvoke(Command(resume="ok"), config)
    assert sorted(ran) == ["book 6F", "drop logs"]
    assert sorted(str(m.content) for m in tool_messages(result)) == [
        "dropped logs", '{"booked": "6F"}',
    ]  # fmt: skip
    assert result["messages"][-1].content == "ok"


async def test_outside_a_tool_node_the_tools_are_plain_undolog_tools(
    proxy: ProxyHarness, client: UndoLogClient
) -> None:
    from undolog_sdk import AwaitingApprovalError

    ran: list[str] = []
    find_seat, book, drop, _ = make_tools(client, ran)
    assert await find_seat.ainvoke({"cabin": "biz"}) == "1A"  # SAFE: no session needed
    with pytest.raises(RuntimeError, match="run_with_session"):
        await book.ainvoke({"seat": "7G"})
    session = UndoLogSession(org_id=proxy.org_id)
    async with run_with_session(session):
        assert await book.ainvoke({"seat": "7G"}) == {"booked": "7G"}
        with pytest.raises(AwaitingApprovalError):  # no graph to interrupt: the SDK's error
            await drop.ainvoke({"db": "x"})
    assert ran == ["find biz", "book 7G"]
    assert [e["step_index"] for e in session_view(proxy, session.session_id)["effects"]] == [1, 2]


def test_the_tools_keep_their_schemas_and_never_guess_a_tier() -> None:
    async def reserve(seat: str, hold_minutes: int = 15) -> dict[str, Any]:
        """Reserve a seat for a while."""
        return {}

    tool = langgraph_tool(reserve, "compensable", CompensationDescriptor.new("release"))
    assert tool.name == "reserve"
    assert tool.description == "Reserve a seat for a while."
    schema = tool.tool_call_schema.model_json_schema()
    assert set(schema["properties"]) == {"seat", "hold_minutes"}  # the runtime is injected
    assert schema["required"] == ["seat"]
    with pytest.raises(ValueError, match="no tier for reserve"):
        langgraph_tools([reserve], tiers={})
    with pytest.raises(ValueError, match="COMPENSABLE tool needs a compensation"):
        langgraph_tool(reserve, "compensable")

    async def clash(undolog_runtime: str) -> None:
        """Takes the reserved name."""

    with pytest.raises(ValueError, match="'undolog_runtime' is reserved"):
        langgraph_tool(clash, "safe")


def test_importing_the_sdk_imports_no_framework() -> None:
    code = (
        "import sys, undolog_sdk, undolog_sdk.integrations; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in "
        "('langgraph', 'langchain_core', 'langsmith')))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert done.stdout.strip() == "[]"


@pytest.mark.parametrize("prebuilt", [False, True], ids=["tool_node", "create_agent"])
async def test_two_approvals_in_one_turn_are_both_asked_and_one_resume_runs_both(
    proxy: ProxyHarness, client: UndoLogClient, prebuilt: bool
) -> None:
    """A `ToolNode` runs the turn's calls in one LangGraph task, which surfaces one interrupt;
    the prebuilt agent runs each call as its own task, which surfaces both. Either way both
    approvals are pending in UndoLog, and once both are approved one resume runs both."""
    ran: list[str] = []
    model = ScriptedModel(
        script=[calls_tools(("drop", {"db": "a"}), ("drop", {"db": "b"})), AIMessage("ok")]
    )
    graph: Any
    if prebuilt:
        graph = prebuilt_agent("create_agent", model, make_tools(client, ran))
    else:
        graph = agent_graph(model, make_tools(client, ran))
    config = thread()
    session = UndoLogSession(org_id=proxy.org_id)
    async with run_with_session(session):
        result = await graph.ainvoke({"messages": [HumanMessage("go")]}, config)
    requests = approval_requests(result)
    approvals = session_view(proxy, session.session_id)["approvals"]
    assert sorted(a["args"]["db"] for a in approvals) == ["a", "b"]
    assert {r["approval_id"] for r in requests} <= {a["id"] for a in approvals}
    assert len(requests) == (2 if prebuilt else 1)
    for approval in approvals:
        approve(proxy, approval["id"])
    # Several pending interrupts are resumed by id (LangGraph's rule); the values do not matter.
    resume = {i.id: "ok" for i in result["__interrupt__"]}
    async with run_with_session(UndoLogSession(proxy.org_id, session.session_id)):
        result = await graph.ainvoke(Command(resume=resume), config)
    assert approval_requests(result) == []
    assert sorted(ran) == ["drop a", "drop b"]
    assert session_view(proxy, session.session_id)["state"] == "completed"


def test_the_public_names_are_pinned() -> None:
    from undolog_sdk.integrations import langgraph

    assert sorted(langgraph.__all__) == [
        "APPROVAL_TYPE", "approval_requests", "langgraph_tool", "langgraph_tools",
        "next_session_id", "undo_plan",
    ]  # fmt: skip


async def test_a_second_user_turn_on_the_same_thread_goes_on_in_the_threads_next_session(
    proxy: ProxyHarness, client: UndoLogClient
) -> None:
    """The README's way: the thread id is the session id, for every turn. The first turn
    completes it; each later turn goes on in the next session of the thread's chain, and a
    failed turn rolls back its own calls only."""
    ran: list[str] = []
    undone: list[str] = []
    undo = f"unbook_{uuid.uuid4().hex[:8]}"

    @compensation(undo)
    async def unbook(*, original_args: dict[str, Any], **_: Any) -> None:
        undone.append(original_args["seat"])

    model = ScriptedModel(
        script=[
            calls_tools(("book", {"seat": "1A"})), AIMessage("booked 1A"),
            calls_tools(("book", {"seat": "1A"})), AIMessage("booked 1A again"),
            calls_tools(("book", {"seat": "2B"})), calls_tools(("explode", {"why": "x"})),
            AIMessage("unreachable"),
        ]
    )  # fmt: skip
    graph, config = agent_graph(model, make_tools(client, ran, undo)), thread()
    thread_id = config["configurable"]["thread_id"]
    for text in ("book 1A", "book 1A again"):
        async with run_with_session(UndoLogSession(proxy.org_id, thread_id)) as session:
            result = await graph.ainvoke({"messages": [HumanMessage(text)]}, config)
        assert "__interrupt__" not in result
    assert ran == ["book 1A", "book 1A"]  # the person asked twice: two calls, both ran
    second = next_session_id(thread_id)
    assert session.session_id == second  # the session object follows the thread
    for sid in (thread_id, second):
        view = session_view(proxy, sid)
        assert view["state"] == "completed"
        assert [(e["tool_name"], e["state"]) for e in view["effects"]] == [("book", "committed")]

    # A third turn fails: its own booking is rolled back; the first two turns stay in place.
    with pytest.raises(LookupError, match="x"):
        async with run_with_session(UndoLogSession(proxy.org_id, thread_id)):
            await graph.ainvoke({"messages": [HumanMessage("book 2B, then fail")]}, config)
    assert undone == ["2B"]
    third = session_view(proxy, next_session_id(second))
    assert third["state"] == "compensated"
    assert [(e["tool_name"], e["state"]) for e in third["effects"]] == [
        ("book", "compensated"), ("explode", "failed"),
    ]  # fmt: skip
    assert session_view(proxy, thread_id)["state"] == "completed"


async def test_after_a_rejection_the_agent_goes_on_and_the_earlier_calls_stay_for_a_person(
    proxy: ProxyHarness, client: UndoLogClient
) -> None:
    """A rejection halts the session (the engine's rule) and keeps its undo stack: the agent
    gets the refusal as the tool's result, its next calls go on in the thread's next session,
    and the earlier booking stays in place until a person rolls the halted session back."""
    ran: list[str] = []
    undone: list[str] = []
    undo = f"unbook_{uuid.uuid4().hex[:8]}"

    @compensation(undo)
    async def unbook(*, original_args: dict[str, Any], **_: Any) -> None:
        undone.append(original_args["seat"])

    model = ScriptedModel(
        script=[
            calls_tools(("book", {"seat": "4D"})),
            calls_tools(("drop", {"db": "prod"})),
            calls_tools(("book", {"seat": "5E"})),
            AIMessage("booked 5E; the drop was refused"),
        ]
    )
    graph, config = agent_graph(model, make_tools(client, ran, undo)), thread()
    session_id = config["configurable"]["thread_id"]
    async with run_with_session(UndoLogSession(proxy.org_id, session_id)):
        result = await graph.ainvoke({"messages": [HumanMessage("go")]}, config)
    (request,) = approval_requests(result)
    approve(proxy, request["approval_id"], "reject")
    async with run_with_session(UndoLogSession(proxy.org_id, session_id)):
        result = await graph.ainvoke(Command(resume="decided"), config)
    assert ran == ["book 4D", "book 5E"]  # the agent went on after the refusal
    refusal = tool_messages(result)[1]
    assert refusal.status == "error"
    assert "(approval_rejected)" in str(refusal.content)
    assert f"session {session_id} is halted" in str(refusal.content)  # kept, and said so
    assert result["messages"][-1].content == "booked 5E; the drop was refused"

    halted = session_view(proxy, session_id)
    assert halted["state"] == "halted"
    assert [(u["state"]) for u in halted["undo_stack"]] == ["pending"]  # nothing forgotten
    after = session_view(proxy, next_session_id(session_id))
    assert after["state"] == "completed"
    assert [(e["tool_name"], e["args"]) for e in after["effects"]] == [("book", {"seat": "5E"})]

    # A person rolls the halted session back (the dashboard's button, `undolog sessions
    # rollback ID`, or the SDK as here): the earlier booking is undone.
    await UndoLogSession(proxy.org_id, session_id, client=client).rollback()
    assert undone == ["4D"]
    assert session_view(proxy, session_id)["state"] == "compensated"


def run_agent_process(proxy: ProxyHarness, phase: str, folder: Path, session_id: str) -> Any:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(p for p in sys.path if p),
        "UNDOLOG_PROXY_URL": proxy.url,
        "UNDOLOG_API_KEY": proxy.api_key,
    }
    done = subprocess.run(
        [sys.executable, "-m", "tests.integrations.langgraph_process", phase, str(folder),
         proxy.org_id, session_id],
        cwd=Path(__file__).resolve().parents[2], env=env, capture_output=True, text=True,
        timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])


def test_a_graph_resumed_by_another_process_from_its_disk_checkpoint_runs_the_approved_call_once(
    proxy: ProxyHarness, tmp_path: Path
) -> None:
    """One process runs the graph until the drop waits for approval and exits; a person
    approves over REST; a new process resumes the thread from the checkpoint on disk. Its
    `ToolNode` runs the whole turn again: the booking replays (its body does not run again),
    the drop finds the existing approval and runs once, and no second approval is asked."""
    session_id = str(uuid.uuid4())
    first = run_agent_process(proxy, "start", tmp_path, session_id)
    (request,) = first["requests"]
    assert (request["tool"], request["tool_call_id"]) == ("drop", "call_drop")
    assert (tmp_path / "ran.txt").read_text().splitlines() == ["book 9J"]
    approve(proxy, request["approval_id"])

    second = run_agent_process(proxy, "resume", tmp_path, session_id)
    assert second["requests"] == []
    assert second["tool_messages"] == ['{"booked": "9J"}', "dropped legacy"]
    assert (tmp_path / "ran.txt").read_text().splitlines() == ["book 9J", "drop legacy"]
    view = session_view(proxy, session_id)
    assert len(view["approvals"]) == 1  # the resumed call found the existing approval
    assert [(e["tool_name"], e["state"], e["attempts"], e["replay_count"])
            for e in view["effects"]] == [
        ("book", "committed", 1, 1), ("drop", "committed", 1, 0),
    ]  # fmt: skip
    assert view["state"] == "completed"
