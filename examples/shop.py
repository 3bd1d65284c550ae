"""The shop that the framework examples' agents work in: three tools and their UndoLog tiers.

Each example (`*_agent.py`) hands these same functions to its framework, wrapped by UndoLog's
integration for it; run an example as `python examples/<name>_agent.py`, so that this module
is importable next to it.
"""

from __future__ import annotations

from typing import Any

from undolog_sdk import CompensationDescriptor, ToolTier, current_effect_id


def say(text: str) -> None:
    print(text, flush=True)


async def search_customers(query: str) -> list[dict[str, Any]]:
    """Find customers by name."""
    say(f"[tool] search_customers runs ({query!r})")
    return [{"customer_id": "cus_42", "name": "Ada Lovelace"}]


async def charge_card(customer_id: str, cents: int) -> dict[str, Any]:
    """Charge a customer's card."""
    key = current_effect_id()  # the payment provider's idempotency key
    say(f"[tool] charge_card runs (idempotency key {key})")
    return {"charge_id": f"ch_{(key or '')[:8]}", "customer_id": customer_id, "cents": cents}


async def delete_customer_data(customer_id: str) -> dict[str, Any]:
    """Delete everything known about a customer: cannot be undone."""
    say(f"[tool] delete_customer_data runs ({customer_id})")
    return {"deleted": customer_id}


SHOP_TOOLS = [search_customers, charge_card, delete_customer_data]

# A lookup is SAFE (not recorded), a charge COMPENSABLE (recorded once, its refund on the undo
# stack), a deletion IRREVERSIBLE (a person approves it first).
TIERS = {
    "search_customers": ToolTier.SAFE,
    "charge_card": ToolTier.COMPENSABLE,
    "delete_customer_data": ToolTier.IRREVERSIBLE,
}
COMPENSATIONS = {"charge_card": CompensationDescriptor.new("refund_charge")}
