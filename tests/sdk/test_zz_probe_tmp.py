from __future__ import annotations
import asyncio
import pytest
from tests.sdk.test_rollback import *  # noqa
from tests.sdk.test_rollback import Ledger, write_tool, UndoLogSession, session_view
from tests.sdk.test_rollback import client, proxy, proxy_factory, demo_upstream  # noqa

async def test_probe_gather(proxy, client):
    ledger = Ledger()
    u1, u2 = ledger.register("u1"), ledger.register("u2")
    release = asyncio.Event()

    @undolog_tool(tier=ToolTier.COMPENSABLE, compensation=CompensationDescriptor.new(u1), client=client)
    async def slow(n: int):
        await release.wait()
        return {"n": n}

    @undolog_tool(tier=ToolTier.COMPENSABLE, compensation=CompensationDescriptor.new(u2), client=client)
    async def bad(n: int):
        raise Boom("bad")

    s = UndoLogSession(org_id=proxy.org_id)
    task = None
    try:
        async with s:
            async with asyncio.TaskGroup() as tg:
                tg.create_task(slow(1, _session=s)); tg.create_task(bad(2, _session=s))
    except Exception as e:
        print("raised", repr(e), getattr(e, "__notes__", None))
    v = session_view(proxy, s.session_id)
    print(v["state"], [(e["tool_name"], e["state"]) for e in v["effects"]])
    release.set()
    await asyncio.sleep(0.5)
    v = session_view(proxy, s.session_id)
    print(v["state"], [(e["tool_name"], e["state"]) for e in v["effects"]], ledger.names())
