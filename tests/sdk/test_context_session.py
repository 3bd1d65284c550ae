"""The context session: tools find their session without `_session`, and when a session
completes (never while one of its calls waits for approval). `wrap_tools` classifies plain async
functions. Against a real proxy (uvicorn on loopback), both stores.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import AsyncIterator
from typing import Any

import pytest

from tests.proxy import conftest as proxy_fixtures
from tests.proxy.conftest import ProxyHarness
from tests.sdk.helpers import session_view
from undolog_sdk import (
    AwaitingApprovalError,
    CompensationDescriptor,
    ToolTier,
    UndoLogClient,
    UndoLogSession,
    get_current_session,
    require_current_session,
    run_with_session,
    undolog_tool,
    wrap_tools,
)

demo_upstream = proxy_fixtures.demo_upstream
proxy_factory = proxy_fixtures.proxy_factory
proxy = proxy_fixtures.proxy

UNDO = CompensationDescriptor.new("undo_it")


@pytest.fixture
async def client(proxy: ProxyHarness) -> AsyncIterator[UndoLogClient]:
    sdk_client = UndoLogClient(proxy.url, api_key=proxy.api_key)
    try:
        yield sdk_client
    finally:
        await sdk_client.aclose()


def tools_of(client: UndoLogClient, calls: list[str]) -> tuple[Any, Any]:
    @undolog_tool(ToolTier.COMPENSABLE, UNDO, client=client)
    async def book(seat: str) -> dict[str, str]:
        calls.append(f"book {seat}")
        return {"booked": seat}

    @undolog_tool(ToolTier.IRREVERSIBLE, client=client)
    async def drop(db: str) -> str:
        calls.append(f"drop {db}")
        return f"dropped {db}"

    return book, drop


def state_of(proxy: ProxyHarness, session: UndoLogSession) -> str:
    return str(session_view(proxy, session.session_id)["state"])


async def test_a_tool_uses_the_current_session_and_the_block_completes_it(
    proxy: ProxyHarness, client: UndoLogClient
) -> None:
    calls: list[str] = []
    book, _ = tools_of(client, calls)
    session = UndoLogSession(org_id=proxy.org_id)
    async with run_with_session(session) as current:
        assert current is session and get_current_session() is session
        assert await book("1A") == {"booked": "1A"}
        # Tasks started inside the block see it too (asyncio copies the context).
        both = await asyncio.gather(book("2B"), book("3C"))
        assert list(both) == [{"booked": "2B"}, {"booked": "3C"}]
    assert get_current_session() is None
    view = session_view(proxy, session.session_id)
    assert [e["step_index"] for e in view["effects"]] == [1, 2, 3]
    assert view["state"] == "completed"
    assert sorted(calls) == ["book 1A", "book 2B", "book 3C"]


async def test_an_explicit_session_wins_over_the_current_one(
    proxy: ProxyHarness, client: UndoLogClient
) -> None:
    book, _ = tools_of(client, [])
    outer, explicit = UndoLogSession(org_id=proxy.org_id), UndoLogSession(org_id=proxy.org_id)
    async with run_with_session(outer):
        await book("1A")
        await book("9Z", _session=explicit)
        async with UndoLogSession(org_id=proxy.org_id) as inner:  # `async with` sets it too
            assert require_current_session() is inner
            await book("5E")
        assert get_current_session() is outer  # restored on leaving the inner block
    assert [e["args"] for e in session_view(proxy, outer.session_id)["effects"]] == [{"seat": "1A"}]
    assert [e["args"] for e in session_view(proxy, explicit.session_id)["effects"]] == [
        {"seat": "9Z"}
    ]
    assert [e["args"] for e in session_view(proxy, inner.session_id)["effects"]] == [{"seat": "5E"}]


async def test_without_any_session_a_tool_says_how_to_give_it_one(client: UndoLogClient) -> None:
    book, _ = tools_of(client, [])
    assert get_current_session() is None
    with pytest.raises(RuntimeError, match="run_with_session"):
        require_current_session()
    with pytest.raises(
        RuntimeError, match=r"run_with_session\(session\)` or pass it as '_session="
    ):
        await book("1A")


async def test_leaving_a_block_normally_while_an_approval_is_pending_keeps_it_pending(
    proxy: ProxyHarness, client: UndoLogClient
) -> None:
    calls: list[str] = []
    book, drop = tools_of(client, calls)
    session = UndoLogSession(org_id=proxy.org_id)
    async with run_with_session(session):
        await book("1A")
        try:
            await drop("prod")
        except AwaitingApprovalError as exc:  # the reference's own example does this
            waiting = exc
    # The block ended normally: the session is not completed, the approval not withdrawn.
    with proxy.client() as c:
        approval = c.get(f"/approvals/{waiting.approval_id}").json()
    assert approval["status"] == "pending"
    assert state_of(proxy, session) == "active"

    with proxy.client(proxy.approver_key) as c:
        decided = c.post(f"/approvals/{waiting.approval_id}/approve", json={})
    assert decided.status_code == 200, decided.text
    assert decided.json()["execution"] == "awaiting_agent"

    resumed = UndoLogSession(org_id=proxy.org_id, session_id=session.session_id)
    async with run_with_session(resumed):
        assert await book("1A") == {"booked": "1A"}  # replayed: the agent starts over
        assert await drop("prod") == "dropped prod"  # approved: runs now, once
    assert calls == ["book 1A", "drop prod"]
    assert state_of(proxy, session) == "completed"  # nothing waits any more


async def test_a_block_that_raises_still_rolls_back_with_the_context_session(
    proxy: ProxyHarness, client: UndoLogClient
) -> None:
    book, _ = tools_of(client, [])
    session = UndoLogSession(org_id=proxy.org_id)
    with pytest.raises(LookupError):
        async with run_with_session(session):
            await book("1A")
            raise LookupError("the agent gave up")
    assert get_current_session() is None
    assert state_of(proxy, session) in ("compensated", "compensation_failed")


# --- wrap_tools -------------------------------------------------------------------------------


async def search(query: str, limit: int = 5) -> list[str]:
    """Search the catalog."""
    return [f"{query}-{i}" for i in range(limit)]


async def reserve(seat: str) -> dict[str, str]:
    return {"reserved": seat}


async def purge(table: str) -> str:
    return f"purged {table}"


async def test_wrap_tools_classifies_plain_functions_and_keeps_their_signatures(
    proxy: ProxyHarness, client: UndoLogClient
) -> None:
    wrapped = wrap_tools(
        [search, reserve, purge],
        tiers={"search": "safe", "reserve": ToolTier.COMPENSABLE, "purge": "irreversible"},
        compensations={"reserve": UNDO},
        client=client,
    )
    w_search, w_reserve, w_purge = wrapped
    assert [f.__name__ for f in wrapped] == ["search", "reserve", "purge"]
    assert w_search.__doc__ == "Search the catalog."
    assert inspect.signature(w_search) == inspect.signature(search)
    session = UndoLogSession(org_id=proxy.org_id)
    async with run_with_session(session):
        assert await w_search("x", limit=2) == ["x-0", "x-1"]  # SAFE: not recorded
        assert await w_reserve("4D") == {"reserved": "4D"}
        with pytest.raises(AwaitingApprovalError):
            await w_purge("users")
    effects = session_view(proxy, session.session_id)["effects"]
    assert [(e["tool_name"], e["state"]) for e in effects] == [
        ("reserve", "committed"), ("purge", "awaiting_approval"),
    ]  # fmt: skip


def test_wrap_tools_never_guesses_a_tier() -> None:
    with pytest.raises(ValueError, match="no tier for reserve, purge"):
        wrap_tools([search, reserve, purge], tiers={"search": "safe"})
    with pytest.raises(ValueError, match="'dangerous' is not a tier"):
        wrap_tools([purge], tiers={"purge": "dangerous"})
    with pytest.raises(ValueError, match="compensations for unknown tools: refund"):
        wrap_tools([reserve], tiers={"reserve": "compensable"}, compensations={"refund": UNDO})
    with pytest.raises(ValueError, match="COMPENSABLE tool needs a compensation"):
        wrap_tools([reserve], tiers={"reserve": "compensable"})
