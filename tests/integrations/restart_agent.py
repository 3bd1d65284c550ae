"""The booking agent of the restart tests, one phase per process: each test runs this module
with `python -m tests.integrations.restart_agent FRAMEWORK PHASE CONFIG` in a fresh interpreter,
so nothing of one phase survives into the next but what the framework persisted (a file).

FRAMEWORK is `pydantic_ai` or `openai_agents`; PHASE is

- `start`: run the agent until it stops for approval and save its state to `config["state"]`
  (Pydantic AI: the message history and the `DeferredToolRequests`, as JSON; the Agents SDK:
  `RunState.to_string()`); print the UndoLog approval;
- `resume`: resume from the saved state, as the framework documents it (Pydantic AI:
  `message_history` + `deferred_tool_results` from `undolog_decisions`; the Agents SDK:
  `RunState.from_string` + `apply_undolog_decisions`), save the new state if it stops again,
  and print how the run ended;
- `restart`: run the agent from the beginning in the same session.

CONFIG is a JSON object: `url`, `api_key`, `org_id`, `session_id`, `state` (a file), `log` (a
file each tool body appends a line to when it runs, so the test counts the runs across
processes). The last line printed is one JSON object.
"""

from __future__ import annotations

import asyncio
import json
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

from undolog_sdk import (
    CompensationDescriptor,
    ToolTier,
    UndoLogClient,
    UndoLogSession,
    run_with_session,
)
from undolog_sdk.compensation import compensation

UNBOOK = CompensationDescriptor.new("restart_unbook_seat")


@compensation("restart_unbook_seat")
async def unbook_seat(*, original_args: dict[str, Any], **_: Any) -> None:
    """Never runs here: no restart test rolls back."""


def booking(log: Path) -> list[Any]:
    """lookup (SAFE), book_seat (COMPENSABLE), cancel_flight (IRREVERSIBLE): each body appends
    a line to `log` when it runs."""

    def ran(line: str) -> None:
        with log.open("a") as f:
            f.write(line + "\n")

    async def lookup(name: str) -> str:
        """Find a passenger."""
        ran(f"lookup {name}")
        return f"passenger {name}"

    async def book_seat(seat: str) -> dict[str, str]:
        """Book a seat."""
        ran(f"book {seat}")
        return {"booked": seat}

    async def cancel_flight(flight: str, reason: str) -> str:
        """Cancel a flight for every passenger: cannot be undone."""
        ran(f"cancel {flight}")
        return f"cancelled {flight}"

    return [lookup, book_seat, cancel_flight]


TIERS = {"lookup": "safe", "book_seat": "compensable", "cancel_flight": ToolTier.IRREVERSIBLE}
COMPENSATIONS = {"book_seat": UNBOOK}


async def pydantic_ai(
    phase: str, config: dict[str, Any], client: UndoLogClient, saved: str
) -> tuple[dict[str, Any], str | None]:
    """The phase's printout, and the state to save (None: the run ended)."""
    from pydantic import TypeAdapter
    from pydantic_ai import Agent, DeferredToolRequests
    from pydantic_ai.messages import (
        ModelMessage,
        ModelMessagesTypeAdapter,
        ModelResponse,
        TextPart,
        ToolCallPart,
        ToolReturnPart,
    )
    from pydantic_ai.models.function import AgentInfo, FunctionModel

    from undolog_sdk.integrations.pydantic_ai import (
        undolog_approval,
        undolog_decisions,
        undolog_pydantic_tools,
    )

    script: list[ModelResponse] = [
        ModelResponse(parts=[ToolCallPart("lookup", {"name": "ada"}, tool_call_id="c1")]),
        ModelResponse(parts=[ToolCallPart("book_seat", {"seat": "1A"}, tool_call_id="c2")]),
        ModelResponse(
            parts=[
                ToolCallPart(
                    "cancel_flight", {"flight": "UL1", "reason": "storm"}, tool_call_id="c3"
                )
            ]
        ),
        ModelResponse(parts=[TextPart("all done")]),
    ]

    def respond(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        return script[sum(isinstance(m, ModelResponse) for m in messages)]

    tools = undolog_pydantic_tools(
        booking(Path(config["log"])), tiers=TIERS, compensations=COMPENSATIONS, client=client
    )
    agent = Agent(FunctionModel(respond), tools=tools, output_type=[str, DeferredToolRequests])
    session = UndoLogSession(
        org_id=config["org_id"], session_id=config["session_id"], client=client
    )
    requests_adapter = TypeAdapter(DeferredToolRequests)

    def ended(messages: list[ModelMessage], output: object) -> tuple[dict[str, Any], str | None]:
        returns = {
            part.tool_call_id: part.content
            for m in messages
            for part in getattr(m, "parts", [])
            if isinstance(part, ToolReturnPart)
        }
        if isinstance(output, DeferredToolRequests):
            state = {
                "messages": ModelMessagesTypeAdapter.dump_python(messages, mode="json"),
                "requests": requests_adapter.dump_python(output, mode="json"),
            }
            approvals = [undolog_approval(output, c.tool_call_id) for c in output.approvals]
            waiting = [asdict(a) for a in approvals if a is not None]
            return {"waiting": waiting, "returns": returns}, json.dumps(state)
        return {"output": output, "returns": returns}, None

    async with run_with_session(session):
        if phase == "resume":
            state = json.loads(saved)
            messages = ModelMessagesTypeAdapter.validate_python(state["messages"])
            requests = requests_adapter.validate_python(state["requests"])
            results = await undolog_decisions(requests)
            for call in requests.approvals:  # undecided in UndoLog: approve it in Pydantic
                results.approvals.setdefault(call.tool_call_id, True)  # AI only; UndoLog decides
            result = await agent.run(message_history=messages, deferred_tool_results=results)
        else:
            result = await agent.run("cancel UL1")
    return ended(result.all_messages(), result.output)


async def openai_agents(
    phase: str, config: dict[str, Any], client: UndoLogClient, saved: str
) -> tuple[dict[str, Any], str | None]:
    """The phase's printout, and the state to save (None: the run ended)."""
    from agents import Agent, RunConfig, Runner, RunState
    from agents.testing import ScriptedModel, assistant_message, function_call

    from undolog_sdk.integrations.openai_agents import (
        apply_undolog_decisions,
        undolog_approval,
        undolog_function_tools,
    )

    calls = [
        [function_call("lookup", {"name": "ada"}, call_id="c1")],
        [function_call("book_seat", {"seat": "1A"}, call_id="c2")],
        [function_call("cancel_flight", {"flight": "UL1", "reason": "storm"}, call_id="c3")],
    ]
    # A resumed run goes on from the model's answer to the cancellation.
    done = [assistant_message("all done")]
    steps = [done] if phase == "resume" else [*calls, done]
    model = ScriptedModel(steps)
    tools = undolog_function_tools(
        booking(Path(config["log"])), tiers=TIERS, compensations=COMPENSATIONS, client=client
    )
    agent = Agent(name="booker", model=model, tools=tools)
    run_config = RunConfig(tracing_disabled=True)
    session = UndoLogSession(
        org_id=config["org_id"], session_id=config["session_id"], client=client
    )
    async with run_with_session(session):
        if phase == "resume":
            state = await RunState.from_string(agent, saved)
            still = await apply_undolog_decisions(state)
            result = await Runner.run(agent, state, run_config=run_config)
        else:
            still = []
            result = await Runner.run(agent, "cancel UL1", run_config=run_config)
        waiting = [undolog_approval(item) for item in result.interruptions]
    outputs = []
    for call in model.calls:
        items = call.input if isinstance(call.input, list) else []
        outputs = [str(i["output"]) for i in items if i.get("type") == "function_call_output"]
    printed = {
        "output": result.final_output,
        "waiting": [asdict(a) if a is not None else None for a in waiting],
        "still_pending": [asdict(a) for a in still],
        "returns": outputs,
    }
    return printed, result.to_state().to_string() if result.interruptions else None


async def run_phase(
    framework: str, phase: str, config: dict[str, Any], saved: str
) -> tuple[dict[str, Any], str | None]:
    client = UndoLogClient(config["url"], api_key=config["api_key"])
    try:
        run = pydantic_ai if framework == "pydantic_ai" else openai_agents
        return await run(phase, config, client, saved)
    finally:
        await client.aclose()


def main(framework: str, phase: str, config: dict[str, Any]) -> None:
    state = Path(config["state"])
    saved = state.read_text() if phase == "resume" else ""
    printed, to_save = asyncio.run(run_phase(framework, phase, config, saved))
    if to_save is not None:
        state.write_text(to_save)
    print(json.dumps(printed))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], json.loads(sys.argv[3]))
