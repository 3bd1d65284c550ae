"""A Semantic Kernel agent whose functions go through UndoLog, against a running UndoLog proxy.

The chat service is scripted (no provider key, no network): it looks a customer up (SAFE),
charges their card (COMPENSABLE: recorded exactly once, its refund on the undo stack) and
deletes their data (IRREVERSIBLE). The deletion waits for its UndoLog approval: its function
result says so, and `undolog_approval_filter` (an auto function invocation filter) ends the
automatic function calling there. Once a person approves it in UndoLog, the agent restarted in
the same session replays the charge and runs the deletion, once.

Configuration, from the environment:

    UNDOLOG_PROXY_URL    the proxy (default http://localhost:8080)
    UNDOLOG_API_KEY      an `agent` key of the org (its tools registered by an admin or the
                         config; `serve --demo` registers this example's tools)
    UNDOLOG_ORG_ID       the org the key belongs to (default "demo", the org of `--demo`)
    UNDOLOG_SESSION_ID   restart this session instead of starting a new one

Try it with `undolog serve --demo` (it prints an agent key and an approver key):

    pip install 'undolog[semantic-kernel]'
    UNDOLOG_API_KEY=<agent key> python examples/semantic_kernel_agent.py
    undolog approvals approve <printed approval id> --api-key <approver key>
    UNDOLOG_API_KEY=<agent key> UNDOLOG_SESSION_ID=<printed session> \\
        python examples/semantic_kernel_agent.py
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from typing import Any, ClassVar

from semantic_kernel import Kernel
from semantic_kernel.connectors.ai import FunctionChoiceBehavior, PromptExecutionSettings
from semantic_kernel.connectors.ai.chat_completion_client_base import ChatCompletionClientBase
from semantic_kernel.contents import (
    AuthorRole,
    ChatHistory,
    ChatMessageContent,
    FunctionCallContent,
)
from semantic_kernel.filters import FilterTypes
from shop import COMPENSATIONS, SHOP_TOOLS, TIERS, say  # the shop's tools, next to this file

from undolog_sdk import (
    UndoLogClient,
    UndoLogSession,
    run_with_session,
)
from undolog_sdk.integrations.semantic_kernel import (
    undolog_approval_filter,
    undolog_approvals,
    undolog_kernel_plugin,
)

client = UndoLogClient()  # UNDOLOG_PROXY_URL and UNDOLOG_API_KEY


PLUGIN = undolog_kernel_plugin(
    "billing",
    SHOP_TOOLS,
    tiers=TIERS,
    compensations=COMPENSATIONS,
    client=client,
)

SCRIPT: list[tuple[str, dict[str, Any]] | str] = [
    ("search_customers", {"query": "ada"}),
    ("charge_card", {"customer_id": "cus_42", "cents": 1999}),
    ("delete_customer_data", {"customer_id": "cus_42"}),
    "Charged cus_42 and deleted their data.",
]


class ScriptedChat(ChatCompletionClientBase):
    """What a real model would decide: the n-th answer for the n-th request of the
    conversation, the same on every start, as a replay needs."""

    SUPPORTS_FUNCTION_CALLING: ClassVar[bool] = True

    async def _inner_get_chat_message_contents(
        self, chat_history: ChatHistory, settings: PromptExecutionSettings
    ) -> list[ChatMessageContent]:
        n = sum(m.role == AuthorRole.ASSISTANT for m in chat_history.messages)
        step = SCRIPT[n]
        if isinstance(step, str):
            return [ChatMessageContent(role=AuthorRole.ASSISTANT, content=step)]
        name, args = step
        call = FunctionCallContent(
            id=f"call_{n + 1}", name=f"billing-{name}", arguments=json.dumps(args)
        )
        return [ChatMessageContent(role=AuthorRole.ASSISTANT, items=[call])]


async def run(session: UndoLogSession) -> int:
    kernel = Kernel()
    kernel.add_plugin(PLUGIN)
    kernel.add_filter(FilterTypes.AUTO_FUNCTION_INVOCATION, undolog_approval_filter)
    history = ChatHistory()
    history.add_user_message("Refund-proof Ada's account.")
    settings = PromptExecutionSettings(function_choice_behavior=FunctionChoiceBehavior.Auto())
    chat = ScriptedChat(ai_model_id="scripted")
    out = await chat.get_chat_message_contents(history, settings, kernel=kernel)
    approvals = undolog_approvals(out)
    for approval in approvals:
        say(
            f"{approval.tool_name} awaits approval {approval.approval_id} "
            f"(step {approval.step_index}); ask again in {approval.retry_after}s"
        )
    if approvals:
        say(f"stopping; rerun with UNDOLOG_SESSION_ID={session.session_id} once approved")
        return 2  # leaving the session block now keeps the session (and approval) open
    say(f"agent -> {out[0].content}")
    return 0


async def main() -> int:
    session = UndoLogSession(org_id=os.environ.get("UNDOLOG_ORG_ID", "demo"))
    session.session_id = os.environ.get("UNDOLOG_SESSION_ID") or session.session_id
    say(f"session {session.session_id}")
    try:
        async with run_with_session(session):
            return await run(session)
    finally:
        await client.aclose()


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
