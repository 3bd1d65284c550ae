"""An agent process of the LangGraph tests: one graph run (start or resume) on a thread whose
checkpoints persist to disk, then the process exits.

    python -m tests.integrations.langgraph_process start|resume DIR ORG_ID SESSION_ID

The graph is the ReAct loop around one `ToolNode`: the calls of a turn are one LangGraph task,
which LangGraph runs again whole on a resume (so a call that finished before the interrupt is
made again, and must replay). `create_agent` runs each call as its own task and re-runs only
the interrupted one, an easier case the in-process tests cover.

The proxy and its key come from `UNDOLOG_PROXY_URL` and `UNDOLOG_API_KEY`. The checkpoints live
in DIR (LangGraph's `InMemorySaver` over its `PersistentDict`: pickled to disk when the process
closes it), and every tool body that runs appends a line to DIR/ran.txt, so the test counts runs
across processes. The process prints its outcome as one JSON line: the approval requests among
the interrupts and the tool messages the agent got.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langgraph.checkpoint.memory import InMemorySaver, PersistentDict
from langgraph.types import Command

from tests.integrations.langgraph_helpers import ScriptedModel, agent_graph
from undolog_sdk import CompensationDescriptor, UndoLogClient, UndoLogSession, run_with_session
from undolog_sdk.integrations.langgraph import approval_requests, langgraph_tools

# The model's tool-call ids are part of the script: the same in every process, as a real
# model's are once the checkpoint holds them.
SCRIPT = [
    AIMessage(
        "",
        tool_calls=[
            {"name": "book", "args": {"seat": "9J"}, "id": "call_book"},
            {"name": "drop", "args": {"db": "legacy"}, "id": "call_drop"},
        ],
    ),
    AIMessage("booked and dropped"),
]


def disk_saver(folder: Path) -> InMemorySaver:
    """LangGraph's in-memory checkpointer whose three dicts are read from and written to
    `folder` (on `saver.stack.close()`)."""
    names = iter(("storage", "writes", "blobs"))

    def persistent(*args: Any) -> PersistentDict:
        table = PersistentDict(*args, filename=str(folder / f"{next(names)}.pickle"))
        if Path(table.filename).exists():
            table.load()
        return table

    return InMemorySaver(factory=persistent)  # type: ignore[arg-type]


def tools(client: UndoLogClient, folder: Path) -> list[Any]:
    def record(line: str) -> None:
        with (folder / "ran.txt").open("a") as ran:
            ran.write(line + "\n")

    async def book(seat: str) -> dict[str, str]:
        """Book a seat."""
        record(f"book {seat}")
        return {"booked": seat}

    async def drop(db: str) -> str:
        """Drop a database."""
        record(f"drop {db}")
        return f"dropped {db}"

    return langgraph_tools(
        [book, drop],
        tiers={"book": "compensable", "drop": "irreversible"},
        compensations={"book": CompensationDescriptor.new("unbook")},
        client=client,
    )


async def main(phase: str, folder: Path, org_id: str, session_id: str) -> dict[str, Any]:
    client = UndoLogClient()
    saver = disk_saver(folder)
    try:
        agent = agent_graph(ScriptedModel(script=SCRIPT), tools(client, folder), saver)
        config: Any = {"configurable": {"thread_id": session_id}}
        graph_input: Any = (
            {"messages": [HumanMessage("book and drop")]}
            if phase == "start"
            else Command(resume="decided")
        )
        async with run_with_session(UndoLogSession(org_id, session_id)):
            result = await agent.ainvoke(graph_input, config)
    finally:
        saver.stack.close()  # writes the checkpoints to disk
        await client.aclose()
    return {
        "requests": approval_requests(result),
        "tool_messages": [str(m.content) for m in result["messages"] if isinstance(m, ToolMessage)],
    }


if __name__ == "__main__":
    phase, folder, org_id, session_id = sys.argv[1:5]
    print(json.dumps(asyncio.run(main(phase, Path(folder), org_id, session_id))), flush=True)
