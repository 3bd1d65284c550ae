"""The policy rules' condition language, rule lists, their rows of the decision table, and
approve-with-changes' approver counting: pure functions, no store (docs/approvals.md)."""

from __future__ import annotations

import contextlib
from typing import Any

import pytest

from undolog.engine.changes import Approver, Edit, approvers_after, args_diff, check_edit
from undolog.engine.decide import Action, decide
from undolog.engine.expr import MAX_LENGTH, EvalError, ExprError, parse
from undolog.engine.rules import RuleAction, first_match, parse_rules, rules_json
from undolog.store.records import ApprovalRecord
from undolog_sdk.errors import Forbidden, InvalidRequest
from undolog_sdk.tier import ToolTier


@pytest.mark.parametrize(
    ("condition", "args", "holds"),
    [
        ("amount < 100", {"amount": 99}, True),
        ("amount < 100", {"amount": 100}, False),
        ("amount <= 100.5", {"amount": 100.5}, True),
        ('env == "staging"', {"env": "staging"}, True),
        ("env == 'staging'", {"env": "prod"}, False),
        ('to endswith "@ourcompany.com"', {"to": "a@ourcompany.com"}, True),
        ('to endswith "@ourcompany.com"', {"to": "a@ourcompany.com.evil"}, False),
        ('to startswith "ops-"', {"to": "ops-1"}, True),
        ('body contains "secret"', {"body": "a secret b"}, True),
        ('tags contains "x"', {"tags": ["y", "x"]}, True),
        ('env in ["dev", "staging"]', {"env": "dev"}, True),
        ("env not in ['dev', 'staging']", {"env": "prod"}, True),
        ("amount < 100 and not (env == 'prod')", {"amount": 1, "env": "dev"}, True),
        ("amount < 100 and not (env == 'prod')", {"amount": 1, "env": "prod"}, False),
        ("a == 1 or b == 2", {"b": 2}, True),
        ("payment.card.last4 == '4242'", {"payment": {"card": {"last4": "4242"}}}, True),
        ("items[0].sku == 'A'", {"items": [{"sku": "A"}]}, True),
        ("items[-1].sku == 'B'", {"items": [{"sku": "A"}, {"sku": "B"}]}, True),
        ("items[5].sku == 'A'", {"items": []}, False),
        ("meta['odd key'] == 1", {"meta": {"odd key": 1}}, True),
        ("missing > 1", {}, False),  # a missing field is null: no ordering, no match
        ("missing == null", {}, True),
        ("amount < 100", {"amount": "5"}, True),  # a numeric string is its number
        ("flag", {"flag": True}, True),
        ("flag", {"flag": None}, False),  # a missing field is false
        ("true", {}, True),
        ("not false", {}, True),
        ('note == "a\\"b"', {"note": 'a"b'}, True),
        # A path is a lookup of JSON keys, never of Python attributes.
        ("a.__class__ == 1", {"a": {"__class__": 1}}, True),
        ("a.__class__ != null", {"a": {}}, False),
    ],
)
def test_a_condition_holds_of_the_args_it_describes(
    condition: str, args: dict[str, Any], holds: bool
) -> None:
    assert parse(condition).holds(args) is holds


@pytest.mark.security
@pytest.mark.parametrize(
    ("condition", "problem"),
    [
        ("", "empty"),
        ("amount <", "ends too early"),
        ("amount < 1 1", "unexpected"),
        ("__import__('os').system('x')", "unknown function"),
        ("x == `1`", "unexpected character"),
        ('x == "\\q"', "unknown escape"),
        ("(" * 40 + "a" + ")" * 40, "nests deeper"),
        ("not " * 40 + "a", "nests deeper"),
        ("a" + ".b" * 40, "deeper than"),
        (" or ".join(["a == 1"] * 200), "more than"),
        ("x in [" + ", ".join(["1"] * 200) + "]", "more than"),
        ("a == 1" + " " * MAX_LENGTH, "longer than"),
        ("x in [a]", "literals only"),
    ],
)
def test_a_bad_or_oversized_condition_is_refused_when_parsed(condition: str, problem: str) -> None:
    with pytest.raises(ExprError, match=problem):
        parse(condition)


def test_evaluation_raises_nothing_but_an_eval_error_whatever_the_args() -> None:
    expr = parse("a.b[2] < 3 or c contains 'x' or d startswith 'y' or e in 'abc'")
    cases: list[Any] = [{}, {"a": 1}, {"a": {"b": "str"}}, {"c": 5, "d": None, "e": ["a"]}, []]
    for args in cases:
        with contextlib.suppress(EvalError):
            assert expr.holds(args) in (True, False)


def test_rules_are_checked_whole_and_the_first_match_wins() -> None:
    rules = parse_rules(
        [
            {"name": "small", "tool": "pay", "condition": "amount < 100", "action": "approve"},
            {"name": "big", "tool": "*", "condition": "amount >= 10000", "action": "deny"},
            {"name": "two", "tool": "pay", "action": "require", "approvers": 2},
        ]
    )
    assert first_match(rules, "pay", {"amount": 5}) is rules[0]
    assert first_match(rules, "wire", {"amount": 50000}) is rules[1]
    assert first_match(rules, "pay", {"amount": 500}) is rules[2]
    assert first_match(rules, "wire", {"amount": 5}) is None
    assert rules[2].decided_by == "rule:two" and rules[2].action is RuleAction.REQUIRE
    assert parse_rules(rules_json(rules)) == rules


@pytest.mark.parametrize(
    "bad",
    [
        "not a list",
        [1],
        [{"name": "a", "action": "deny"}, {"name": "a", "action": "deny"}],
        [{"name": "a", "action": "deny", "tool": "../x"}],
        [{"name": "a", "action": "require", "approvers": True}],
        [{"name": "a", "action": "require", "approvers": 0}],
        [{"name": f"r{n}", "action": "deny"} for n in range(101)],
    ],
)
def test_a_bad_rule_list_is_refused(bad: Any) -> None:
    with pytest.raises(ValueError, match="rules"):
        parse_rules(bad)


@pytest.mark.parametrize(
    ("tier", "rule_action", "expected"),
    [
        (ToolTier.IRREVERSIBLE, None, Action.AWAIT_NEW),
        (ToolTier.IRREVERSIBLE, "approve", Action.EXECUTE_NEW),
        (ToolTier.IRREVERSIBLE, "deny", Action.DENY_NEW),
        (ToolTier.COMPENSABLE, None, Action.EXECUTE_NEW),
        (ToolTier.COMPENSABLE, "require", Action.AWAIT_NEW),
        (ToolTier.COMPENSABLE, "deny", Action.DENY_NEW),
    ],
)
def test_a_rule_decides_a_new_call(
    tier: ToolTier, rule_action: str | None, expected: Action
) -> None:
    action = decide(
        tier=tier, existing=None, session_state="active", approval_status=None, now_us=1,
        idempotent_upstream=False, rule_action=rule_action,
    )  # fmt: skip
    assert action is expected


def test_a_closed_session_is_closed_whatever_the_rule() -> None:
    action = decide(
        tier=ToolTier.IRREVERSIBLE, existing=None, session_state="halted", approval_status=None,
        now_us=1, idempotent_upstream=False, rule_action="approve",
    )  # fmt: skip
    assert action is Action.SESSION_CLOSED


def _approval(**fields: Any) -> ApprovalRecord:
    base: dict[str, Any] = {
        "approval_id": "a", "org_id": "o", "effect_id": "e", "session_id": "s",
        "tool_name": "t", "args_json": '{"x":1}', "status": "pending", "created_us": 1,
        "timeout_us": 2, "decided_us": None, "decided_by": None, "reason": None,
        "rule": "r", "approvers_required": 2, "requested_by_key_id": "key_agent",
    }  # fmt: skip
    base.update(fields)
    return ApprovalRecord(**base)


def test_the_same_key_counts_once_and_changed_args_start_the_count_again() -> None:
    alice, bob = Approver("key_a", "key:alice"), Approver("key_b", "key:bob")
    approval = _approval(approved_by_json='[{"key_id": "key_a", "by": "key:alice"}]')
    assert approvers_after(approval, alice, None) == (
        [{"key_id": "key_a", "by": "key:alice"}], None
    )  # fmt: skip
    both, args = approvers_after(approval, bob, None)
    assert [a["by"] for a in both] == ["key:alice", "key:bob"] and args is None
    edited, args = approvers_after(approval, bob, check_edit({"x": 2}))
    assert [a["by"] for a in edited] == ["key:bob"] and args == '{"x":2}'
    # An "edit" back to the requested args is no edit.
    same, args = approvers_after(approval, bob, Edit('{"x":1}'))
    assert len(same) == 2 and args is None


@pytest.mark.security
def test_the_requesting_key_cannot_approve_a_rule_required_call() -> None:
    with pytest.raises(Forbidden):
        approvers_after(_approval(), Approver("key_agent", "key:agent"), None)


def test_changed_args_must_be_a_canonical_json_object() -> None:
    for bad in ([1], "x", {"n": float("nan")}, {"n": 2**70}):
        with pytest.raises(InvalidRequest):
            check_edit(bad)


def test_the_diff_names_added_removed_and_changed_keys() -> None:
    assert args_diff({"a": 1, "b": 2, "c": [1]}, {"a": 1, "b": 3, "d": 4, "c": [1]}) == {
        "added": {"d": 4},
        "removed": {},
        "changed": {"b": {"from": 2, "to": 3}},
    }
