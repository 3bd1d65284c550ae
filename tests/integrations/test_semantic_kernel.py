"""The Semantic Kernel integration against the real `semantic_kernel` package, a scripted chat
service (no network) and a real proxy (uvicorn on loopback), both stores: an IRREVERSIBLE call
ends the automatic function calling through an auto function invocation filter, carrying the
UndoLog approval; once approved in UndoLog, the same call runs once; a restarted agent replays;
a failed run rolls back.
"""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any, ClassVar

import pytest

pytest.importorskip("semantic_kernel")

from semantic_kernel import Kernel
from semantic_kernel.connectors.ai import FunctionChoiceBehavior, PromptExecutionSettings
from semantic_kernel.connectors.ai.chat_completion_client_base import ChatCompletionClientBase
from semantic_kernel.contents import (
    AuthorRole,
    ChatHistory,
    ChatMessageContent,
    FunctionCallContent,
    FunctionResultContent,
)

from tests.integrations.booking import booking_tools
from tests.integrations.conftest import approve
from tests.proxy.conftest import ProxyHarness
from tests.sdk.helpers import session_view
from undolog_sdk import (
    CompensationDescriptor,
    ToolTier,
    UndoLogClient,
    UndoLogSession,
    run_with_session,
)
from undolog_sdk.compensation import compensation
from undolog_sdk.integrations.semantic_kernel import (
    undolog_approval_filter,
    undolog_approvals,
    undolog_kernel_function,
    undolog_kernel_plugin,
)

NOWHERE = "http://127.0.0.1:9"  # a proxy that is not there
UNBOOK = CompensationDescriptor.new("sk_unbook_seat")
unbooked: list[str] = []


@compensation("sk_unbook_seat")
async def unbook_seat(*, original_args: dict[str, Any], **_: Any) -> None:
    unbooked.append(original_args["seat"])


Step = tuple[str, dict[str, Any], str] | str | Exception


class Scripted(ChatCompletionClientBase):
    """A chat service that answers its n-th request of a conversation with `steps[n]` (a
    function call, a text, or an exception raised): the same on every run."""

    SUPPORTS_FUNCTION_CALLING: ClassVar[bool] = True
    steps: list[Any]

    async def _inner_get_chat_message_contents(
        self, chat_history: ChatHistory, settings: PromptExecutionSettings
    ) -> list[ChatMessageContent]:
        asked = sum(m.role == AuthorRole.ASSISTANT for m in chat_history.messages)
        step = self.steps[asked]
        if isinstance(step, Exception):
            raise step
        if isinstance(step, str):
            return [ChatMessageContent(role=AuthorRole.ASSISTANT, content=step)]
        name, args, call_id = step
        call = FunctionCallContent(id=call_id, name=f"booking-{name}", arguments=json.dumps(args))
        return [ChatMessageContent(role=AuthorRole.ASSISTANT, items=[call])]


SCRIPT: list[Step] = [
    ("lookup", {"name": "ada"}, "c1"),
    ("book_seat", {"seat": "1A"}, "c2"),
    ("cancel_flight", {"flight": "UL1", "reason": "storm"}, "c3"),
    "all done",
]


class Tools:
    """A booking agent's functions, counting the runs of each body, in a kernel."""

    def __init__(self, client: UndoLogClient) -> None:
        booking = booking_tools(client)
        self.calls = booking.calls
        lookup, book_seat, cancel_flight = booking.lookup, booking.book_seat, booking.cancel_flight

        self.plugin = undolog_kernel_plugin(
            "booking",
            [lookup, book_seat],
            tiers={"lookup": "safe", "book_seat": ToolTier.COMPENSABLE},
            compensations={"book_seat": UNBOOK},
            client=client,
        )
        self.plugin.add([undolog_kernel_function(cancel_flight, plugin_name="booking")])
        self.kernel = Kernel()
        self.kernel.add_plugin(self.plugin)
        self.kernel.add_filter("auto_function_invocation", undolog_approval_filter)

    async def chat(
        self, steps: list[Step] = SCRIPT, history: ChatHistory | None = None
    ) -> tuple[list[ChatMessageContent], ChatHistory]:
        start = ChatMessageContent(role=AuthorRole.USER, content="go")
        history = history or ChatHistory(messages=[start])
        service = Scripted(ai_model_id="scripted", steps=steps)
        settings = PromptExecutionSettings(function_choice_behavior=FunctionChoiceBehavior.Auto())
        out = await service.get_chat_message_contents(history, settings, kernel=self.kernel)
        return out, history


def results(history: ChatHistory) -> dict[str, Any]:
    """What the model was told each function call returned, by call id."""
    return {
        item.id: item.result
        for m in history.messages
        for item in m.items
        if isinstance(item, FunctionResultContent)
    }


async def test_an_irreversible_call_ends_the_chat_call_and_runs_once_approved(
    proxy: ProxyHarness, client: UndoLogClient
) -> None:
    tools = Tools(client)
    session = UndoLogSession(org_id=proxy.org_id)
    async with run_with_session(session):
        out, history = await tools.chat()
    (approval,) = undolog_approvals(out)
    assert (approval.tool_name, approval.tool_args, approval.step_index) == (
        "cancel_flight", {"flight": "UL1", "reason": "storm"}, 2,
    )  # fmt: skip
    assert approval.session_id == session.session_id
    assert tools.calls == ["lookup ada", "book 1A"]  # the cancellation did not run
    assert approval.approval_id in str(results(history)["c3"])  # the model is told
    view = session_view(proxy, session.session_id)
    assert view["state"] == "active"  # left normally while waiting: still open
    assert [a["id"] for a in view["approvals"]] == [approval.approval_id]

    approve(proxy, approval.approval_id)
    # The model asks again (the same call); UndoLog approved it: it runs, once.
    again = [*SCRIPT[:3], ("cancel_flight", {"flight": "UL1", "reason": "storm"}, "c4"), "ok"]
    async with run_with_session(session):
        out, history = await tools.chat(again, history)
    assert out[0].content == "ok"
    assert undolog_approvals(out) == []
    assert tools.calls == ["lookup ada", "book 1A", "cancel UL1"]
    assert results(history)["c4"] == "cancelled UL1"
    view = session_view(proxy, session.session_id)
    assert [(e["tool_name"], e["state"]) for e in view["effects"]] == [
        ("book_seat", "committed"), ("cancel_flight", "committed"),
    ]  # fmt: skip
    assert view["state"] == "completed"


async def test_a_restarted_agent_replays_recorded_calls_and_runs_the_approved_one_once(
    proxy: ProxyHarness, client: UndoLogClient
) -> None:
    tools = Tools(client)
    session = UndoLogSession(org_id=proxy.org_id)
    async with run_with_session(session):
        out, _ = await tools.chat()
    (approval,) = undolog_approvals(out)
    approve(proxy, approval.approval_id)

    # The agent restarts from the beginning in the same session, with a fresh process's state.
    for _ in range(2):
        restarted = Tools(client)
        again = UndoLogSession(org_id=proxy.org_id, session_id=session.session_id)
        async with run_with_session(again):
            out, history = await restarted.chat()
        assert out[0].content == "all done"
        assert results(history) == {
            "c1": "passenger ada", "c2": {"booked": "1A"}, "c3": "cancelled UL1",
        }  # fmt: skip
        tools.calls += restarted.calls
    # The booking never ran again; the cancellation ran once, on the first restart; SAFE
    # lookups run every time.
    assert tools.calls == [
        "lookup ada", "book 1A", "lookup ada", "cancel UL1", "lookup ada",
    ]  # fmt: skip
    assert session_view(proxy, session.session_id)["state"] == "completed"


async def test_a_call_rejected_in_undolog_is_an_error_result_and_never_runs(
    proxy: ProxyHarness, client: UndoLogClient
) -> None:
    tools = Tools(client)
    session = UndoLogSession(org_id=proxy.org_id)
    async with run_with_session(session):
        out, history = await tools.chat()
        (approval,) = undolog_approvals(out)
        approve(proxy, approval.approval_id, "reject")
        again = [*SCRIPT[:3], ("cancel_flight", {"flight": "UL1", "reason": "storm"}, "c4"), "ok"]
        out, history = await tools.chat(again, history)
    assert out[0].content == "ok"
    assert "cancel UL1" not in tools.calls
    told = str(results(history)["c4"])
    assert approval.approval_id in told and "rejected" in told


async def test_a_failed_run_rolls_the_session_back_newest_first(
    proxy: ProxyHarness, client: UndoLogClient
) -> None:
    tools = Tools(client)

    async def charge(cents: int) -> str:
        """Charge the card."""
        raise ConnectionError("the payment provider is down")

    tools.plugin.add(
        [
            undolog_kernel_function(
                charge,
                tier=ToolTier.COMPENSABLE,
                compensation=UNBOOK,
                client=client,
                plugin_name="booking",
            )
        ]
    )
    steps: list[Step] = [
        ("book_seat", {"seat": "1A"}, "c1"),
        ("book_seat", {"seat": "2B"}, "c2"),
        ("charge", {"cents": 1999}, "c3"),
        RuntimeError("the model gave up"),
    ]
    unbooked.clear()
    session = UndoLogSession(org_id=proxy.org_id)
    history = ChatHistory(messages=[ChatMessageContent(role=AuthorRole.USER, content="book two")])
    with pytest.raises(RuntimeError, match="the model gave up"):
        async with run_with_session(session):
            await tools.chat(steps, history)
    assert "payment provider is down" in str(results(history)["c3"])  # the model was told
    assert unbooked == ["2B", "1A"]  # compensations ran, newest first
    assert session_view(proxy, session.session_id)["state"] == "compensated"


async def test_safe_functions_run_without_a_session_and_the_proxy_never_hears_of_them() -> None:
    tools = Tools(UndoLogClient(NOWHERE))
    out, history = await tools.chat([("lookup", {"name": "ada"}, "c1"), "ok"])
    assert out[0].content == "ok" and tools.calls == ["lookup ada"]
    assert results(history) == {"c1": "passenger ada"}


async def test_without_a_session_an_undolog_call_is_an_error_saying_how_to_give_it_one() -> None:
    tools = Tools(UndoLogClient(NOWHERE))
    _, history = await tools.chat([("book_seat", {"seat": "1A"}, "c1"), "ok"])
    assert "run_with_session" in str(results(history)["c1"])
    assert tools.calls == []


def test_functions_keep_their_parameters_and_docstring_and_need_a_tier() -> None:
    plugin = Tools(UndoLogClient(NOWHERE)).plugin
    lookup, cancel = plugin["lookup"], plugin["cancel_flight"]
    assert (lookup.name, lookup.description, lookup.plugin_name) == (
        "lookup", "Find a passenger.", "booking",
    )  # fmt: skip
    assert [(p.name, p.is_required) for p in cancel.parameters] == [
        ("flight", True), ("reason", True),
    ]  # fmt: skip

    async def purge(table: str) -> str:
        return table

    with pytest.raises(ValueError, match="no tier for 'purge'"):
        undolog_kernel_function(purge)
    with pytest.raises(ValueError, match="no tier for purge"):
        undolog_kernel_plugin("p", [purge], tiers={})
    with pytest.raises(ValueError, match="COMPENSABLE tool needs a compensation"):
        undolog_kernel_function(purge, tier="compensable")


def test_the_module_exports_are_pinned_and_the_sdk_never_imports_the_framework() -> None:
    import undolog_sdk.integrations.semantic_kernel as module

    assert module.__all__ == [
        "METADATA_KEY",
        "UndoLogApproval",
        "undolog_approval_filter",
        "undolog_approvals",
        "undolog_kernel_function",
        "undolog_kernel_plugin",
    ]
    code = (
        "import sys, undolog_sdk, undolog_sdk.decorators, undolog_sdk.integrations;"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] == 'semantic_kernel');"
        "print(bad); sys.exit(1 if bad else 0)"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr
