"""The demo tools as registry entries: tiers and compensations for the demo org."""

from __future__ import annotations

from typing import Any

from undolog_sdk.tier import ToolTier

__all__ = ["DEMO_TOOLS", "EXAMPLE_TOOLS"]

_SAFE = ToolTier.SAFE.value
_COMPENSABLE = ToolTier.COMPENSABLE.value
_IRREVERSIBLE = ToolTier.IRREVERSIBLE.value


def _undo(fn_name: str) -> dict[str, Any]:
    # The demo compensations honour the Idempotency-Key: a lost run may run again.
    return {"fn_name": fn_name, "max_retries": 3, "retry_backoff_ms": 200, "idempotent": True}


DEMO_TOOLS: dict[str, dict[str, Any]] = {
    "search_web": {"tier": _SAFE},
    "send_email": {"tier": _COMPENSABLE, "compensation": _undo("undo_send_email")},
    "transfer_funds": {"tier": _COMPENSABLE, "compensation": _undo("reverse_transfer")},
    "create_record": {"tier": _COMPENSABLE, "compensation": _undo("delete_record")},
    "delete_database": {"tier": _IRREVERSIBLE},
    "publish_to_production": {"tier": _IRREVERSIBLE},
    "echo": {"tier": _COMPENSABLE, "compensation": _undo("echo")},
    "flaky": {"tier": _COMPENSABLE, "compensation": _undo("echo")},
    "slow": {"tier": _COMPENSABLE, "compensation": _undo("echo")},
    "broken": {"tier": _COMPENSABLE, "compensation": _undo("echo")},
    "fail": {"tier": _COMPENSABLE, "compensation": _undo("echo")},
}


def _example_undo(fn_name: str) -> dict[str, Any]:
    return {"fn_name": fn_name, "fn_version": "1.0.0", "args": {}, "max_retries": 3,
            "retry_backoff_ms": 100}  # fmt: skip


# The SDK tools of `examples/agent.py` and `examples/rollback.py`, as their decorators declare
# them (`charge_card` as agent.py's): `serve --demo` registers them, since the demo's agent key
# may not (only admin keys register tools).
EXAMPLE_TOOLS: dict[str, dict[str, Any]] = {
    "search_customers": {"tier": _SAFE},
    "charge_card": {
        "tier": _COMPENSABLE,
        "compensation": {
            "fn_name": "refund_charge",
            "fn_version": "1.0.0",
            "args": {"reason": "session rolled back"},
            "max_retries": 3,
            "retry_backoff_ms": 1000,
        },
    },
    "delete_customer_data": {"tier": _IRREVERSIBLE},
    "reserve_seat": {"tier": _COMPENSABLE, "compensation": _example_undo("release_seat")},
    "issue_ticket": {"tier": _COMPENSABLE, "compensation": _example_undo("void_ticket")},
}
