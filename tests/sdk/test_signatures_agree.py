"""The SDK and the proxy agree on signatures (split from test_flows.py, whose helpers it uses)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.proxy.conftest import ProxyHarness
from tests.sdk import test_flows as flows
from tests.sdk.helpers import session_view
from undolog_sdk import (
    ToolTier,
    UndoLogClient,
    UndoLogSession,
    call_signature,
    undolog_tool,
)

# The tools here are named after the demo tools the harness registers, with compensations of
# their own: the code's compensation applies, with a `TierMismatchWarning` that is the subject
# of tests/sdk/test_tiers.py, not of these tests.
pytestmark = pytest.mark.filterwarnings("ignore::undolog_sdk.TierMismatchWarning")


# The fixtures of test_flows.py (and through it the proxy harness's), used here by name.
demo_upstream = flows.demo_upstream
proxy_factory = flows.proxy_factory
proxy = flows.proxy
client = flows.client
session = flows.session
UNDO = flows.UNDO

# --- the SDK and the proxy agree on signatures -----------------------------------------------

ARG_SHAPES: list[dict[str, Any]] = [
    {},
    {"to": "ada@example.com", "subject": "hello"},
    {"whole": 100.0, "small": 1e-7, "edge": 1e-5, "big": 1e16, "neg_zero": -0.0, "tiny": 5e-324},
    {"third": 1 / 3, "max": 1.7976931348623157e308, "money": 19.99},
    {"name": "Zoë 🙂 中文", "escapes": 'tab\tquote"back\\ctl\x01del\x7f', "ключ": "значение"},
    {"é": 1, "z": 2, "a": 3, "\U0001f600": 4, "\uffff": 5},  # code point order, not UTF-16
    {"nested": {"b": [1, {"z": None, "a": True}], "a": {"deep": [[], {}]}}},
    {"ints": [0, -1, 2**63 - 1, -(2**63), 2**64 - 1], "flag": False},
]


async def test_the_sdk_and_the_proxy_compute_the_same_signature_for_the_same_call(
    proxy: ProxyHarness,
    client: UndoLogClient,
    session: UndoLogSession,
) -> None:
    org, sid = proxy.org_id, session.session_id
    await client.register_tool(org, "sign_me", "compensable", UNDO.to_dict())
    for step, args in enumerate(ARG_SHAPES, start=1):
        decision = await client.intercept(org, sid, "sign_me", step, args)
        assert decision.outcome == "Execute"
    effects = session_view(proxy, sid)["effects"]
    assert [e["step_index"] for e in effects] == list(range(1, len(ARG_SHAPES) + 1))
    for step, (args, effect) in enumerate(zip(ARG_SHAPES, effects, strict=True), start=1):
        assert effect["call_signature"] == call_signature(sid, step, "sign_me", args), args


async def test_the_decorator_signs_the_bound_arguments_with_their_defaults(
    proxy: ProxyHarness,
    client: UndoLogClient,
    session: UndoLogSession,
) -> None:
    @undolog_tool(tier=ToolTier.COMPENSABLE, compensation=UNDO, client=client)
    async def transfer_funds(amount: float, to: str = "acct-2", memo: str = "Zoë") -> None:
        return None

    await transfer_funds(12.5, _session=session)
    (effect,) = session_view(proxy, session.session_id)["effects"]
    args = {"amount": 12.5, "to": "acct-2", "memo": "Zoë"}
    assert effect["args"] == args
    assert effect["call_signature"] == call_signature(session.session_id, 1, "transfer_funds", args)
