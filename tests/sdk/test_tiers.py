"""The stricter tier wins, through the SDK against a real proxy, both stores.

A tool's code declares a tier; the registry may hold another (an admin registered it, or an
older version of the code did). The call runs under the stricter of the two, the answer and
the event name both, the SDK warns (`TierMismatchWarning`) and the proxy logs `tier_mismatch`;
the compensation the code declares is the one recorded and run on rollback.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from typing import Any

import orjson
import pytest

from tests.proxy import conftest as proxy_fixtures
from tests.proxy.conftest import ProxyHarness
from tests.sdk.helpers import session_view
from undolog.store import open_store
from undolog_sdk import (
    AwaitingApprovalError,
    CompensationDescriptor,
    TierMismatchWarning,
    ToolTier,
    UndoLogClient,
    UndoLogSession,
    undolog_tool,
)
from undolog_sdk.compensation import compensation

demo_upstream = proxy_fixtures.demo_upstream
proxy_factory = proxy_fixtures.proxy_factory
proxy = proxy_fixtures.proxy


def register(proxy: ProxyHarness, name: str, tier: str, comp: dict[str, Any] | None = None) -> None:
    """The registry's entry, as an admin (or an older version of the code) left it."""
    body: dict[str, Any] = {"tier": tier}
    if comp is not None:
        body["compensation"] = comp
    with proxy.client() as admin:
        admin.put(f"/tools/{name}", json=body).raise_for_status()


@pytest.fixture(params=["admin", "agent"])
async def client(
    request: pytest.FixtureRequest, proxy: ProxyHarness
) -> AsyncIterator[UndoLogClient]:
    """The SDK's client with an admin key (which could register tools) or an agent key."""
    key = proxy.api_key if request.param == "admin" else proxy.agent_key
    sdk_client = UndoLogClient(proxy.url, api_key=key)
    try:
        yield sdk_client
    finally:
        await sdk_client.aclose()


def new_session(proxy: ProxyHarness) -> UndoLogSession:
    return UndoLogSession(org_id=proxy.org_id, session_id=str(uuid.uuid4()))


async def events(proxy: ProxyHarness, session_id: str, kind: str) -> list[dict[str, Any]]:
    """The payloads of the session's events of one type, read from the proxy's store."""
    store = await open_store(proxy.database_url)
    try:
        async with store.reader() as q:
            found = await q.list_events(proxy.org_id, session_id=session_id)
    finally:
        await store.close()
    return [orjson.loads(e.payload_json) for e in found if e.type == kind]


@pytest.mark.security
async def test_an_irreversible_tool_registered_compensable_waits_for_approval_and_does_not_run(
    proxy: ProxyHarness, client: UndoLogClient, caplog: pytest.LogCaptureFixture
) -> None:
    register(proxy, "wire_money", "compensable", {"fn_name": "claw_back"})
    runs: list[int] = []

    @undolog_tool(tier=ToolTier.IRREVERSIBLE, client=client)
    async def wire_money(cents: int) -> dict[str, Any]:
        runs.append(cents)
        return {"sent": cents}

    session = new_session(proxy)
    with (
        pytest.warns(TierMismatchWarning, match="declared irreversible .* registered compensable"),
        pytest.raises(AwaitingApprovalError) as waiting,
    ):
        await wire_money(100, _session=session)
    assert runs == []
    assert waiting.value.approval_id
    (effect,) = session_view(proxy, session.session_id)["effects"]
    assert (effect["tier"], effect["state"]) == ("irreversible", "awaiting_approval")
    (payload,) = await events(proxy, session.session_id, "approval_required")
    assert (payload["tier"], payload["declared_tier"], payload["registered_tier"]) == (
        "irreversible",
        "irreversible",
        "compensable",
    )


async def test_the_answer_names_the_tier_that_applies_the_declared_one_and_the_registered_one(
    proxy: ProxyHarness,
) -> None:
    register(proxy, "wire_money", "compensable", {"fn_name": "claw_back"})
    body = {
        "session_id": str(uuid.uuid4()), "tool_name": "wire_money", "step_index": 1,
        "args": {"cents": 1}, "mode": "sdk", "declared_tier": "irreversible",
    }  # fmt: skip
    with proxy.client(proxy.agent_key) as agent:
        answer = agent.post("/mcp/tool_call", json=body)
        assert answer.status_code == 202, answer.text
        pending = answer.json()
        assert (pending["tier"], pending["declared_tier"], pending["registered_tier"]) == (
            "irreversible",
            "irreversible",
            "compensable",
        )
        plain = agent.post(
            "/mcp/tool_call",
            json={**body, "session_id": str(uuid.uuid4()), "declared_tier": None},
        ).json()
    assert plain["status"] == "execute"
    assert (plain["tier"], plain["declared_tier"], plain["registered_tier"]) == (
        "compensable",
        None,
        "compensable",
    )
    mismatches = proxy.runtime.metrics.tier_mismatches.labels("irreversible", "compensable")
    assert mismatches._value.get() == 1


@pytest.mark.security
async def test_a_tool_safe_in_code_but_irreversible_in_the_registry_is_gated(
    proxy: ProxyHarness, client: UndoLogClient
) -> None:
    register(proxy, "drop_table", "irreversible")
    runs: list[str] = []

    @undolog_tool(tier=ToolTier.SAFE, client=client)
    async def drop_table(name: str) -> str:
        runs.append(name)
        return name

    session = new_session(proxy)
    with (
        pytest.warns(TierMismatchWarning, match="declared safe .* runs as irreversible"),
        pytest.raises(AwaitingApprovalError),
    ):
        await drop_table("users", _session=session)
    assert runs == []


async def test_a_safe_tool_the_registry_does_not_hold_runs_without_asking_the_proxy_per_call(
    proxy: ProxyHarness, client: UndoLogClient
) -> None:
    @undolog_tool(tier=ToolTier.SAFE, client=client)
    async def look_up(term: str) -> str:
        return term

    session = new_session(proxy)
    assert [await look_up(t, _session=session) for t in ("a", "b")] == ["a", "b"]
    assert await look_up("outside a session") == "outside a session"
    assert session_view_or_none(proxy, session.session_id) is None  # nothing recorded


def session_view_or_none(proxy: ProxyHarness, session_id: str) -> dict[str, Any] | None:
    with proxy.client() as c:
        response = c.get(f"/sessions/{session_id}")
    return response.json() if response.status_code == 200 else None


@pytest.mark.security
async def test_the_compensation_declared_in_code_is_the_one_recorded_and_run_on_rollback(
    proxy: ProxyHarness, client: UndoLogClient
) -> None:
    """examples/rollback.py's flow: the registry holds reason "session rolled back", the code
    declares "trip not booked"; the rollback runs with "trip not booked"."""
    fn_name = f"refund_charge_{uuid.uuid4().hex[:8]}"
    registered = CompensationDescriptor(fn_name, args={"reason": "session rolled back"})
    register(proxy, "charge_card", "compensable", registered.to_dict())
    refunds: list[str] = []

    @compensation(fn_name)
    async def refund_charge(*, reason: str, original_args: Any, original_result: Any) -> None:
        refunds.append(reason)

    declared = CompensationDescriptor(
        fn_name, args={"reason": "trip not booked"}, max_retries=3, retry_backoff_ms=1
    )

    @undolog_tool(tier=ToolTier.COMPENSABLE, compensation=declared, client=client)
    async def charge_card(customer_id: str, cents: int) -> dict[str, Any]:
        return {"charge_id": "ch_1", "cents": cents}

    session = new_session(proxy)
    with (
        pytest.warns(TierMismatchWarning, match="compensation declared in code"),
        pytest.raises(RuntimeError, match="ticket refused"),
    ):
        async with session:
            await charge_card("cus_42", 48_000, _session=session)
            raise RuntimeError("ticket refused")
    assert refunds == ["trip not booked"]
    (entry,) = session_view(proxy, session.session_id)["undo_stack"]
    assert entry["args"] == {"reason": "trip not booked"}
