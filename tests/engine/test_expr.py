"""The condition language fails closed and costs what its size says (issue 22, points 3 and
5): kinds that do not compare, case and Unicode forms, data over the caps and a spent budget
are evaluation errors, which `rules.match` turns into a match of a `deny` or `require` rule
and no match of an `approve` rule; the helpers make the common rules writable correctly
(docs/approvals.md, "The condition language")."""

from __future__ import annotations

import time
from typing import Any

import pytest

from undolog.engine.expr import EvalError, ExprError, parse
from undolog.engine.expr_ops import MAX_ITEMS, MAX_STEPS, MAX_STRING, Budget, BudgetExceeded, Spill
from undolog.engine.rules import RuleAction, match, parse_rules

# The documented rules (docs/approvals.md), as the docs spell them.
OUTSIDE_MAIL = 'not all(addresses(to, cc, bcc), domain(it) == "ourcompany.com")'
EVIL_MAIL = 'any(addresses(to, cc, bcc), domain(it) == "evil.com")'
BIG_TRANSFERS = "amount >= 10000"
PROD_TAGS = '"prod" in tags or tags == ["prod"]'


def wide(ascii_text: str) -> str:
    """The full-width (compatibility) form of ASCII text: NFKC maps it back."""
    return "".join(chr(ord(ch) + 0xFEE0) for ch in ascii_text)


def decide(condition: str, args: Any) -> bool | str:
    """True/False, or "error" when the condition cannot be decided."""
    try:
        return parse(condition).holds(args)
    except EvalError:
        return "error"


@pytest.mark.security
@pytest.mark.parametrize(
    ("to", "expected"),
    [
        ("bob@ourcompany.com", False),
        ("Bob <bob@OurCompany.COM>; al@ourcompany.com.", False),  # case and the root dot
        ("attacker@evil.com, bob@ourcompany.com", True),  # the reported bypass
        ("attacker@evil.com;bob@ourcompany.com", True),
        ("bob@ourcompany.com,attacker@EVIL.COM", True),
        (["bob@ourcompany.com", "attacker@evil.com"], True),
        ('"bob@ourcompany.com" <attacker@evil.com>', True),  # a display name is not the address
        ("bob@ourcompany.com.evil.com", True),
        ("bob@\u043eurcompany.com", True),  # a Cyrillic o: another domain
        ("bob@ourcompany.com@evil.com", "error"),
        ("attacker@evil.com(bob@ourcompany.com)", "error"),  # what it cannot read fails closed
        ("grp: attacker@evil.com, bob@ourcompany.com;", "error"),
        ("bob@ourcompany.com\nbcc: attacker@evil.com", "error"),
        (5, "error"),
    ],
)
def test_the_outside_mail_rule_catches_every_outside_recipient(to: Any, expected: Any) -> None:
    assert decide(OUTSIDE_MAIL, {"to": to, "subject": "hi"}) == expected


@pytest.mark.security
def test_the_outside_mail_rule_reads_cc_and_bcc_too() -> None:
    assert decide(OUTSIDE_MAIL, {"to": "a@ourcompany.com", "bcc": "x@evil.com"}) is True
    assert decide(OUTSIDE_MAIL, {"to": "a@ourcompany.com", "cc": ["b@ourcompany.com"]}) is False


@pytest.mark.security
@pytest.mark.parametrize(
    "to",
    [
        "attacker@EVIL.com",
        "attacker@" + wide("evil") + ".com",  # full width: NFKC makes it evil.com
        "bob@ourcompany.com, Attacker <attacker@Evil.Com>",
    ],
)
def test_a_deny_rule_on_a_domain_is_not_slipped_past_by_case_or_width(to: str) -> None:
    assert decide(EVIL_MAIL, {"to": to}) is True


@pytest.mark.security
@pytest.mark.parametrize(
    ("condition", "args", "expected"),
    [
        (BIG_TRANSFERS, {"amount": 50000}, True),
        (BIG_TRANSFERS, {"amount": "50000"}, True),  # a numeric string is its number
        (BIG_TRANSFERS, {"amount": " 5e4 "}, True),
        (BIG_TRANSFERS, {"amount": wide("50000")}, True),  # full-width digits
        (BIG_TRANSFERS, {"amount": "50,000"}, "error"),  # not a number: cannot decide
        (BIG_TRANSFERS, {"amount": [50000]}, "error"),
        (BIG_TRANSFERS, {"amount": {"value": 50000}}, "error"),
        (BIG_TRANSFERS, {"amount": True}, "error"),
        (BIG_TRANSFERS, {"amount": "NaN"}, "error"),
        (BIG_TRANSFERS, {}, False),  # a missing field does not match
        (PROD_TAGS, {"tags": ["prod"]}, True),  # a list literal is a list
        (PROD_TAGS, {"tags": ["dev", "prod"]}, True),
        (PROD_TAGS, {"tags": ["dev"]}, False),
        (PROD_TAGS, {"tags": ["PROD"]}, "error"),  # differs only by case
        (PROD_TAGS, {"tags": [wide("prod")]}, "error"),  # or by Unicode form
        (PROD_TAGS, {"tags": [["prod"]]}, "error"),  # a list is not a string
        ('tags == ["prod"]', {"tags": ["prod"]}, True),
        ('tags == ["prod"]', {"tags": ["prod", "dev"]}, False),
        ('env == "prod"', {"env": "Prod"}, "error"),
        ('env != "prod"', {"env": "Prod"}, "error"),
        ('lower(nfkc(env)) == "prod"', {"env": wide("PROD")}, True),
        ('db startswith "staging-"', {"db": "STAGING-1"}, "error"),
        ('body contains "secret"', {"body": "a SECRET b"}, "error"),
        ('"k" in meta', {"meta": {"K": 1}}, "error"),
        ('"k" in meta', {"meta": {"k": 1}}, True),
        ("flag", {"flag": 1}, "error"),  # only a boolean is a condition
        ("not flag", {"flag": "yes"}, "error"),
        ("n in [1, 2]", {"n": True}, "error"),
    ],
)
def test_what_cannot_be_decided_is_an_error_never_a_silent_false(
    condition: str, args: dict[str, Any], expected: Any
) -> None:
    assert decide(condition, args) == expected


@pytest.mark.parametrize(
    ("condition", "args", "expected"),
    [
        ('split(to, ",") == ["a", "b"]', {"to": " a, b ,"}, True),
        ('any(split(tags, ";"), it == "x")', {"tags": "y;x"}, True),
        ("all(items, it.qty < 10)", {"items": [{"qty": 1}, {"qty": 2}]}, True),
        ("all(items, it.qty < 10)", {"items": [{"qty": 1}, {"qty": 20}]}, False),
        ("all(items, it.qty < 10)", {}, True),  # all of nothing
        (
            "any(items, any(it.tags, it == 'x'))",
            {"items": [{"tags": ["y"]}, {"tags": ["x"]}]},
            True,
        ),
        ("len(addresses(to)) > 1", {"to": "a@b.c, d@e.f"}, True),
        ('domain(to) == "b.example"', {"to": "A <a@B.Example.>"}, True),
        ("domain(to) == null", {}, True),
        ("domain(to) == 'x'", {"to": "no-at-sign"}, "error"),
        ("it == 1", {"it": 1}, True),  # outside all/any, `it` is a field
        ("all(x, true)", {"x": "not a list"}, "error"),
    ],
)
def test_the_helpers(condition: str, args: dict[str, Any], expected: Any) -> None:
    assert decide(condition, args) == expected


@pytest.mark.parametrize(
    ("condition", "problem"),
    [
        ("nope(x)", "unknown function"),
        ("lower(a, b)", "takes 1 arguments"),
        ("addresses()", "takes 1 to 8"),
        ("all(x)", "a list and a condition"),
        ("all(x, it > 1, 3)", "a list and a condition"),
    ],
)
def test_a_bad_call_is_refused_when_parsed(condition: str, problem: str) -> None:
    with pytest.raises(ExprError, match=problem):
        parse(condition)


@pytest.mark.security
def test_data_over_the_caps_is_an_error_not_a_slow_walk() -> None:
    assert decide('"prod" in tags', {"tags": ["x"] * (MAX_ITEMS + 1)}) == "error"
    assert decide('"prod" in tags', {"tags": ["x"] * MAX_ITEMS}) is False
    assert decide('body contains "s"', {"body": "x" * (MAX_STRING + 1)}) == "error"
    assert decide("len(tags) > 5", {"tags": ["x"] * 100_000}) is True  # len looks at nothing
    deep: Any = "prod"
    for _ in range(40):
        deep = [deep]
    assert decide("a == b", {"a": deep, "b": deep}) == "error"


@pytest.mark.security
def test_a_spent_budget_is_an_error_and_spilling_is_a_signal() -> None:
    expr = parse(" or ".join(['"prod" in tags'] * 60))
    args = {"tags": [f"tag-{n}" for n in range(MAX_ITEMS)]}
    with pytest.raises(BudgetExceeded):
        expr.holds(args, Budget(10_000))
    with pytest.raises(Spill):
        expr.holds(args, Budget(10_000, spill=True))
    assert expr.holds({"tags": ["a", "prod"]}) is True


def _rules(action: str, condition: str, count: int = 1) -> Any:
    return parse_rules(
        [{"name": f"r{n}", "tool": "*", "condition": condition, "action": action}
         for n in range(count)]
    )  # fmt: skip


@pytest.mark.security
@pytest.mark.parametrize(
    ("action", "matched"),
    [("deny", True), ("require", True), ("approve", False)],
)
def test_a_rule_that_cannot_be_decided_fails_closed(action: str, matched: bool) -> None:
    rules = _rules(action, BIG_TRANSFERS)
    found = match(rules, "pay", {"amount": "a lot"})
    assert (found.rule is not None) is matched
    assert found.error is not None and found.error.startswith("rules[r0]: ")
    if matched:
        assert found.rule is not None and found.rule.action is RuleAction(action)


@pytest.mark.security
def test_the_documented_limits_answer_well_under_a_second() -> None:
    """100 rules x 60 terms over ~780 KB of a list: the case that froze the proxy for 9
    minutes. Over the cap it is an error at once; at the cap the budget ends it."""
    condition = " or ".join(f'"prod-{n}" in tags' for n in range(60))
    assert len(parse(condition).node[1]) == 60
    worst = 0.0
    for tags in (
        [f"tag-{n:06d}" for n in range(60_000)],  # ~780 KB: over the cap
        ["t" * 770 + f"{n:05d}" for n in range(MAX_ITEMS)],  # ~780 KB at the cap
    ):
        for action in ("approve", "require", "deny"):
            rules = _rules(action, condition, 100)
            started = time.perf_counter()
            found = match(rules, "pay", {"tags": tags})
            worst = max(worst, time.perf_counter() - started)
            assert found.error is not None
            assert (found.rule is None) is (action == "approve")
    assert worst < 5.0, worst  # about 0.1 s on a loaded 2-core box (see the report)
    assert MAX_STEPS == 50_000
