"""An OpenAI Agents SDK agent whose tools go through UndoLog, against a running UndoLog proxy.

The model is scripted (no OpenAI key, no network): it looks a customer up (SAFE), charges their
card (COMPENSABLE: recorded exactly once, its refund on the undo stack) and deletes their data
(IRREVERSIBLE). The deletion stops the run with the SDK's own approval interruption, which
carries the UndoLog approval; once a person approves it in UndoLog, the run resumes and the
deletion runs, once.

Configuration, from the environment:

    UNDOLOG_PROXY_URL    the proxy (default http://localhost:8080)
    UNDOLOG_API_KEY      an `agent` key of the org (its tools registered by an admin or the
                         config; `serve --demo` registers this example's tools)
    UNDOLOG_ORG_ID       the org the key belongs to (default "demo", the org of `--demo`)
    UNDOLOG_SESSION_ID   restart this session instead of starting a new one
    AGENT_WAIT           "1": wait for the decision (asking every retry_after seconds) and
                         resume the run, instead of stopping

Try it with `undolog serve --demo` (it prints an agent key and an approver key):

    pip install 'undolog[openai-agents]'
    UNDOLOG_API_KEY=<agent key> python examples/openai_agents_agent.py
    undolog approvals approve <printed approval id> --api-key <approver key>
    UNDOLOG_API_KEY=<agent key> UNDOLOG_SESSION_ID=<printed session> \\
        python examples/openai_agents_agent.py

The second run is the agent restarted: the charge is replayed (its body does not run) and the
approved deletion runs.
"""

from __future__ import annotations

import asyncio
import os
import sys
from typing import Any

from agents import Agent, RunConfig, Runner
from agents.testing import ScriptedModel, assistant_message, function_call
from shop import COMPENSATIONS, SHOP_TOOLS, TIERS, say  # the shop's tools, next to this file

from undolog_sdk import (
    UndoLogClient,
    UndoLogSession,
    run_with_session,
)
from undolog_sdk.integrations.openai_agents import (
    apply_undolog_decisions,
    undolog_approval,
    undolog_function_tools,
)

client = UndoLogClient()  # UNDOLOG_PROXY_URL and UNDOLOG_API_KEY


TOOLS = undolog_function_tools(
    SHOP_TOOLS,
    tiers=TIERS,
    compensations=COMPENSATIONS,
    client=client,
)


def scripted_model() -> ScriptedModel:
    """What a real model would decide; the same on every start, as a replay needs."""
    return ScriptedModel(
        [
            [function_call("search_customers", {"query": "ada"}, call_id="call_1")],
            [
                function_call(
                    "charge_card", {"customer_id": "cus_42", "cents": 1999}, call_id="call_2"
                )
            ],
            [function_call("delete_customer_data", {"customer_id": "cus_42"}, call_id="call_3")],
            [assistant_message("Charged cus_42 and deleted their data.")],
        ]
    )


RUN_CONFIG = RunConfig(tracing_disabled=True)


async def run(agent: Agent[Any], session: UndoLogSession, *, wait: bool) -> int:
    result = await Runner.run(agent, "Refund-proof Ada's account.", run_config=RUN_CONFIG)
    while result.interruptions:  # the SDK's approval interruptions, UndoLog's approvals
        for item in result.interruptions:
            approval = undolog_approval(item)
            assert approval is not None
            say(
                f"{approval.tool_name} awaits approval {approval.approval_id} "
                f"(step {approval.step_index}); ask again in {approval.retry_after}s"
            )
        if not wait:
            say(f"stopping; rerun with UNDOLOG_SESSION_ID={session.session_id} once approved")
            return 2  # leaving the session block now keeps the session (and approval) open
        state = result.to_state()
        while True:  # ask UndoLog until a person has decided
            pending = await apply_undolog_decisions(state)
            if not pending:
                break
            await asyncio.sleep(pending[0].retry_after or 5)
        result = await Runner.run(agent, state, run_config=RUN_CONFIG)
    say(f"agent -> {result.final_output}")
    return 0


async def main() -> int:
    session = UndoLogSession(org_id=os.environ.get("UNDOLOG_ORG_ID", "demo"))
    session.session_id = os.environ.get("UNDOLOG_SESSION_ID") or session.session_id
    say(f"session {session.session_id}")
    agent = Agent(name="support", model=scripted_model(), tools=[*TOOLS])
    try:
        async with run_with_session(session):
            return await run(agent, session, wait=os.environ.get("AGENT_WAIT") == "1")
    finally:
        await client.aclose()


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
