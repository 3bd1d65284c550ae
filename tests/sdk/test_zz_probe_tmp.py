from __future__ import annotations
import pytest
from tests.sdk.test_rollback import *  # noqa
from tests.sdk.test_rollback import client, proxy, proxy_factory, demo_upstream  # noqa

async def test_probe_unseen(proxy, client):
    s = UndoLogSession(org_id=proxy.org_id, client=client)
    try:
        print("unseen rollback ->", await s.rollback())
    except Exception as e:
        print("unseen rollback raised", repr(e))

async def test_probe_refused_call_then_normal_end(proxy, client):
    ledger = Ledger()
    w = write_tool(client, "w", ledger.register("u"))
    s = UndoLogSession(org_id=proxy.org_id)
    try:
        async with s:
            try:
                await w(float("nan"), _session=s)
            except ValueError as e:
                print("refused", e)
    except Exception as e:
        print("exit raised", repr(e))

async def test_probe_refused_call_then_raise(proxy, client):
    ledger = Ledger()
    w = write_tool(client, "w", ledger.register("u"))
    s = UndoLogSession(org_id=proxy.org_id)
    try:
        async with s:
            await w(float("nan"), _session=s)
    except Exception as e:
        print("exit raised", repr(e), getattr(e, "__notes__", None))

async def test_probe_note(proxy, client):
    ledger = Ledger()
    w = write_tool(client, "w", ledger.register("u", fail_times=-1), max_retries=0)
    s = UndoLogSession(org_id=proxy.org_id)
    try:
        async with s:
            await w(1, _session=s)
            raise Boom("x")
    except Exception as e:
        print("exit raised", repr(e), getattr(e, "__notes__", None))
