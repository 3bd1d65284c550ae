"""An agent whose run fails half-way: UndoLog undoes what it did, newest first.

It books a trip with three tools it runs itself. `reserve_seat` and `charge_card` are
COMPENSABLE: each names its compensation (`release_seat`, `refund_charge`), a function of this
agent registered with `@compensation`. `issue_ticket` then fails. The error leaves the session
block, so the session is rolled back: the SDK runs `refund_charge`, then `release_seat`, each
with the arguments and the result of the call it undoes, and the error propagates.

Configuration, from the environment:

    UNDOLOG_PROXY_URL    the proxy (default http://localhost:8080)
    UNDOLOG_API_KEY      an `agent` key of the org (its tools registered by an admin or
                         the config: an agent key may not register tools)
    UNDOLOG_ORG_ID       the org the key belongs to (default "demo", the org of `--demo`)

Try it with `undolog serve --demo` (it prints an agent key and registers this example's
tools), then look at the session:

    UNDOLOG_API_KEY=<agent key> python examples/rollback.py
    undolog sessions show <printed id> --api-key <agent key>
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from typing import Any

from undolog_sdk import (
    CompensationDescriptor,
    ToolTier,
    UndoLogClient,
    UndoLogSession,
    current_effect_id,
    undolog_tool,
)
from undolog_sdk.compensation import compensation

client = UndoLogClient()  # UNDOLOG_PROXY_URL and UNDOLOG_API_KEY


def say(text: str) -> None:
    print(text, flush=True)


def undo(fn_name: str, **captured: Any) -> CompensationDescriptor:
    """A compensation retried up to 3 times, 100 ms apart, before it escalates."""
    return CompensationDescriptor(fn_name, args=captured, max_retries=3, retry_backoff_ms=100)


@undolog_tool(tier=ToolTier.COMPENSABLE, compensation=undo("release_seat"), client=client)
async def reserve_seat(flight: str) -> dict[str, Any]:
    say(f"[tool] reserve_seat runs ({flight})")
    return {"flight": flight, "seat": "14C"}


@undolog_tool(
    tier=ToolTier.COMPENSABLE,
    compensation=undo("refund_charge", reason="trip not booked"),
    client=client,
)
async def charge_card(customer_id: str, cents: int) -> dict[str, Any]:
    say(f"[tool] charge_card runs ({customer_id}, {cents})")
    return {"charge_id": f"ch_{(current_effect_id() or '')[:8]}", "cents": cents}


@undolog_tool(tier=ToolTier.COMPENSABLE, compensation=undo("void_ticket"), client=client)
async def issue_ticket(flight: str, seat: str) -> dict[str, Any]:
    say(f"[tool] issue_ticket runs ({flight} {seat})")
    raise RuntimeError("the airline refused the ticket")


# The compensations get the descriptor's captured args as keywords, plus `original_args` (the
# call's arguments) and `original_result` (what it returned).


@compensation("release_seat")
async def release_seat(*, original_args: dict[str, Any], original_result: Any) -> None:
    say(f"[undo] release_seat {original_result['seat']} on {original_args['flight']}")


@compensation("refund_charge")
async def refund_charge(*, reason: str, original_args: Any, original_result: Any) -> None:
    say(f"[undo] refund_charge {original_result['charge_id']} ({reason})")


@compensation("void_ticket")  # never called here: the ticket was not issued
async def void_ticket(**payload: Any) -> None:
    say("[undo] void_ticket")


async def book(session: UndoLogSession) -> None:
    seat = await reserve_seat("LH 404", _session=session)
    say(f"reserve_seat -> {json.dumps(seat)}")
    charge = await charge_card("cus_42", 48_000, _session=session)
    say(f"charge_card -> {json.dumps(charge)}")
    await issue_ticket(seat["flight"], seat["seat"], _session=session)


async def main() -> int:
    session = UndoLogSession(org_id=os.environ.get("UNDOLOG_ORG_ID", "demo"))
    say(f"session {session.session_id}")
    try:
        async with session:  # a raising block is rolled back, then the error propagates
            await book(session)
    except RuntimeError as exc:
        say(f"booking failed: {exc}; the session was rolled back")
        for note in getattr(exc, "__notes__", ()):  # set if the rollback did not finish
            say(note)
        return 1
    finally:
        await client.aclose()
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
