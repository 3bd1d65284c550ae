"""`@undolog_tool`: exactly-once, undoable and approval-gated execution of a local async tool.

A call runs under the stricter of the tier its code declares and the one the registry holds
(SAFE < COMPENSABLE < IRREVERSIBLE), with the compensation its code declares; a mismatch warns
(`TierMismatchWarning`, once per client and tool). SAFE tools run directly: the proxy is asked
nothing per call, only the registry once per client (a SAFE tool the registry holds as
COMPENSABLE or IRREVERSIBLE is gated like one; outside a session it is not looked up). Gated
calls take the session's next step (before their first await, so calls started together keep
their order), sign the call, register the tool on first use if the registry does not hold it
(a registration is never replaced), ask the proxy for a decision, sending the code's tier and
compensation, and branch on it: Execute runs the body and commits its result (or fails the
effect and re-raises); Replay returns the recorded result without entering the body;
AwaitingApproval raises `AwaitingApprovalError`. A call that does not complete (it awaits
approval, a duplicate is in progress, the body raised) gives its step back, so retrying the
same call in the same session maps to the same effect.

Tool arguments and results travel as JSON: a tool may take and return dicts, lists, strings,
numbers, booleans and None (tuples come back as lists on a replay).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import inspect
import warnings
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar, cast

from undolog_sdk._compat import add_note
from undolog_sdk.client import InterceptResponse, UndoLogClient, default_client
from undolog_sdk.errors import AwaitingApprovalError
from undolog_sdk.session import UndoLogSession, get_current_session
from undolog_sdk.signature import call_signature, canonical_json
from undolog_sdk.tier import CompensationDescriptor, TierMismatchWarning, ToolTier, stricter_tier
from undolog_sdk.wire import Outcome

__all__ = ["AwaitingApprovalError", "current_effect_id", "undolog_tool", "wrap_tools"]

R = TypeVar("R")

_current_effect: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "undolog_current_effect", default=None
)


def current_effect_id() -> str | None:
    """The effect id of the tool call running in this task, or None outside one.

    Use it as an idempotency key for the API the tool calls (a payment provider, say): it is
    the same for every attempt of one call.
    """
    return _current_effect.get()


def undolog_tool(
    tier: ToolTier,
    compensation: CompensationDescriptor | None = None,
    client: UndoLogClient | None = None,
    session_param: str = "_session",
) -> Callable[[Callable[..., Awaitable[R]]], Callable[..., Coroutine[Any, Any, R]]]:
    """Wrap an async function with UndoLog interception.

    Args:
        tier: the tool's classification.
        compensation: how to undo it; required for COMPENSABLE.
        client: the client to use; by default a module-level one configured from the
            environment (`UNDOLOG_PROXY_URL`, `UNDOLOG_API_KEY`).
        session_param: the keyword argument that carries the `UndoLogSession` at call time;
            without it, the current session (`run_with_session`, `async with session`).

    Raises:
        ValueError: at decoration, a COMPENSABLE tier without a compensation.
        TypeError: at decoration, a function that is not `async def`.
        RuntimeError: at call time, no session: neither the keyword argument nor a current
            session.
        AwaitingApprovalError: at call time, the call waits for approval.
    """
    if not isinstance(tier, ToolTier):
        raise ValueError(f"tier must be a ToolTier, got {tier!r}")
    if tier.is_compensable and compensation is None:
        raise ValueError("a COMPENSABLE tool needs a compensation descriptor")

    # The wrapper is typed `Callable[..., ...]`: it also takes the session keyword, which a
    # ParamSpec cannot add to the wrapped function's parameters (Concatenate is positional).
    def decorate(fn: Callable[..., Awaitable[R]]) -> Callable[..., Coroutine[Any, Any, R]]:
        if not inspect.iscoroutinefunction(fn):
            raise TypeError(f"@undolog_tool needs an async function, got {fn!r}")
        name = fn.__name__
        signature = inspect.signature(fn)
        takes_session = session_param in signature.parameters

        spec = _ToolSpec(name, tier, compensation, client, fn, signature)

        @functools.wraps(fn)
        async def wrapper(*args: Any, **kwargs: Any) -> R:
            session = kwargs.get(session_param)
            if not takes_session:
                kwargs.pop(session_param, None)
            if session is None:  # an explicit `_session` wins over the current one
                session = get_current_session()
            return cast(R, await _run_tool(spec, session, args, kwargs, session_param))

        setattr(wrapper, _SPEC_ATTR, spec)
        return wrapper

    return decorate


_SPEC_ATTR = "__undolog_tool__"


@dataclass(frozen=True)
class _ToolSpec:
    """What `@undolog_tool` was given, kept on the wrapper for the framework integrations."""

    name: str
    tier: ToolTier
    compensation: CompensationDescriptor | None
    client: UndoLogClient | None
    fn: Callable[..., Awaitable[Any]]
    signature: inspect.Signature


async def _run_tool(
    spec: _ToolSpec,
    session: object,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    session_param: str = "_session",
    call_id: str | None = None,
) -> Any:
    """One call of an `@undolog_tool` function in `session`: a SAFE tool runs directly (unless
    the registry holds it stricter), any other is asked of the proxy and carried out. A call
    a framework names by `call_id` takes the step of that id (`UndoLogSession.step_for_call`),
    any other the session's next step."""
    name, tier = spec.name, spec.tier
    if tier.is_safe and (
        not isinstance(session, UndoLogSession)
        or not await _registered_stricter(_client_for(spec.client, session), session, name)
    ):
        return await spec.fn(*args, **kwargs)
    if not isinstance(session, UndoLogSession):
        raise RuntimeError(
            f"tool '{name}' needs an UndoLogSession: run it inside "
            f"`async with run_with_session(session)` or pass it as '{session_param}='"
        )
    bound = spec.signature.bind(*args, **kwargs)
    bound.apply_defaults()
    call_args = {k: v for k, v in bound.arguments.items() if k != session_param}
    c = _client_for(spec.client, session)
    step = session.step_for_call(call_id) if call_id else None
    asked = await _ask(c, session, name, tier, spec.compensation, call_args, step)
    return await _carry_out(c, session, asked, name, spec.fn, args, kwargs)


def _spec_of(fn: Callable[..., Any]) -> _ToolSpec | None:
    """The spec of an `@undolog_tool` function, or None for any other callable."""
    spec = getattr(fn, _SPEC_ATTR, None)
    return spec if isinstance(spec, _ToolSpec) else None


@dataclass(frozen=True)
class _Asked:
    """The proxy's decision for one call, with the step it was asked at and its signature."""

    step: int
    signed: str
    decision: InterceptResponse


def _client_for(client: UndoLogClient | None, session: UndoLogSession) -> UndoLogClient:
    c = client or session.client or default_client()
    if session.client is None:
        session.client = c
    return c


async def _ask(
    c: UndoLogClient,
    session: UndoLogSession,
    name: str,
    tier: ToolTier,
    compensation: CompensationDescriptor | None,
    call_args: dict[str, Any],
    step: int | None = None,
) -> _Asked:
    """Take the session's next step (or the `step` given: a framework's keyed step), register
    the tool on first use and ask the proxy what to do with the call. A call refused here
    gives its step back."""
    # The step is taken before the first await, so calls started together (gather) get
    # their steps in the order they were started, on every run of the agent.
    if step is None:
        step = session.next_step()
    try:
        # The reference's flow signs the call first: a session id that is not a UUID, or
        # arguments that are not JSON, fail here (ValueError), before anything is recorded.
        # The proxy computes the same signature from the same inputs.
        signed = call_signature(session.session_id, step, name, call_args)
        declared = compensation.to_dict() if compensation is not None else None
        entry = await c.ensure_tool(session.org_id, name, tier.value, declared)
        if entry is not None:
            _warn_on_mismatch(c, session.org_id, name, tier, declared, entry)
        decision = await _answer_of(
            c.intercept(
                session.org_id,
                session.session_id,
                name,
                step,
                call_args,
                declared_tier=tier.value,
                compensation=declared,
            ),
            c,
            session,
        )
        if decision.registered_tier not in (None, tier.value):  # the registry changed since
            _warn_on_mismatch(c, session.org_id, name, tier, declared,
                              {"tier": decision.registered_tier})  # fmt: skip
        # The proxy has seen the session now: leaving the block completes or rolls it back.
        # A call refused before that (not JSON, proxy unreachable) does not.
        session._used = True
    except BaseException:
        session._give_back_step(step)
        raise
    return _Asked(step, signed, decision)


async def _registered_stricter(c: UndoLogClient, session: UndoLogSession, name: str) -> bool:
    """Whether the registry holds a tool its code calls SAFE at a stricter tier (then the call
    is gated like one). Read once per client: the registry's listing is cached."""
    entry = await c.registered_tool(session.org_id, name)
    if entry is None or entry.get("tier") in (None, ToolTier.SAFE.value):
        return False
    _warn_on_mismatch(c, session.org_id, name, ToolTier.SAFE, None, entry)
    return True


def _warn_on_mismatch(
    c: UndoLogClient,
    org_id: str,
    name: str,
    tier: ToolTier,
    compensation: dict[str, Any] | None,
    entry: dict[str, Any],
) -> None:
    """Warn (once per client and tool) that the code's tier or compensation is not the
    registry's: the call runs under the stricter tier, with the code's compensation."""
    registered = entry.get("tier")
    tier_differs = isinstance(registered, str) and registered != tier.value
    listed = entry.get("compensation", compensation)
    compensation_differs = compensation is not None and listed != compensation
    if not (tier_differs or compensation_differs) or (org_id, name) in c._warned:
        return
    c._warned.add((org_id, name))
    if tier_differs:
        assert isinstance(registered, str)
        applies = stricter_tier(tier, ToolTier(registered)).value
        text = (
            f"tool '{name}' is declared {tier.value} in code but registered {registered}: "
            f"it runs as {applies} (the stricter)"
        )
    else:
        text = f"tool '{name}' declares a compensation other than the registered one"
    if compensation_differs:
        text += "; the compensation declared in code is the one recorded and run"
    warnings.warn(text, TierMismatchWarning, stacklevel=5)


async def _answer_of(
    asking: Coroutine[Any, Any, InterceptResponse], c: UndoLogClient, session: UndoLogSession
) -> InterceptResponse:
    """The proxy's answer to an intercept, even when the caller is cancelled while it is in
    flight: the proxy may have recorded the intent already, and a call it told to run whose
    body never runs is reported failed ("cancelled before it ran"), never left in doubt."""
    asked = asyncio.ensure_future(asking)
    asked.add_done_callback(lambda done: done.cancelled() or done.exception())  # retrieved
    try:
        return await asyncio.shield(asked)
    except asyncio.CancelledError:
        if not asked.done():
            with contextlib.suppress(BaseException):
                await asyncio.shield(asked)  # a second cancellation gives up waiting
        if asked.done() and not asked.cancelled() and asked.exception() is None:
            decision = asked.result()
            if decision.outcome == Outcome.EXECUTE and decision.effect_id:
                with contextlib.suppress(Exception):
                    await asyncio.shield(
                        c.fail(
                            session.org_id,
                            session.session_id,
                            decision.effect_id,
                            "CancelledError: cancelled before it ran",
                        )
                    )
        raise


def _awaiting(session: UndoLogSession, asked: _Asked, name: str) -> AwaitingApprovalError:
    """Note that the call waits for approval (it keeps its step for the retry); the error."""
    session._give_back_step(asked.step)
    approval_id = asked.decision.approval_id or ""
    session._awaiting[asked.signed] = approval_id
    waiting = AwaitingApprovalError(approval_id, name, asked.step)
    waiting.retry_after = asked.decision.retry_after
    return waiting


async def _carry_out(
    c: UndoLogClient,
    session: UndoLogSession,
    asked: _Asked,
    name: str,
    fn: Callable[..., Awaitable[Any]],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
) -> Any:
    """Act on the proxy's decision: replay, raise `AwaitingApprovalError`, or run the body
    and record its result (or its failure)."""
    decision, step = asked.decision, asked.step
    if decision.outcome == Outcome.REPLAY:
        session._awaiting.pop(asked.signed, None)
        return decision.cached_result
    if decision.outcome == Outcome.AWAITING_APPROVAL:
        raise _awaiting(session, asked, name)
    session._awaiting.pop(asked.signed, None)  # approved: this call runs now
    effect_id = decision.effect_id or ""
    token = _current_effect.set(effect_id)
    try:
        result = await fn(*args, **kwargs)
    except BaseException as exc:
        session._give_back_step(step)
        try:
            await c.fail(session.org_id, session.session_id, effect_id, _describe(exc))
        except Exception as fail_exc:  # keep the tool's own error as the one raised
            add_note(exc, f"UndoLog could not record this failure: {fail_exc!r}")
        raise
    finally:
        _current_effect.reset(token)
    try:
        canonical_json(result)
    except ValueError as exc:
        session._give_back_step(step)  # like any failure: a retry is the same call
        message = f"tool '{name}' returned a value that is not JSON: {exc}"
        await c.fail(session.org_id, session.session_id, effect_id, message)
        raise TypeError(message) from None
    await c.commit(session.org_id, session.session_id, effect_id, result)
    return result


def _describe(exc: BaseException) -> str:
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def wrap_tools(
    fns: Iterable[Callable[..., Awaitable[Any]]],
    *,
    tiers: Mapping[str, ToolTier | str],
    compensations: Mapping[str, CompensationDescriptor] | None = None,
    client: UndoLogClient | None = None,
) -> list[Callable[..., Coroutine[Any, Any, Any]]]:
    """Classify plain async functions: each becomes `@undolog_tool(tiers[name],
    compensations.get(name))`, looked up by the function's `__name__`, in the order given.

    The wrapped functions keep their names, docstrings and signatures (frameworks read them to
    describe the tool), and find their session in the current context (`run_with_session`).

    Raises:
        ValueError: a function with no tier (UndoLog never guesses one: an unclassified tool
            could be irreversible), a tier that is not one, a compensation that names no
            function given, or a COMPENSABLE function without a compensation.
        TypeError: a function that is not `async def`.
    """
    return [
        undolog_tool(tier, compensation, client=client)(fn)
        for fn, tier, compensation in _classified(fns, tiers, compensations)
    ]


def _classified(
    fns: Iterable[Callable[..., Awaitable[Any]]],
    tiers: Mapping[str, ToolTier | str],
    compensations: Mapping[str, CompensationDescriptor] | None,
) -> list[tuple[Callable[..., Awaitable[Any]], ToolTier, CompensationDescriptor | None]]:
    """Each function with its tier and compensation, looked up by its `__name__` (see
    `wrap_tools` for what is refused)."""
    fns = list(fns)
    compensations = dict(compensations or {})
    names = [getattr(fn, "__name__", repr(fn)) for fn in fns]
    unclassified = [name for name in names if name not in tiers]
    if unclassified:
        raise ValueError(f"no tier for {', '.join(unclassified)}: give each tool a tier")
    stray = sorted(set(compensations) - set(names))
    if stray:
        raise ValueError(f"compensations for unknown tools: {', '.join(stray)}")
    classified = []
    for fn, name in zip(fns, names, strict=True):
        try:
            tier = ToolTier(tiers[name])
        except ValueError:
            raise ValueError(f"tool '{name}': {tiers[name]!r} is not a tier") from None
        classified.append((fn, tier, compensations.get(name)))
    return classified


def _spec_for(
    fn: Callable[..., Awaitable[Any]],
    tier: ToolTier | str | None,
    compensation: CompensationDescriptor | None,
    client: UndoLogClient | None,
) -> _ToolSpec:
    """The spec of a tool made from a plain function and its tier, or from an `@undolog_tool`
    function (whose own tier and compensation apply; `client` replaces its client if given).

    Raises:
        ValueError: a plain function without a tier, an `@undolog_tool` function with one;
            a COMPENSABLE tier without a compensation.
        TypeError: `fn` is not `async def`.
    """
    spec = _spec_of(fn)
    if spec is None:
        if tier is None:
            raise ValueError(f"no tier for {getattr(fn, '__name__', fn)!r}: give the tool a tier")
        spec = _spec_of(undolog_tool(ToolTier(tier), compensation, client=client)(fn))
        assert spec is not None
        return spec
    if tier is not None or compensation is not None:
        raise ValueError(f"{spec.name!r} is an @undolog_tool already: it has its tier")
    if client is None:
        return spec
    return _ToolSpec(spec.name, spec.tier, spec.compensation, client, spec.fn, spec.signature)
