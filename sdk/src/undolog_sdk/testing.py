"""A test kit for your own compensations: no server, no network.

A rollback relies on two promises from each compensation, and this module lets a test suite
hold a compensation to them:

- **Running it twice is running it once.** A runner may die after a compensation ran and before
  its outcome was recorded; an `idempotent` compensation is then simply run again.
  `check_idempotent` runs it twice with the same arguments and requires the same outcome.
- **Newest first.** `rollback` unwinds a list of recorded calls the way the engine does: last
  in, first out, each compensation called with its captured `args` plus the forward call's
  `original_args` and `original_result`, retried up to its `max_retries`, and a compensation
  that keeps failing stops the unwinding there (the entries below it are not run).

    from undolog_sdk.testing import RecordedCall, check_idempotent, rollback

    async def test_undo_send_email_is_idempotent():
        await check_idempotent("undo_send_email", original_result={"message_id": "m-1"})

    async def test_a_booking_unwinds():
        report = await rollback([
            RecordedCall("reserve_seat", {"seat": "1A"}, {"booking": "b-1"},
                         CompensationDescriptor.new("release_seat")),
            RecordedCall("issue_ticket", {"booking": "b-1"}, {"ticket": "t-9"},
                         CompensationDescriptor.new("void_ticket")),
        ])
        assert report.outcome == "compensated"
        assert [s.fn_name for s in report.steps] == ["void_ticket", "release_seat"]

Compensations are looked up in the registry `@compensation` fills; a function can be passed
directly as well.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from undolog_sdk.compensation import Compensation, registered_compensation
from undolog_sdk.tier import CompensationDescriptor

__all__ = [
    "CompensationNotIdempotent",
    "RecordedCall",
    "RollbackReport",
    "RollbackStep",
    "check_idempotent",
    "rollback",
]


class CompensationNotIdempotent(AssertionError):
    """A compensation gave a different outcome the second time it ran with the same arguments."""


@dataclass(frozen=True)
class RecordedCall:
    """One committed call of a session, as the rollback sees it.

    `compensation` is None for a call with nothing to undo (a SAFE or IRREVERSIBLE one): the
    unwinding passes over it.
    """

    tool_name: str
    args: dict[str, Any]
    result: Any
    compensation: CompensationDescriptor | None = None


@dataclass(frozen=True)
class RollbackStep:
    """What happened to one compensation: `compensated`, or `failed` after `attempts` runs
    (`error` says why), or `missing` (no compensation of that name is registered)."""

    tool_name: str
    fn_name: str
    outcome: str
    attempts: int
    error: str | None = None


@dataclass(frozen=True)
class RollbackReport:
    """The unwinding, newest first. `outcome` is `compensated` when every step was,
    `empty_undo_stack` when there was nothing to undo, else `compensation_failed` (the steps
    end with the one that stopped it)."""

    outcome: str
    steps: list[RollbackStep] = field(default_factory=list)


def _resolve(fn: str | Compensation) -> tuple[str, Compensation]:
    if not isinstance(fn, str):
        return getattr(fn, "__name__", repr(fn)), fn
    found = registered_compensation(fn)
    if found is None:
        raise LookupError(f"no compensation named '{fn}' is registered (use @compensation)")
    return fn, found


def _payload(
    captured: dict[str, Any], original_args: dict[str, Any] | None, original_result: Any
) -> dict[str, Any]:
    # As the engine builds it: the captured args, then the forward call's args and result.
    return {**captured, "original_args": original_args or {}, "original_result": original_result}


@dataclass(frozen=True)
class _Outcome:
    value: Any = None
    error: Exception | None = None

    def same_as(self, other: _Outcome) -> bool:
        if self.error is None or other.error is None:
            return self.error is other.error and bool(self.value == other.value)
        return (type(self.error), str(self.error)) == (type(other.error), str(other.error))

    def __str__(self) -> str:
        if self.error is not None:
            return f"raised {type(self.error).__name__}: {self.error}"
        return f"returned {self.value!r}"


async def _run(fn: Compensation, payload: dict[str, Any]) -> _Outcome:
    try:
        return _Outcome(value=await fn(**payload))
    except Exception as exc:  # the compensation's own failure is an outcome to compare
        return _Outcome(error=exc)


async def check_idempotent(
    fn: str | Compensation,
    *,
    args: dict[str, Any] | None = None,
    original_args: dict[str, Any] | None = None,
    original_result: Any = None,
) -> Any:
    """Run the compensation twice with the same arguments; require the same outcome.

    The same outcome is an equal return value, or the same exception type and message.
    Returns what the compensation returned; a compensation that raised the same way both times
    is idempotent but broken, and its second exception is raised.

    Raises:
        CompensationNotIdempotent: the second run differed from the first.
        LookupError: `fn` names no registered compensation.
    """
    name, compensation = _resolve(fn)
    payload = _payload(dict(args or {}), original_args, original_result)
    first = await _run(compensation, dict(payload))
    second = await _run(compensation, dict(payload))
    if not first.same_as(second):
        raise CompensationNotIdempotent(
            f"compensation '{name}' is not idempotent: first run {first}, second run {second}"
        )
    if second.error is not None:
        raise second.error
    return second.value


async def rollback(calls: Sequence[RecordedCall]) -> RollbackReport:
    """Unwind `calls` (oldest first, as they were made) newest first, as the engine would.

    Each compensation runs once plus up to its descriptor's `max_retries` retries (no waiting
    between runs: a test needs no backoff); the first one that keeps failing, or that is not
    registered, stops the unwinding.
    """
    undoable = [c for c in calls if c.compensation is not None]
    if not undoable:
        return RollbackReport("empty_undo_stack")
    steps: list[RollbackStep] = []
    for call in reversed(undoable):
        descriptor = call.compensation
        assert descriptor is not None
        fn = registered_compensation(descriptor.fn_name)
        if fn is None:
            steps.append(RollbackStep(call.tool_name, descriptor.fn_name, "missing", 0,
                                      f"no compensation named '{descriptor.fn_name}'"))  # fmt: skip
            return RollbackReport("compensation_failed", steps)
        payload = _payload(dict(descriptor.args), call.args, call.result)
        error: str | None = None
        runs = descriptor.max_retries + 1  # as the engine counts: the first run, then retries
        for attempt in range(1, runs + 1):
            outcome = await _run(fn, dict(payload))
            if outcome.error is None:
                steps.append(RollbackStep(call.tool_name, descriptor.fn_name, "compensated",
                                          attempt))  # fmt: skip
                break
            error = f"{type(outcome.error).__name__}: {outcome.error}"
        else:
            steps.append(RollbackStep(call.tool_name, descriptor.fn_name, "failed", runs, error))
            return RollbackReport("compensation_failed", steps)
    return RollbackReport("compensated", steps)
