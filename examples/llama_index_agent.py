"""A LlamaIndex agent whose tools go through UndoLog, against a running UndoLog proxy.

The model is scripted (`MockFunctionCallingLLM`: no provider key, no network): it looks a
customer up (SAFE), charges their card (COMPENSABLE: recorded exactly once, its refund on the
undo stack) and deletes their data (IRREVERSIBLE). The deletion waits through LlamaIndex's own
human-in-the-loop events: `UndoLogApprovalRequired` (an `InputRequiredEvent`) on the run's
stream, answered with `UndoLogDecision` once a person has decided in UndoLog.

Configuration, from the environment:

    UNDOLOG_PROXY_URL    the proxy (default http://localhost:8080)
    UNDOLOG_API_KEY      an `agent` key of the org (its tools registered by an admin or the
                         config; `serve --demo` registers this example's tools)
    UNDOLOG_ORG_ID       the org the key belongs to (default "demo", the org of `--demo`)
    UNDOLOG_SESSION_ID   restart this session instead of starting a new one
    AGENT_WAIT           "1": wait for the decision (asking every retry_after seconds) and
                         resume the run, instead of stopping

Try it with `undolog serve --demo` (it prints an agent key and an approver key):

    pip install 'undolog[llama-index]'
    UNDOLOG_API_KEY=<agent key> python examples/llama_index_agent.py
    undolog approvals approve <printed approval id> --api-key <approver key>
    UNDOLOG_API_KEY=<agent key> UNDOLOG_SESSION_ID=<printed session> \\
        python examples/llama_index_agent.py

The second run is the agent restarted: the charge is replayed (its body does not run) and the
approved deletion runs.
"""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Sequence
from typing import Any

from llama_index.core.agent.workflow import AgentOutput, FunctionAgent, ToolCallResult
from llama_index.core.base.llms.types import ChatMessage, MessageRole, ToolCallBlock
from llama_index.core.llms.mock import MockFunctionCallingLLM
from shop import COMPENSATIONS, SHOP_TOOLS, TIERS, say  # the shop's tools, next to this file

from undolog_sdk import (
    UndoLogClient,
    UndoLogSession,
    run_with_session,
)
from undolog_sdk.integrations.llama_index import UndoLogApprovalRequired, undolog_llama_tools

client = UndoLogClient()  # UNDOLOG_PROXY_URL and UNDOLOG_API_KEY


TOOLS = undolog_llama_tools(
    SHOP_TOOLS,
    tiers=TIERS,
    compensations=COMPENSATIONS,
    client=client,
)

SCRIPT: list[ToolCallBlock | str] = [
    ToolCallBlock(
        tool_call_id="call_1", tool_name="search_customers", tool_kwargs={"query": "ada"}
    ),
    ToolCallBlock(
        tool_call_id="call_2",
        tool_name="charge_card",
        tool_kwargs={"customer_id": "cus_42", "cents": 1999},
    ),
    ToolCallBlock(
        tool_call_id="call_3",
        tool_name="delete_customer_data",
        tool_kwargs={"customer_id": "cus_42"},
    ),
    "Charged cus_42 and deleted their data.",
]


def scripted_model(messages: Sequence[ChatMessage], **_: Any) -> ChatMessage:
    """What a real model would decide: the n-th answer for the n-th request of the
    conversation, the same on every start, as a replay needs."""
    step = SCRIPT[sum(m.role == MessageRole.ASSISTANT for m in messages)]
    if isinstance(step, str):
        return ChatMessage(role=MessageRole.ASSISTANT, content=step)
    return ChatMessage(role=MessageRole.ASSISTANT, blocks=[step])


async def decided(session: UndoLogSession, event: UndoLogApprovalRequired) -> None:
    """Ask UndoLog until a person has decided the approval."""
    while True:
        record = await client.get_approval(session.org_id, event.approval_id)
        if record.get("status") != "pending":
            return
        await asyncio.sleep(event.retry_after or 5)


async def run(agent: FunctionAgent, session: UndoLogSession, *, wait: bool) -> int:
    handler = agent.run("Refund-proof Ada's account.")
    async for event in handler.stream_events():
        if isinstance(event, ToolCallResult) and not event.tool_output.is_error:
            say(f"{event.tool_name} -> {event.tool_output.content}")
        if not isinstance(event, UndoLogApprovalRequired):
            continue
        say(
            f"{event.tool_name} awaits approval {event.approval_id} "
            f"(step {event.step_index}); ask again in {event.retry_after}s"
        )
        if not wait:
            await handler.cancel_run()
            say(f"stopping; rerun with UNDOLOG_SESSION_ID={session.session_id} once approved")
            return 2  # leaving the session block now keeps the session (and approval) open
        await decided(session, event)
        handler.ctx.send_event(event.decided())  # LlamaIndex replays the call: it runs now
    result: AgentOutput = await handler
    say(f"agent -> {result.response.content}")
    return 0


async def main() -> int:
    session = UndoLogSession(org_id=os.environ.get("UNDOLOG_ORG_ID", "demo"))
    session.session_id = os.environ.get("UNDOLOG_SESSION_ID") or session.session_id
    say(f"session {session.session_id}")
    llm = MockFunctionCallingLLM(response_generator=scripted_model)
    agent = FunctionAgent(tools=[*TOOLS], llm=llm, streaming=False)
    try:
        async with run_with_session(session):
            return await run(agent, session, wait=os.environ.get("AGENT_WAIT") == "1")
    finally:
        await client.aclose()


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
