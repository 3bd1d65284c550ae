"""A small agent that uses `@undolog_tool` on the three tiers, against a running UndoLog proxy.

It looks a customer up (SAFE: runs locally, the proxy never hears of it), charges their card
(COMPENSABLE: recorded exactly once, with a refund on the session's undo stack) and deletes
their data (IRREVERSIBLE: waits until a person approves it).

Configuration, from the environment:

    UNDOLOG_PROXY_URL    the proxy (default http://localhost:8080)
    UNDOLOG_API_KEY      an `agent` key of the org (its tools registered by an admin or
                         the config: an agent key may not register tools)
    UNDOLOG_ORG_ID       the org the key belongs to (default "demo", the org of `--demo`)
    UNDOLOG_SESSION_ID   resume this session instead of starting a new one
    AGENT_WAIT           "1": wait for the approval (asking again every retry_after seconds)
                         instead of stopping

Try it with `undolog serve --demo` (it prints an agent key and an approver key, and registers
this example's tools):

    UNDOLOG_API_KEY=<agent key> python examples/agent.py
    undolog approvals approve <printed approval id> --api-key <approver key>

The first run charges the card and stops at the deletion, which awaits approval. Once it is
approved, run it again with the session id it printed: the charge is replayed (the card is not
charged twice, the tool body does not even run) and the deletion goes ahead.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from typing import Any

from undolog_sdk import (
    AwaitingApprovalError,
    CompensationDescriptor,
    ToolTier,
    UndoLogClient,
    UndoLogSession,
    current_effect_id,
    undolog_tool,
)

client = UndoLogClient()  # UNDOLOG_PROXY_URL and UNDOLOG_API_KEY


def say(text: str) -> None:
    print(text, flush=True)


@undolog_tool(tier=ToolTier.SAFE, client=client)
async def search_customers(query: str) -> list[dict[str, Any]]:
    """Read-only: runs every time, nothing is recorded."""
    say(f"[tool] search_customers runs ({query!r})")
    return [{"customer_id": "cus_42", "name": "Ada Lovelace", "email": "ada@example.com"}]


@undolog_tool(
    tier=ToolTier.COMPENSABLE,
    compensation=CompensationDescriptor.new("refund_charge", {"reason": "session rolled back"}),
    client=client,
)
async def charge_card(customer_id: str, cents: int) -> dict[str, Any]:
    """A write with an undo: its refund is on the undo stack before the charge happens."""
    # The effect id is the same for every attempt of this call: the payment provider's
    # idempotency key, so a retried charge is never charged twice.
    key = current_effect_id()
    say(f"[tool] charge_card runs (idempotency key {key})")
    return {"charge_id": f"ch_{(key or '')[:8]}", "customer_id": customer_id, "cents": cents}


@undolog_tool(tier=ToolTier.IRREVERSIBLE, client=client)
async def delete_customer_data(customer_id: str) -> dict[str, Any]:
    """Cannot be undone: runs only once a person has approved it."""
    say(f"[tool] delete_customer_data runs ({customer_id})")
    return {"deleted": customer_id}


async def run(session: UndoLogSession, *, wait: bool) -> int:
    customers = await search_customers("ada", _session=session)
    say(f"search_customers -> {json.dumps(customers)}")
    customer_id = customers[0]["customer_id"]

    charge = await charge_card(customer_id, 1999, _session=session)
    say(f"charge_card -> {json.dumps(charge)}")

    while True:
        try:
            deleted = await delete_customer_data(customer_id, _session=session)
        except AwaitingApprovalError as waiting:
            say(
                f"delete_customer_data awaits approval {waiting.approval_id} "
                f"(step {waiting.step_index}); ask again in {waiting.retry_after}s"
            )
            if not wait:
                say(f"stopping; once approved, rerun with UNDOLOG_SESSION_ID={session.session_id}")
                raise  # leaving the session block this way keeps the session open
            await asyncio.sleep(waiting.retry_after or 5)
            continue
        say(f"delete_customer_data -> {json.dumps(deleted)}")
        return 0


async def main() -> int:
    session = UndoLogSession(org_id=os.environ.get("UNDOLOG_ORG_ID", "demo"))
    if os.environ.get("UNDOLOG_SESSION_ID"):
        session.session_id = os.environ["UNDOLOG_SESSION_ID"]
    say(f"session {session.session_id}")
    try:
        async with session:
            return await run(session, wait=os.environ.get("AGENT_WAIT") == "1")
    except AwaitingApprovalError:
        return 2
    finally:
        await client.aclose()


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
