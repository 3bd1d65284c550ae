"""`undolog.services.calls`: the one place an engine answer becomes a front-end-neutral
`CallOutcome` (pure parts; the whole path runs in tests/proxy and tests/mcp)."""

from __future__ import annotations

from typing import Any

import pytest
import structlog
import structlog.testing

from undolog.engine import Decision, Outcome
from undolog.logs import LazyLog
from undolog.services.calls import CallOutcome, CallStatus, refused
from undolog.store.records import ToolRecord
from undolog_sdk.errors import (
    AdvisoryLockTimeout,
    Database,
    InProgress,
    InterceptFailed,
    InvalidRequest,
    ToolNotRegistered,
    UndoLogError,
)


class _Log:
    def __init__(self) -> None:
        self.warnings: list[tuple[str, dict[str, Any]]] = []

    def warning(self, event: str, **fields: Any) -> None:
        self.warnings.append((event, fields))


def _decision() -> Decision:
    tool = ToolRecord.__new__(ToolRecord)  # only identity matters here
    return Decision(Outcome.EXECUTE, "effect-1", 0, "sig", tool)


@pytest.mark.parametrize(
    "failure", [Database("connection lost"), AdvisoryLockTimeout("sig", 3)], ids=type
)
def test_the_engines_own_failure_is_an_intercept_failure_and_is_logged(
    failure: UndoLogError,
) -> None:
    log = _Log()
    outcome = refused(failure, log)
    assert outcome.status is CallStatus.INTERCEPT_FAILED
    assert isinstance(outcome.error, InterceptFailed)
    # The client is told in UndoLog's words (no driver text); the log keeps the original.
    told = {Database: "The store could not take the call right now; retry shortly."}
    assert outcome.error.message == told.get(type(failure), failure.message)
    assert log.warnings == [("intercept_failed", {"error": failure.message})]


@pytest.mark.parametrize(
    "refusal",
    [InvalidRequest("missing args"), ToolNotRegistered("t", "o"), InProgress("e", 2)],
    ids=type,
)
def test_an_answer_about_the_call_is_a_refusal_carrying_the_engines_error(
    refusal: UndoLogError,
) -> None:
    log = _Log()
    outcome = refused(refusal, log)
    assert outcome.status is CallStatus.REFUSED
    assert outcome.error is refusal
    assert outcome.answered is None
    assert log.warnings == []


@pytest.mark.parametrize(
    ("status", "ends_the_call"),
    [
        (CallStatus.REPLAYED, True),
        (CallStatus.EXECUTED, True),
        (CallStatus.FAILED, True),
        (CallStatus.PENDING_APPROVAL, False),
        (CallStatus.EXECUTE, False),
    ],
)
def test_only_an_answer_that_ends_the_call_is_reported_for_delivery(
    status: CallStatus, ends_the_call: bool
) -> None:
    decision = _decision()
    outcome = CallOutcome(status, decision)
    assert outcome.answered is (decision if ends_the_call else None)


def test_a_calls_log_binds_its_context_only_when_it_logs_and_logs_what_bind_would() -> None:
    with structlog.testing.capture_logs() as eager:
        bound = structlog.get_logger("t").bind(request_id="r", org_id="o")
        bound.bind(effect_id="e").warning("tool_error", error="boom")
    bound_calls: list[dict[str, Any]] = []

    class _Counting:
        def bind(self, **context: Any) -> Any:
            bound_calls.append(context)
            return structlog.get_logger("t").bind(**context)

    lazy = LazyLog(_Counting(), {"request_id": "r", "org_id": "o"}).bind(effect_id="e")
    assert bound_calls == []  # nothing logged yet: nothing bound
    with structlog.testing.capture_logs() as logged:
        lazy.warning("tool_error", error="boom")
    assert bound_calls == [{"request_id": "r", "org_id": "o", "effect_id": "e"}]
    assert logged == eager
