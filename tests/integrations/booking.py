"""The booking agent that every framework's test drives: three tools whose bodies count their
runs, so a test can tell a replay (the body did not run) from a run. Each framework's test wraps
them its own way; the tiers are the same everywhere: `lookup` SAFE, `book_seat` COMPENSABLE
(the test supplies the compensation), `cancel_flight` IRREVERSIBLE."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from undolog_sdk import ToolTier, UndoLogClient, undolog_tool


@dataclass
class Booking:
    lookup: Callable[[str], Awaitable[str]]
    book_seat: Callable[[str], Awaitable[dict[str, str]]]
    cancel_flight: Callable[..., Awaitable[Any]]
    calls: list[str] = field(default_factory=list)


def booking_tools(client: UndoLogClient) -> Booking:
    """Fresh tool bodies on a new run counter; `cancel_flight` is already an UndoLog tool."""
    calls: list[str] = []

    async def lookup(name: str) -> str:
        """Find a passenger."""
        calls.append(f"lookup {name}")
        return f"passenger {name}"

    async def book_seat(seat: str) -> dict[str, str]:
        """Book a seat."""
        calls.append(f"book {seat}")
        return {"booked": seat}

    @undolog_tool(ToolTier.IRREVERSIBLE, client=client)
    async def cancel_flight(flight: str, reason: str) -> str:
        """Cancel a flight for every passenger: cannot be undone."""
        calls.append(f"cancel {flight}")
        return f"cancelled {flight}"

    return Booking(lookup, book_seat, cancel_flight, calls)
