"""A LangGraph agent whose tools go through UndoLog, driven by a scripted model (no LLM, no
network besides the proxy).

The graph is langchain's prebuilt agent (`create_agent`, the successor of langgraph's
deprecated `create_react_agent`) holding the tools of `examples/agent.py`, made LangGraph tools
by `langgraph_tools`: it looks a customer up (SAFE),
charges their card (COMPENSABLE: recorded once, its refund on the undo stack) and deletes their
data (IRREVERSIBLE). The deletion stops the graph with a LangGraph interrupt carrying the
UndoLog approval request (its id, the call, and the undo plan: what a rollback would undo).

Configuration, from the environment:

    UNDOLOG_PROXY_URL    the proxy (default http://localhost:8080)
    UNDOLOG_API_KEY      an `agent` key of the org (`serve --demo` registers these tools)
    UNDOLOG_ORG_ID       the org the key belongs to (default "demo", the org of `--demo`)
    UNDOLOG_SESSION_ID   resume this session instead of starting a new one
    AGENT_WAIT           "1": keep the graph and resume it (`Command(resume=...)`) every
                         retry_after seconds until the approval is decided, instead of stopping

Try it with `pip install 'undolog[langgraph]'` and `undolog serve --demo` running:

    UNDOLOG_API_KEY=<agent key> python examples/langgraph_agent.py
    undolog approvals approve <printed approval id> --api-key <approver key>
    UNDOLOG_API_KEY=<agent key> UNDOLOG_SESSION_ID=<printed id> python examples/langgraph_agent.py

The first run charges the card and stops at the interrupt. The second is a restarted agent: a
new process and a new graph, in the same UndoLog session. The charge is replayed (its body does
not run again) and the approved deletion runs, once.
"""

from __future__ import annotations

import asyncio
import os
import sys
from typing import Any

from langchain.agents import create_agent
from langchain_core.language_models.chat_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.types import Command

from undolog_sdk import CompensationDescriptor, UndoLogClient, UndoLogSession, run_with_session
from undolog_sdk.integrations.langgraph import approval_requests, langgraph_tools

client = UndoLogClient()  # UNDOLOG_PROXY_URL and UNDOLOG_API_KEY


def say(text: str) -> None:
    print(text, flush=True)


async def search_customers(query: str) -> list[dict[str, Any]]:
    """Find customers by name."""
    say(f"[tool] search_customers runs ({query!r})")
    return [{"customer_id": "cus_42", "name": "Ada Lovelace"}]


async def charge_card(customer_id: str, cents: int) -> dict[str, Any]:
    """Charge a customer's card."""
    say(f"[tool] charge_card runs ({customer_id}, {cents})")
    return {"charge_id": "ch_1", "customer_id": customer_id, "cents": cents}


async def delete_customer_data(customer_id: str) -> dict[str, Any]:
    """Delete everything stored about a customer."""
    say(f"[tool] delete_customer_data runs ({customer_id})")
    return {"deleted": customer_id}


TOOLS = langgraph_tools(
    [search_customers, charge_card, delete_customer_data],
    tiers={
        "search_customers": "safe",
        "charge_card": "compensable",
        "delete_customer_data": "irreversible",
    },
    compensations={
        "charge_card": CompensationDescriptor.new("refund_charge", {"reason": "rolled back"})
    },
    client=client,
)


def tool_turn(n: int, name: str, args: dict[str, Any]) -> AIMessage:
    return AIMessage("", tool_calls=[{"name": name, "args": args, "id": f"call_{n}"}])


class ScriptedModel(BaseChatModel):
    """Answers the n-th model turn of the conversation with `SCRIPT[n]` (an LLM would decide)."""

    @property
    def _llm_type(self) -> str:
        return "scripted"

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: Any = None,
        **kwargs: Any,
    ) -> ChatResult:
        turn = sum(isinstance(m, AIMessage) for m in messages)
        return ChatResult(generations=[ChatGeneration(message=SCRIPT[turn])])

    def bind_tools(self, tools: Any, **kwargs: Any) -> Any:
        return self  # the script already knows the tools


SCRIPT = [
    tool_turn(1, "search_customers", {"query": "ada"}),
    tool_turn(2, "charge_card", {"customer_id": "cus_42", "cents": 1999}),
    tool_turn(3, "delete_customer_data", {"customer_id": "cus_42"}),
    AIMessage("Charged Ada's card and deleted her data."),
]


def build_graph() -> Any:
    # Interrupts need a checkpointer; a real agent keeps its checkpoints in a database
    # (langgraph-checkpoint-sqlite or -postgres) so another process can resume the thread.
    return create_agent(ScriptedModel(), TOOLS, checkpointer=InMemorySaver())


async def run(session_id: str | None, *, wait: bool) -> int:
    org_id = os.environ.get("UNDOLOG_ORG_ID", "demo")
    session_id = session_id or UndoLogSession(org_id=org_id).session_id
    say(f"session {session_id}")
    graph = build_graph()
    config = {"configurable": {"thread_id": session_id}}
    graph_input: Any = {"messages": [HumanMessage("Charge Ada 19.99, then delete her data.")]}
    while True:
        # A fresh session object per run of the graph, same id: the block completes it when
        # the graph ends, and leaves it open while an approval waits.
        async with run_with_session(UndoLogSession(org_id, session_id)):
            result = await graph.ainvoke(graph_input, config)
        requests = approval_requests(result)
        if not requests:
            break
        for request in requests:
            plan = [f"{p['tool']} -> {p['compensation']}" for p in request["undo_plan"]]
            say(
                f"{request['tool']} awaits approval {request['approval_id']} "
                f"(step {request['step_index']}); undo plan {plan}; "
                f"ask again in {request['retry_after']}s"
            )
        if not wait:
            say(f"stopping; once approved, rerun with UNDOLOG_SESSION_ID={session_id}")
            return 2
        await asyncio.sleep(requests[0]["retry_after"] or 5)
        graph_input = Command(resume="decided?")  # UndoLog decides: the tool asks it again
    for message in result["messages"]:
        if isinstance(message, ToolMessage):
            say(f"{message.name} -> {message.content}")
    say(f"agent: {result['messages'][-1].content}")
    return 0


async def main() -> int:
    try:
        wait = os.environ.get("AGENT_WAIT") == "1"
        return await run(os.environ.get("UNDOLOG_SESSION_ID"), wait=wait)
    finally:
        await client.aclose()


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
