"""`ToolTier` and `CompensationDescriptor` exactly as the reference describes them."""

from __future__ import annotations

import dataclasses

import pytest

from undolog_sdk.tier import CompensationDescriptor, ToolTier


def test_tool_tier_has_the_three_reference_members_and_values() -> None:
    assert [(t.name, t.value) for t in ToolTier] == [
        ("SAFE", "safe"),
        ("COMPENSABLE", "compensable"),
        ("IRREVERSIBLE", "irreversible"),
    ]
    assert ToolTier("compensable") is ToolTier.COMPENSABLE


@pytest.mark.parametrize(
    ("tier", "is_safe", "is_compensable", "requires_approval"),
    [
        (ToolTier.SAFE, True, False, False),
        (ToolTier.COMPENSABLE, False, True, False),
        (ToolTier.IRREVERSIBLE, False, False, True),
    ],
)
def test_tool_tier_properties_name_exactly_one_tier(
    tier: ToolTier, is_safe: bool, is_compensable: bool, requires_approval: bool
) -> None:
    assert tier.is_safe is is_safe
    assert tier.is_compensable is is_compensable
    assert tier.requires_approval is requires_approval


def test_compensation_descriptor_defaults_are_the_reference_defaults() -> None:
    descriptor = CompensationDescriptor(fn_name="undo_send_email")
    assert descriptor.fn_name == "undo_send_email"
    assert descriptor.fn_version == "1.0.0"
    assert descriptor.args == {}
    assert descriptor.max_retries == 3
    assert descriptor.retry_backoff_ms == 1000
    assert descriptor.idempotent is False  # a lost run waits for an operator unless declared
    assert [f.name for f in dataclasses.fields(CompensationDescriptor)] == [
        "fn_name",
        "fn_version",
        "args",
        "max_retries",
        "retry_backoff_ms",
        "idempotent",
    ]


def test_compensation_descriptors_do_not_share_their_default_args() -> None:
    first = CompensationDescriptor(fn_name="a")
    first.args["x"] = 1
    assert CompensationDescriptor(fn_name="b").args == {}


def test_new_builds_a_descriptor_with_defaults() -> None:
    assert CompensationDescriptor.new("undo_send_email") == CompensationDescriptor(
        fn_name="undo_send_email"
    )


def test_new_takes_the_captured_args_and_copies_them() -> None:
    captured = {"message_id": "msg-1"}
    descriptor = CompensationDescriptor.new("undo_send_email", captured)
    assert descriptor.args == {"message_id": "msg-1"}
    assert descriptor.fn_version == "1.0.0"
    captured["message_id"] = "changed"
    assert descriptor.args == {"message_id": "msg-1"}


def test_a_descriptor_round_trips_through_its_wire_form() -> None:
    descriptor = CompensationDescriptor("reverse_transfer", "2.1.0", {"k": [1]}, 5, 250)
    assert descriptor.to_dict() == {
        "fn_name": "reverse_transfer",
        "fn_version": "2.1.0",
        "args": {"k": [1]},
        "max_retries": 5,
        "retry_backoff_ms": 250,
    }
    assert CompensationDescriptor.from_dict(descriptor.to_dict()) == descriptor


@pytest.mark.parametrize(
    "data",
    [
        {"fn_name": "x", "surprise": 1},
        {"fn_name": ""},
        {"fn_name": "x", "args": [1]},
        {"fn_name": "x", "max_retries": -1},
        {"fn_name": "x", "retry_backoff_ms": True},
    ],
)
def test_a_malformed_wire_descriptor_is_refused(data: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        CompensationDescriptor.from_dict(data)
