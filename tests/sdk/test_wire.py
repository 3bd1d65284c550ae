"""The wire enums (`undolog_sdk.wire`): the reference's strings, plain-string behaviour, and
the one rule for text every store can hold.

The reference strings below are copied from the REST, SDK and error-codes references (the
section each comes from is named): the enums must spell them exactly.
"""

from __future__ import annotations

import pickle

import pytest

from undolog_sdk import wire
from undolog_sdk.tier import TIER_VALUES, CompensationDescriptor, ToolTier
from undolog_sdk.wire import (
    ApprovalStatus,
    CallStatus,
    EffectState,
    EventType,
    ExecutionMode,
    Outcome,
    RollbackOutcome,
    SessionState,
    UndoState,
    scrub,
    unstorable,
)

# REST reference, GET /events, "Event types".
REFERENCE_EVENT_TYPES = [
    "effect_intercepted",
    "effect_committed",
    "effect_replayed",
    "effect_failed",
    "approval_required",
    "approval_approved",
    "approval_rejected",
]
# REST reference, POST /mcp/tool_call responses: the three `status` values.
REFERENCE_CALL_STATUSES = ["executed", "replayed", "pending_approval"]
# REST reference, GET /approvals `state` and the record's `status`: "One of: pending,
# approved, rejected".
REFERENCE_APPROVAL_STATES = ["pending", "approved", "rejected"]
# REST reference, POST /approvals/{id}/approve `execution`: "committed" or "failed".
REFERENCE_EXECUTIONS = ["committed", "failed"]
# SDK reference, InterceptResponse.outcome: one of "Execute", "Replay", "AwaitingApproval".
REFERENCE_OUTCOMES = ["Execute", "Replay", "AwaitingApproval"]
# SDK reference, ToolTier members and values.
REFERENCE_TIERS = [
    ("SAFE", "safe"),
    ("COMPENSABLE", "compensable"),
    ("IRREVERSIBLE", "irreversible"),
]


def test_every_reference_event_type_is_an_event_type_member() -> None:
    for value in REFERENCE_EVENT_TYPES:
        assert EventType(value).value == value


def test_the_intercept_statuses_and_outcomes_are_the_references() -> None:
    for value in REFERENCE_CALL_STATUSES:
        assert CallStatus(value).value == value
    assert [o.value for o in Outcome] == REFERENCE_OUTCOMES


def test_approval_states_and_executions_are_the_references() -> None:
    for value in REFERENCE_APPROVAL_STATES:
        assert ApprovalStatus(value).value == value
    # Error-codes reference, ApprovalTimedOut: "transitions to TimedOut or AutoApproved".
    assert ApprovalStatus.TIMED_OUT.value == "timed_out"
    assert ApprovalStatus.AUTO_APPROVED.value == "auto_approved"
    for value in REFERENCE_EXECUTIONS:
        assert EffectState(value).value == value


def test_effect_and_session_states_named_in_the_error_codes_reference() -> None:
    # NotExecuting: "not in 'executing' state"; CompensationDescriptor.max_retries:
    # "escalating to `compensation_failed`".
    assert EffectState.EXECUTING.value == "executing"
    assert EffectState.COMPENSATION_FAILED.value == "compensation_failed"
    assert SessionState.COMPENSATION_FAILED.value == "compensation_failed"


def test_tiers_are_the_references_and_tier_values_lists_them_in_order() -> None:
    assert [(t.name, t.value) for t in ToolTier] == REFERENCE_TIERS
    assert tuple(value for _, value in REFERENCE_TIERS) == TIER_VALUES


def test_the_execution_modes_are_proxy_and_sdk() -> None:
    assert [m.value for m in ExecutionMode] == ["proxy", "sdk"]


ALL_ENUMS = [
    ApprovalStatus,
    CallStatus,
    EffectState,
    EventType,
    ExecutionMode,
    Outcome,
    RollbackOutcome,
    SessionState,
    UndoState,
]


@pytest.mark.parametrize("enum_cls", ALL_ENUMS, ids=lambda e: e.__name__)
def test_members_behave_as_their_plain_strings(enum_cls: type[wire._WireEnum]) -> None:
    """What `enum.StrEnum` gives on 3.11+, on every Python the SDK runs on: rows read from a
    store and JSON bodies compare equal, and str()/format()/f-strings give the value."""
    for member in enum_cls:
        value = member.value
        assert isinstance(member, str)
        assert member == value
        assert hash(member) == hash(value)
        assert {value: 1}[member] == 1
        assert str(member) == value
        assert f"{member}" == value
        assert f"{member:>30}" == f"{value:>30}"
        assert enum_cls(value) is member
        assert pickle.loads(pickle.dumps(member)) is member


def test_the_module_exports_its_enums_and_the_text_rule() -> None:
    assert wire.__all__ == sorted(wire.__all__)
    assert {e.__name__ for e in ALL_ENUMS} | {"scrub", "unstorable"} == set(wire.__all__)


def test_compensation_event_names_an_undo_entry_settled_without_running() -> None:
    assert EventType.compensation(UndoState.SKIPPED) is EventType.COMPENSATION_SKIPPED
    assert EventType.compensation(UndoState.COMPENSATED) is EventType.COMPENSATION_COMPENSATED
    with pytest.raises(ValueError):
        EventType.compensation(UndoState.PENDING)


# -- the text rule --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "bad"),
    [
        ("plain", False),
        ("café ☕", False),
        ("", False),
        ("a\x00b", True),
        ("\x00", True),
        ("lone \ud800 surrogate", True),
    ],
)
def test_unstorable_is_a_nul_or_a_lone_surrogate(text: str, bad: bool) -> None:
    assert unstorable(text) is bad


def test_scrub_replaces_what_no_store_holds_and_keeps_the_rest() -> None:
    assert scrub("disk\x00busy") == "disk\ufffdbusy"
    assert scrub("a\ud800b") == "a?b"
    assert scrub("café") == "café"
    assert not unstorable(scrub("\x00\udfff"))


@pytest.mark.parametrize("field", ["fn_name", "fn_version"])
@pytest.mark.parametrize("bad", ["a\x00b", "a\ud800b"])
def test_a_compensation_descriptor_refuses_text_no_store_holds(field: str, bad: str) -> None:
    data = {"fn_name": "undo_it", field: bad}
    with pytest.raises(ValueError, match=f"compensation.{field} must not contain NUL"):
        CompensationDescriptor.from_dict(data)
