"""UndoLog for Semantic Kernel (`pip install 'undolog[semantic-kernel]'`).

`undolog_kernel_function(fn, tier=...)` (or `undolog_kernel_plugin(name, fns, tiers=...)`) makes
a Semantic Kernel `KernelFunction` whose calls go through UndoLog, in the session of the
running task (`async with run_with_session(session): await service.get_chat_message_contents(
history, settings, kernel=kernel)`):

- SAFE and COMPENSABLE calls run as with `@undolog_tool`: exactly once per session step, a
  repeated call replays its recorded result without running the body;
- an IRREVERSIBLE call waiting for its UndoLog approval does not run: its function result
  tells the model it awaits approval (with the approval id) and carries the approval in its
  metadata. With `undolog_approval_filter` added to the kernel (an auto function invocation
  filter, Semantic Kernel's own way to stop automatic function calling for a person), the
  chat call ends there (`context.terminate`), and `undolog_approvals(messages)` reads the
  approvals (id, tool, args, step). Once a person has approved it in UndoLog, the same call in
  the same session (the model asking again, or the agent restarted with the same session id)
  runs once; a rejected one is an error result (`ApprovalRejected`) for the model.

A function's exception is Semantic Kernel's error result for the model, as for any function. A
failed run (an exception out of the chat call) rolls the session back when it leaves the
`run_with_session` block with it (compensations run newest first); `await session.rollback()`
does it by hand.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from semantic_kernel.contents import ChatMessageContent, FunctionResultContent
from semantic_kernel.filters.auto_function_invocation.auto_function_invocation_context import (
    AutoFunctionInvocationContext,
)
from semantic_kernel.functions import (
    FunctionResult,
    KernelFunction,
    KernelFunctionFromMethod,
    KernelFunctionMetadata,
    KernelPlugin,
    kernel_function,
)

from undolog_sdk.client import UndoLogClient
from undolog_sdk.decorators import (
    AwaitingApprovalError,
    _classified,
    _spec_for,
    undolog_tool,
)
from undolog_sdk.session import get_current_session
from undolog_sdk.tier import CompensationDescriptor, ToolTier

__all__ = [
    "METADATA_KEY",
    "UndoLogApproval",
    "undolog_approval_filter",
    "undolog_approvals",
    "undolog_kernel_function",
    "undolog_kernel_plugin",
]

METADATA_KEY = "undolog_approval"
"""The key of the UndoLog approval in a function result's metadata."""


@dataclass(frozen=True)
class UndoLogApproval:
    """The UndoLog approval an IRREVERSIBLE call waits for.

    Attributes:
        approval_id: decide it with `undolog approvals approve <id>` or
            `POST /approvals/{id}/approve` (an approver key).
        tool_name: the UndoLog tool (the function's name).
        tool_args: the call's arguments.
        step_index: the call's step in the session.
        session_id: the UndoLog session.
        retry_after: the proxy's hint, in seconds, for when to ask again.
    """

    approval_id: str
    tool_name: str
    tool_args: dict[str, Any]
    step_index: int
    session_id: str
    retry_after: int | None = None


async def undolog_approval_filter(
    context: AutoFunctionInvocationContext,
    next: Callable[[AutoFunctionInvocationContext], Awaitable[None]],
) -> None:
    """An auto function invocation filter (`kernel.add_filter("auto_function_invocation",
    undolog_approval_filter)`): a call waiting for its UndoLog approval ends the chat call."""
    await next(context)
    result = context.function_result
    if result is not None and METADATA_KEY in (result.metadata or {}):
        context.terminate = True


def undolog_approvals(messages: Sequence[ChatMessageContent]) -> list[UndoLogApproval]:
    """The UndoLog approvals the function results in `messages` wait for (a chat call's
    returned messages, or a `ChatHistory`'s `messages`)."""
    found: list[UndoLogApproval] = []
    for message in messages:
        for item in message.items:
            if not isinstance(item, FunctionResultContent):
                continue
            data = item.metadata.get(METADATA_KEY)
            if isinstance(data, dict):
                found.append(UndoLogApproval(**data))
    return found


def undolog_kernel_function(
    fn: Callable[..., Awaitable[Any]],
    *,
    tier: ToolTier | str | None = None,
    compensation: CompensationDescriptor | None = None,
    client: UndoLogClient | None = None,
    name: str | None = None,
    description: str | None = None,
    plugin_name: str | None = None,
) -> KernelFunction:
    """Semantic Kernel's `KernelFunction` for `fn`, its calls through UndoLog.

    Args:
        fn: an async function, or an `@undolog_tool` function (whose tier, compensation and
            client apply; then give no `tier`).
        tier: the tool's classification (required for a plain function).
        compensation: how to undo it; required for COMPENSABLE.
        client: the UndoLog client; by default the session's or one from the environment.
        name, description: as for `@kernel_function` (by default the function's name and
            docstring); `plugin_name`: the plugin it belongs to.

    Raises:
        ValueError: no tier, or a tier given for an `@undolog_tool` function; a COMPENSABLE
            tier without a compensation.
        TypeError: `fn` is not `async def`.
    """
    spec = _spec_for(fn, tier, compensation, client)
    wrapped = undolog_tool(spec.tier, spec.compensation, client=spec.client)(spec.fn)
    metadata: list[KernelFunctionMetadata] = []

    @functools.wraps(spec.fn)
    async def invoke(**kwargs: Any) -> Any:
        try:
            return await wrapped(**kwargs)
        except AwaitingApprovalError as waiting:
            session = get_current_session()
            approval = UndoLogApproval(
                waiting.approval_id,
                waiting.tool_name,
                dict(kwargs),
                waiting.step_index,
                session.session_id if session is not None else "",
                waiting.retry_after,
            )
            return FunctionResult(
                function=metadata[0],
                value=f"'{waiting.tool_name}' did not run: it awaits UndoLog approval "
                f"{waiting.approval_id}; ask again once a person has decided.",
                metadata={METADATA_KEY: asdict(approval)},
            )

    # The parameters Semantic Kernel shows the model are the function's (`wraps`).
    function = KernelFunctionFromMethod(
        method=kernel_function(invoke, name=name, description=description),
        plugin_name=plugin_name,
    )
    metadata.append(function.metadata)
    return function


def undolog_kernel_plugin(
    plugin_name: str,
    fns: Iterable[Callable[..., Awaitable[Any]]],
    *,
    tiers: Mapping[str, ToolTier | str],
    compensations: Mapping[str, CompensationDescriptor] | None = None,
    client: UndoLogClient | None = None,
) -> KernelPlugin:
    """A `KernelPlugin` (`kernel.add_plugin(plugin)`) of `undolog_kernel_function`s, each
    function's tier (and compensation) looked up by its name, as `wrap_tools` does.

    Raises:
        ValueError: as `wrap_tools`: a function with no tier, a tier that is not one, a stray
            compensation, a COMPENSABLE function without a compensation.
    """
    functions = [
        undolog_kernel_function(
            fn, tier=tier, compensation=compensation, client=client, plugin_name=plugin_name
        )
        for fn, tier, compensation in _classified(fns, tiers, compensations)
    ]
    return KernelPlugin(name=plugin_name, functions=functions)
