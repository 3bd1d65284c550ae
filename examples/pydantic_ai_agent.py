"""A Pydantic AI agent whose tools go through UndoLog, against a running UndoLog proxy.

The model is scripted (`FunctionModel`: no provider key, no network): it looks a customer up
(SAFE), charges their card (COMPENSABLE: recorded exactly once, its refund on the undo stack)
and deletes their data (IRREVERSIBLE). The deletion ends the run with Pydantic AI's own
deferred approval (`DeferredToolRequests`), which carries the UndoLog approval; once a person
approves it in UndoLog, the run resumes and the deletion runs, once.

Configuration, from the environment:

    UNDOLOG_PROXY_URL    the proxy (default http://localhost:8080)
    UNDOLOG_API_KEY      an `agent` key of the org (its tools registered by an admin or the
                         config; `serve --demo` registers this example's tools)
    UNDOLOG_ORG_ID       the org the key belongs to (default "demo", the org of `--demo`)
    UNDOLOG_SESSION_ID   restart this session instead of starting a new one
    AGENT_WAIT           "1": wait for the decision (asking every retry_after seconds) and
                         resume the run, instead of stopping

Try it with `undolog serve --demo` (it prints an agent key and an approver key):

    pip install 'undolog[pydantic-ai]'
    UNDOLOG_API_KEY=<agent key> python examples/pydantic_ai_agent.py
    undolog approvals approve <printed approval id> --api-key <approver key>
    UNDOLOG_API_KEY=<agent key> UNDOLOG_SESSION_ID=<printed session> \\
        python examples/pydantic_ai_agent.py

The second run is the agent restarted: the charge is replayed (its body does not run) and the
approved deletion runs.
"""

from __future__ import annotations

import asyncio
import os
import sys
from typing import Any

from pydantic_ai import Agent, DeferredToolRequests
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart
from pydantic_ai.models.function import AgentInfo, FunctionModel
from shop import COMPENSATIONS, SHOP_TOOLS, TIERS, say  # the shop's tools, next to this file

from undolog_sdk import (
    UndoLogClient,
    UndoLogSession,
    run_with_session,
)
from undolog_sdk.integrations.pydantic_ai import (
    undolog_approval,
    undolog_decisions,
    undolog_pydantic_tools,
)

client = UndoLogClient()  # UNDOLOG_PROXY_URL and UNDOLOG_API_KEY


TOOLS = undolog_pydantic_tools(
    SHOP_TOOLS,
    tiers=TIERS,
    compensations=COMPENSATIONS,
    client=client,
)

SCRIPT: list[ToolCallPart | TextPart] = [
    ToolCallPart("search_customers", {"query": "ada"}, tool_call_id="call_1"),
    ToolCallPart("charge_card", {"customer_id": "cus_42", "cents": 1999}, tool_call_id="call_2"),
    ToolCallPart("delete_customer_data", {"customer_id": "cus_42"}, tool_call_id="call_3"),
    TextPart("Charged cus_42 and deleted their data."),
]


def scripted_model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    """What a real model would decide: the n-th answer for the n-th request of the
    conversation, the same on every start, as a replay needs."""
    return ModelResponse(parts=[SCRIPT[sum(isinstance(m, ModelResponse) for m in messages)]])


async def run(agent: Agent[None, Any], session: UndoLogSession, *, wait: bool) -> int:
    result = await agent.run("Refund-proof Ada's account.")
    while isinstance(requests := result.output, DeferredToolRequests):
        retry_after = 5
        for deferred in requests.approvals:  # Pydantic AI's deferred approvals, UndoLog's
            approval = undolog_approval(requests, deferred.tool_call_id)
            assert approval is not None
            retry_after = approval.retry_after or retry_after
            say(
                f"{approval.tool_name} awaits approval {approval.approval_id} "
                f"(step {approval.step_index}); ask again in {approval.retry_after}s"
            )
        if not wait:
            say(f"stopping; rerun with UNDOLOG_SESSION_ID={session.session_id} once approved")
            return 2  # leaving the session block now keeps the session (and approval) open
        while True:  # ask UndoLog until a person has decided
            results = await undolog_decisions(requests)
            if requests.remaining(results) is None:
                break
            await asyncio.sleep(retry_after)
        result = await agent.run(
            message_history=result.all_messages(), deferred_tool_results=results
        )
    say(f"agent -> {result.output}")
    return 0


async def main() -> int:
    session = UndoLogSession(org_id=os.environ.get("UNDOLOG_ORG_ID", "demo"))
    session.session_id = os.environ.get("UNDOLOG_SESSION_ID") or session.session_id
    say(f"session {session.session_id}")
    agent = Agent(
        FunctionModel(scripted_model), tools=TOOLS, output_type=[str, DeferredToolRequests]
    )
    try:
        async with run_with_session(session):
            return await run(agent, session, wait=os.environ.get("AGENT_WAIT") == "1")
    finally:
        await client.aclose()


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
