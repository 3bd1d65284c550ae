"""The CrewAI integration against the real `crewai` package, a scripted model (a `BaseLLM`
whose answers are ReAct steps, no network) and a real proxy (uvicorn on loopback), both
stores: an IRREVERSIBLE call is a tool result naming its UndoLog approval; approving it and
running the crew again replays the recorded calls and runs it once; a rejected call never runs;
a failed crew rolls back; results never enter CrewAI's tool cache.

CrewAI cannot join the `dev` group beside the server (docs/integrations/crewai.md): these tests
skip without it. Run them in an environment with both, e.g.
`pip install -e '.[server,otel]' --group dev crewai` (pip picks crewai 1.6.1 there).
"""

from __future__ import annotations

import atexit
import json
import os
import shutil
import subprocess
import sys
import tempfile
from typing import Any

import pytest

pytest.importorskip(
    "crewai", reason="crewai is not installed (it cannot join the dev group: see the docstring)"
)

# CrewAI's telemetry and trace upload stay off and its first-run prompt away (the tests never
# leave the machine); its task-output database goes to a temporary directory, not the home.
# CrewAI reads these when a crew runs; set only where it is installed, so a skip changes nothing.
os.environ.setdefault("CREWAI_DISABLE_TELEMETRY", "true")
os.environ.setdefault("CREWAI_TRACING_ENABLED", "false")
os.environ.setdefault("CREWAI_TESTING", "true")
if "CREWAI_STORAGE_DIR" not in os.environ:
    os.environ["CREWAI_STORAGE_DIR"] = storage = tempfile.mkdtemp(prefix="undolog-crewai-")
    atexit.register(shutil.rmtree, storage, ignore_errors=True)

from crewai import Agent, Crew, Task
from crewai.llms.base_llm import BaseLLM

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
from undolog_sdk.integrations.crewai import (
    UndoLogApproval,
    UndoLogCrewTool,
    undolog_crewai_tool,
    undolog_crewai_tools,
    undolog_kickoff,
)

# CrewAI's own modules warn on import and while running (pydantic, its event bus): not ours.
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

NOWHERE = "http://127.0.0.1:9"  # a proxy that is not there
UNBOOK = CompensationDescriptor.new("crew_unbook_seat")
unbooked: list[str] = []


@compensation("crew_unbook_seat")
async def unbook_seat(*, original_args: dict[str, Any], **_: Any) -> None:
    unbooked.append(original_args["seat"])


def act(tool: str, args: dict[str, Any]) -> str:
    return f"Thought: I use {tool}\nAction: {tool}\nAction Input: {json.dumps(args)}"


def final(answer: str) -> str:
    return f"Thought: I now know the final answer\nFinal Answer: {answer}"


class Scripted(BaseLLM):
    """A model that answers its n-th request with `steps[n]` (an exception is raised; the last
    step answers every later request: CrewAI retries a failed model call) and keeps what it was
    shown (the tools' results are in the conversation)."""

    def __init__(self, steps: list[str | Exception]) -> None:
        super().__init__(model="scripted")
        self.steps = steps
        self.seen: list[str] = []

    def call(self, messages: Any, *args: Any, **kwargs: Any) -> str:
        self.seen.append(messages if isinstance(messages, str) else json.dumps(messages))
        step = self.steps[min(len(self.seen), len(self.steps)) - 1]
        if isinstance(step, Exception):
            raise step
        return step

    def supports_function_calling(self) -> bool:
        return False  # the ReAct text protocol, the same on every CrewAI release

    def supports_stop_words(self) -> bool:
        return False


SCRIPT: list[str | Exception] = [
    act("lookup", {"name": "ada"}),
    act("book_seat", {"seat": "1A"}),
    act("cancel_flight", {"flight": "UL1", "reason": "storm"}),
    final("all done"),
]


class Tools:
    """A booking crew's tools, counting the runs of each body, and the approvals surfaced."""

    def __init__(self, client: UndoLogClient) -> None:
        booking = booking_tools(client)
        self.calls = booking.calls
        self.approvals: list[UndoLogApproval] = []
        lookup, book_seat, cancel_flight = booking.lookup, booking.book_seat, booking.cancel_flight
        self.tools: list[UndoLogCrewTool] = [
            *undolog_crewai_tools(
                [lookup, book_seat],
                tiers={"lookup": "safe", "book_seat": ToolTier.COMPENSABLE},
                compensations={"book_seat": UNBOOK},
                client=client,
            ),
            undolog_crewai_tool(cancel_flight, on_approval=self.approvals.append),
        ]

    def crew(self, llm: Scripted, *extra: UndoLogCrewTool) -> Crew:
        agent = Agent(
            role="booking agent",
            goal="cancel flight UL1",
            backstory="You book and cancel flights.",
            tools=[*self.tools, *extra],
            llm=llm,
            verbose=False,
            max_iter=len(llm.steps) + 1,
        )
        task = Task(description="Cancel UL1.", expected_output="a sentence", agent=agent)
        return Crew(agents=[agent], tasks=[task], verbose=False)


def told(llm: Scripted, text: str) -> bool:
    """Whether the model was shown `text` (a tool result) in a later request."""
    return any(text in seen for seen in llm.seen)


async def test_an_irreversible_call_is_a_result_naming_its_approval_and_does_not_run(
    proxy: ProxyHarness, client: UndoLogClient
) -> None:
    tools = Tools(client)
    llm = Scripted(SCRIPT)
    session = UndoLogSession(org_id=proxy.org_id)
    async with run_with_session(session):
        output = await undolog_kickoff(tools.crew(llm))
    assert str(output) == "all done"
    assert tools.calls == ["lookup ada", "book 1A"]  # the cancellation did not run
    (approval,) = tools.approvals
    assert (approval.tool_name, approval.tool_args, approval.step_index) == (
        "cancel_flight", {"flight": "UL1", "reason": "storm"}, 2,
    )  # fmt: skip
    assert approval.session_id == session.session_id
    assert told(llm, "passenger ada") and told(llm, f"approval {approval.approval_id}")
    view = session_view(proxy, session.session_id)
    assert [a["id"] for a in view["approvals"]] == [approval.approval_id]
    assert [a["status"] for a in view["approvals"]] == ["pending"]
    assert view["state"] == "active"  # left normally while waiting: still open


async def test_a_crew_run_again_replays_recorded_calls_and_runs_the_approved_one_once(
    proxy: ProxyHarness, client: UndoLogClient
) -> None:
    tools = Tools(client)
    session = UndoLogSession(org_id=proxy.org_id)
    async with run_with_session(session):
        await undolog_kickoff(tools.crew(Scripted(SCRIPT)))
    (approval,) = tools.approvals
    approve(proxy, approval.approval_id)

    # The crew runs again from the beginning in the same session, with a fresh process's state.
    for _ in range(2):
        restarted = Tools(client)
        llm = Scripted(SCRIPT)
        again = UndoLogSession(org_id=proxy.org_id, session_id=session.session_id)
        async with run_with_session(again):
            output = await undolog_kickoff(restarted.crew(llm))
        assert str(output) == "all done" and restarted.approvals == []
        assert told(llm, "booked") and told(llm, "cancelled UL1")
        tools.calls += restarted.calls
    # The booking never ran again; the cancellation ran once, on the first rerun; SAFE
    # lookups run every time.
    assert tools.calls == [
        "lookup ada", "book 1A", "lookup ada", "cancel UL1", "lookup ada",
    ]  # fmt: skip
    view = session_view(proxy, session.session_id)
    assert [(e["tool_name"], e["state"]) for e in view["effects"]] == [
        ("book_seat", "committed"), ("cancel_flight", "committed"),
    ]  # fmt: skip
    assert view["state"] == "completed"


async def test_a_call_rejected_in_undolog_is_an_error_result_and_never_runs(
    proxy: ProxyHarness, client: UndoLogClient
) -> None:
    tools = Tools(client)
    session = UndoLogSession(org_id=proxy.org_id)
    async with run_with_session(session):
        await undolog_kickoff(tools.crew(Scripted(SCRIPT)))
        (approval,) = tools.approvals
        approve(proxy, approval.approval_id, "reject")
        llm = Scripted(SCRIPT)
        output = await undolog_kickoff(tools.crew(llm))  # the same process runs it again
    assert str(output) == "all done"
    assert "cancel UL1" not in tools.calls
    assert told(llm, "rejected")  # CrewAI gave the agent the tool's error
    assert session_view(proxy, session.session_id)["state"] == "halted"


async def test_a_failed_crew_rolls_the_session_back_newest_first(
    proxy: ProxyHarness, client: UndoLogClient
) -> None:
    tools = Tools(client)
    llm = Scripted(
        [
            act("book_seat", {"seat": "1A"}),
            act("book_seat", {"seat": "2B"}),
            RuntimeError("the model gave up"),
        ]
    )
    unbooked.clear()
    session = UndoLogSession(org_id=proxy.org_id)
    with pytest.raises(Exception, match="the model gave up"):
        async with run_with_session(session):
            await undolog_kickoff(tools.crew(llm))
    assert tools.calls == ["book 1A", "book 2B"]
    assert unbooked == ["2B", "1A"]  # compensations ran, newest first
    assert session_view(proxy, session.session_id)["state"] == "compensated"


async def test_repeated_calls_bypass_crewais_cache_and_sync_functions_run_in_a_thread(
    proxy: ProxyHarness, client: UndoLogClient
) -> None:
    runs: list[str] = []

    def reserve(seat: str) -> str:
        """Hold a seat for ten minutes (a plain function)."""
        runs.append(seat)
        return f"held {seat}"

    hold = undolog_crewai_tool(
        reserve, tier=ToolTier.COMPENSABLE, compensation=UNBOOK, client=client
    )
    tools = Tools(client)
    script: list[str | Exception] = [
        act("reserve", {"seat": "3C"}),
        act("lookup", {"name": "ada"}),  # CrewAI refuses the same call twice in a row
        act("reserve", {"seat": "3C"}),
        final("held"),
    ]
    session = UndoLogSession(org_id=proxy.org_id)
    async with run_with_session(session):
        await undolog_kickoff(tools.crew(Scripted(script), hold))
    # Two calls, two steps: CrewAI's tool cache (on by default) did not answer the second.
    assert runs == ["3C", "3C"]
    view = session_view(proxy, session.session_id)
    assert [(e["tool_name"], e["step_index"]) for e in view["effects"]] == [
        ("reserve", 1), ("reserve", 2),
    ]  # fmt: skip


async def test_without_a_session_an_undolog_call_is_an_error_saying_how_to_give_it_one() -> None:
    tools = Tools(UndoLogClient(NOWHERE))
    llm = Scripted([act("lookup", {"name": "ada"}), act("book_seat", {"seat": "1A"}), final("ok")])
    await undolog_kickoff(tools.crew(llm))
    assert tools.calls == ["lookup ada"]  # SAFE runs; the proxy never hears of it
    assert told(llm, "run_with_session")


def test_tools_keep_their_schema_and_docstring_and_need_a_tier() -> None:
    lookup, book, cancel = Tools(UndoLogClient(NOWHERE)).tools
    assert (lookup.name, book.name, cancel.name) == ("lookup", "book_seat", "cancel_flight")
    assert "Find a passenger." in lookup.description
    assert cancel.args_schema.model_json_schema()["required"] == ["flight", "reason"]
    assert set(book.args_schema.model_json_schema()["properties"]) == {"seat"}
    assert not book.cache_function({"seat": "1A"}, {"booked": "1A"})

    async def purge(table: str) -> str:
        return table

    with pytest.raises(ValueError, match="no tier for 'purge'"):
        undolog_crewai_tool(purge)
    with pytest.raises(ValueError, match="no tier for purge"):
        undolog_crewai_tools([purge], tiers={})
    with pytest.raises(ValueError, match="COMPENSABLE tool needs a compensation"):
        undolog_crewai_tool(purge, tier="compensable")


def test_the_module_exports_are_pinned_and_the_sdk_never_imports_the_framework() -> None:
    import undolog_sdk.integrations.crewai as module

    assert module.__all__ == [
        "UndoLogApproval",
        "UndoLogCrewTool",
        "undolog_crewai_tool",
        "undolog_crewai_tools",
        "undolog_kickoff",
    ]
    code = (
        "import sys, undolog_sdk, undolog_sdk.decorators, undolog_sdk.integrations;"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] == 'crewai');"
        "print(bad); sys.exit(1 if bad else 0)"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr
