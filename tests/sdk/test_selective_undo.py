"""`UndoLogSession.undo(...)`: a selective undo from the SDK, against a real proxy, both stores.

The SDK runs its own compensations (`@compensation`), claimed from the engine one at a time,
while the session stays open: calls after the undo keep working (docs/undo.md).
"""

from __future__ import annotations

import pytest

from tests.proxy.conftest import ProxyHarness
from tests.sdk.helpers import session_view
from tests.sdk.test_rollback import Ledger, client, demo_upstream, proxy, proxy_factory, write_tool
from undolog_sdk import UndoLogClient, UndoLogSession
from undolog_sdk.errors import DependentEffects

__all__ = ["client", "demo_upstream", "proxy", "proxy_factory"]  # fixtures used by name


async def test_undo_after_a_step_runs_the_sdk_compensations_and_the_session_goes_on(
    proxy: ProxyHarness, client: UndoLogClient
) -> None:
    ledger = Ledger()
    undo_a = ledger.register("undo_a")
    write_a = write_tool(client, "write_a", undo_a)
    session = UndoLogSession(org_id=proxy.org_id, client=client)

    async with session:
        await write_a(1, _session=session)
        await write_a(2, _session=session)
        third = await write_a(3, _session=session)
        outcome = await session.undo(after_step=2)
        await write_a(4, _session=session)  # the session is still open

    assert outcome == "compensated"
    assert [p["original_result"] for p in ledger.payloads(undo_a)] == [third]
    view = session_view(proxy, session.session_id)
    assert view["state"] == "completed"
    assert [u["state"] for u in view["undo_stack"]] == [
        "pending",
        "compensated",
        "pending",
        "pending",
    ]


async def test_undoing_an_entry_later_calls_depend_on_needs_force(
    proxy: ProxyHarness, client: UndoLogClient
) -> None:
    ledger = Ledger()
    undo_a = ledger.register("undo_a")
    write_a = write_tool(client, "write_a", undo_a)
    session = UndoLogSession(org_id=proxy.org_id, client=client)

    async with session:
        first = await write_a(1, _session=session)
        await write_a(2, _session=session)
        oldest = session_view(proxy, session.session_id)["undo_stack"][-1]["entry_id"]
        with pytest.raises(DependentEffects) as refused:
            await session.undo(entries=[oldest])
        assert ledger.calls == []
        assert await session.undo(entries=[oldest], force=True) == "compensated"

    assert len(refused.value.dependents) == 1
    assert [p["original_result"] for p in ledger.payloads(undo_a)] == [first]
