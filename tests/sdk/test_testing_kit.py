"""`undolog_sdk.testing`: the compensation test kit users run in their own suites (no server)."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from undolog_sdk.compensation import compensation
from undolog_sdk.testing import (
    CompensationNotIdempotent,
    RecordedCall,
    check_idempotent,
    rollback,
)
from undolog_sdk.tier import CompensationDescriptor


def unique(name: str) -> str:
    """Compensations register process-wide: each test uses names of its own."""
    return f"{name}_{uuid.uuid4().hex[:8]}"


class Ledger:
    """A fake payment provider: refunds by charge id, each at most once."""

    def __init__(self) -> None:
        self.refunded: list[str] = []
        self.calls: list[dict[str, Any]] = []


async def test_an_idempotent_compensation_passes_and_its_result_is_returned() -> None:
    ledger, name = Ledger(), unique("refund")

    @compensation(name)
    async def refund(*, original_result: dict[str, Any], reason: str, **rest: Any) -> str:
        ledger.calls.append({"reason": reason, "original_result": original_result, **rest})
        charge = original_result["charge_id"]
        if charge not in ledger.refunded:
            ledger.refunded.append(charge)
        return f"refunded {charge}"

    value = await check_idempotent(
        name, args={"reason": "rolled back"}, original_args={"amount": 5},
        original_result={"charge_id": "ch-1"},
    )  # fmt: skip
    assert value == "refunded ch-1"
    assert ledger.refunded == ["ch-1"]
    # Called as the engine calls it: captured args plus the forward call's args and result.
    assert ledger.calls == 2 * [
        {"reason": "rolled back", "original_args": {"amount": 5},
         "original_result": {"charge_id": "ch-1"}}
    ]  # fmt: skip


async def test_a_compensation_that_acts_twice_is_caught() -> None:
    ledger = Ledger()

    async def refund_again(*, original_result: dict[str, Any], **_: Any) -> int:
        ledger.refunded.append(original_result["charge_id"])  # no check: refunds twice
        return len(ledger.refunded)

    with pytest.raises(CompensationNotIdempotent) as raised:
        await check_idempotent(refund_again, original_result={"charge_id": "ch-2"})
    assert "first run returned 1, second run returned 2" in str(raised.value)


async def test_a_compensation_that_fails_the_second_time_is_caught() -> None:
    done: set[str] = set()

    async def cancel(*, original_result: dict[str, Any], **_: Any) -> None:
        booking = original_result["booking"]
        if booking in done:
            raise KeyError(f"booking {booking} is already cancelled")
        done.add(booking)

    with pytest.raises(CompensationNotIdempotent) as raised:
        await check_idempotent(cancel, original_result={"booking": "b-1"})
    assert "second run raised KeyError" in str(raised.value)


async def test_a_compensation_that_always_fails_raises_its_own_error() -> None:
    async def broken(**_: Any) -> None:
        raise RuntimeError("provider down")

    with pytest.raises(RuntimeError, match="provider down"):
        await check_idempotent(broken)


async def test_an_unregistered_name_is_a_clear_error() -> None:
    with pytest.raises(LookupError, match="no compensation named 'nope_"):
        await check_idempotent(unique("nope"))


def recorded(tool: str, fn_name: str | None, n: int, *, retries: int = 0) -> RecordedCall:
    descriptor = None
    if fn_name is not None:
        descriptor = CompensationDescriptor(fn_name, args={"why": "test"}, max_retries=retries)
    return RecordedCall(tool, {"n": n}, {"id": f"{tool}-{n}"}, descriptor)


async def test_a_rollback_unwinds_newest_first_and_passes_over_calls_with_nothing_to_undo() -> None:
    undone: list[tuple[str, Any, Any]] = []
    release, void = unique("release"), unique("void")

    @compensation(release)
    async def release_seat(*, original_args: Any, original_result: Any, why: str) -> None:
        undone.append((release, original_args, original_result))

    @compensation(void)
    async def void_ticket(*, original_args: Any, original_result: Any, why: str) -> None:
        undone.append((void, original_args, original_result))

    report = await rollback([
        recorded("reserve", release, 1), recorded("search", None, 2),
        recorded("issue", void, 3), recorded("reserve", release, 4),
    ])  # fmt: skip
    assert report.outcome == "compensated"
    assert [(s.tool_name, s.fn_name, s.outcome, s.attempts) for s in report.steps] == [
        ("reserve", release, "compensated", 1),
        ("issue", void, "compensated", 1),
        ("reserve", release, "compensated", 1),
    ]
    assert undone == [
        (release, {"n": 4}, {"id": "reserve-4"}),
        (void, {"n": 3}, {"id": "issue-3"}),
        (release, {"n": 1}, {"id": "reserve-1"}),
    ]


async def test_a_failing_compensation_is_retried_then_stops_the_unwinding() -> None:
    runs: dict[str, int] = {}
    flaky, stuck, never = unique("flaky"), unique("stuck"), unique("never")

    @compensation(flaky)
    async def flaky_undo(**_: Any) -> None:  # fails twice, then works
        runs[flaky] = runs.get(flaky, 0) + 1
        if runs[flaky] < 3:
            raise ConnectionError("try again")

    @compensation(stuck)
    async def stuck_undo(**_: Any) -> None:
        runs[stuck] = runs.get(stuck, 0) + 1
        raise ValueError("refund window closed")

    @compensation(never)
    async def never_undo(**_: Any) -> None:
        runs[never] = runs.get(never, 0) + 1

    report = await rollback([recorded("a", never, 1), recorded("b", stuck, 2, retries=1),
                             recorded("c", flaky, 3, retries=2)])  # fmt: skip
    assert report.outcome == "compensation_failed"
    assert [(s.fn_name, s.outcome, s.attempts, s.error) for s in report.steps] == [
        (flaky, "compensated", 3, None),
        (stuck, "failed", 2, "ValueError: refund window closed"),
    ]
    assert runs == {flaky: 3, stuck: 2}  # the oldest entry was never reached


async def test_a_missing_compensation_stops_the_unwinding_and_an_empty_stack_is_reported() -> None:
    missing = unique("missing")
    report = await rollback([recorded("a", missing, 1)])
    assert report.outcome == "compensation_failed"
    assert [(s.fn_name, s.outcome) for s in report.steps] == [(missing, "missing")]
    assert (await rollback([recorded("search", None, 1)])).outcome == "empty_undo_stack"
    assert (await rollback([])).outcome == "empty_undo_stack"
