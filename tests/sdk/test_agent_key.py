"""The SDK with an `agent` key: it may call tools but not register them.

`@undolog_tool` registers its tool on first use; with an agent key the proxy answers
`403 forbidden`, and the SDK then accepts a tool an admin has registered (that registration
applies) and raises `Forbidden` for one nobody has.
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from tests.proxy import conftest as proxy_fixtures
from tests.proxy.conftest import ProxyHarness
from tests.sdk.helpers import session_view
from undolog_sdk import (
    CompensationDescriptor,
    ToolTier,
    UndoLogClient,
    UndoLogSession,
    undolog_tool,
)
from undolog_sdk.errors import AuthFailed, Forbidden

demo_upstream = proxy_fixtures.demo_upstream
proxy_factory = proxy_fixtures.proxy_factory
proxy = proxy_fixtures.proxy


async def test_an_agent_key_runs_a_tool_an_admin_registered(proxy: ProxyHarness) -> None:
    compensation = CompensationDescriptor.new("undo_booking")
    with proxy.client() as admin:
        admin.put(
            "/tools/book_room", json={"tier": "compensable", "compensation": compensation.to_dict()}
        ).raise_for_status()
    client = UndoLogClient(proxy.url, api_key=proxy.agent_key)
    runs: list[str] = []

    @undolog_tool(tier=ToolTier.COMPENSABLE, compensation=compensation, client=client)
    async def book_room(room: str) -> dict[str, Any]:
        runs.append(room)
        return {"booked": room}

    try:
        session = UndoLogSession(org_id=proxy.org_id, session_id=str(uuid.uuid4()))
        assert await book_room("blue", _session=session) == {"booked": "blue"}
    finally:
        await client.aclose()
    assert runs == ["blue"]
    (effect,) = session_view(proxy, session.session_id)["effects"]
    assert (effect["tool_name"], effect["state"]) == ("book_room", "committed")


async def test_an_agent_key_cannot_register_a_new_tool(proxy: ProxyHarness) -> None:
    client = UndoLogClient(proxy.url, api_key=proxy.agent_key)

    @undolog_tool(tier=ToolTier.IRREVERSIBLE, client=client)
    async def drop_everything() -> None:
        raise AssertionError("must not run")

    try:
        session = UndoLogSession(org_id=proxy.org_id, session_id=str(uuid.uuid4()))
        with pytest.raises(Forbidden) as raised:
            await drop_everything(_session=session)
    finally:
        await client.aclose()
    assert isinstance(raised.value, AuthFailed)
    assert raised.value.code == "forbidden"
    with proxy.client() as admin:
        assert "drop_everything" not in {t["name"] for t in admin.get("/tools").json()}


@pytest.mark.security
async def test_an_agent_key_cannot_run_a_tool_in_a_session_another_key_created(
    proxy: ProxyHarness,
) -> None:
    compensation = CompensationDescriptor.new("undo_booking")
    session_id = str(uuid.uuid4())
    with proxy.client() as admin:
        admin.put(
            "/tools/book_room", json={"tier": "compensable", "compensation": compensation.to_dict()}
        ).raise_for_status()
        body = {"session_id": session_id, "tool_name": "echo", "step_index": 1, "args": {}}
        assert admin.post("/mcp/tool_call", json=body).status_code == 200  # the admin's session
    client = UndoLogClient(proxy.url, api_key=proxy.agent_key)
    runs: list[str] = []

    @undolog_tool(tier=ToolTier.COMPENSABLE, compensation=compensation, client=client)
    async def book_room(room: str) -> dict[str, Any]:
        runs.append(room)
        return {"booked": room}

    try:
        session = UndoLogSession(org_id=proxy.org_id, session_id=session_id)
        with pytest.raises(Forbidden) as raised:
            await book_room("blue", _session=session)
    finally:
        await client.aclose()
    assert raised.value.code == "forbidden"
    assert runs == []
    assert [e["tool_name"] for e in session_view(proxy, session_id)["effects"]] == ["echo"]
