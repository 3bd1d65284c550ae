"""Policy rules: per org, an ordered list of (tool, condition over the args, action).

Pure values and functions: `parse_rules` checks a list as the API or the config gives it (and
refuses it whole, with a clear message, if any part is wrong), `first_match` names the rule a
call hits. The engine applies the match to a new call before it is recorded (see
`Engine.intercept`); docs/approvals.md ("Policy rules") is the user's reference.

Semantics: the first rule whose tool matches (`*` is every tool) and whose condition holds
wins; no match leaves the tool's tier to decide (an IRREVERSIBLE call needs a person).

Errors fail closed: a condition that cannot be decided for a call (`expr_ops.EvalError`:
kinds that do not compare, data over the caps, the call's step budget spent) makes a `deny`
rule deny and a `require` rule require, as if it held; an `approve` rule that cannot be
decided does not approve (the next rules are tried, then the tier decides). So an error
never lets a call through that a rule meant to stop.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from undolog.engine.expr import Expr, ExprError, parse
from undolog.engine.expr_ops import MAX_STEPS, Budget, EvalError
from undolog.upstreams import check_tool_name

__all__ = [
    "ALL_TOOLS",
    "MAX_APPROVERS",
    "MAX_RULES",
    "Match",
    "Rule",
    "RuleAction",
    "first_match",
    "match",
    "parse_rules",
    "rules_json",
]

ALL_TOOLS = "*"
MAX_RULES = 100
MAX_APPROVERS = 10
_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
_FIELDS = frozenset({"name", "tool", "condition", "action", "approvers"})


class RuleAction(enum.StrEnum):
    APPROVE = "approve"  # an IRREVERSIBLE call runs without a person
    DENY = "deny"  # the call is refused (403 policy_denied): only a `call_denied` event
    REQUIRE = "require"  # a person must approve, even for a tool that needs none (N of them)


@dataclass(frozen=True, slots=True)
class Rule:
    name: str
    tool: str  # a tool's name, or `*`
    condition: Expr
    action: RuleAction
    approvers: int = 1  # distinct approver keys a `require` needs

    @property
    def decided_by(self) -> str:
        """How this rule is recorded as the decider of an approval."""
        return f"rule:{self.name}"

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "name": self.name,
            "tool": self.tool,
            "condition": self.condition.source,
            "action": self.action.value,
        }
        if self.action is RuleAction.REQUIRE:
            out["approvers"] = self.approvers
        return out


def _rule(n: int, item: Any, seen: set[str]) -> Rule:
    where = f"rules[{n}]"
    if not isinstance(item, dict):
        raise ValueError(f"{where}: a rule is an object")
    unknown = set(item) - _FIELDS
    if unknown:
        raise ValueError(f"{where}: unknown fields {sorted(unknown)}")
    name = item.get("name")
    if not isinstance(name, str) or not _NAME.match(name):
        raise ValueError(f"{where}.name: 1 to 64 letters, digits, '_', '.' or '-'")
    if name in seen:
        raise ValueError(f"{where}.name: {name!r} is used twice")
    seen.add(name)
    tool = item.get("tool", ALL_TOOLS)
    if not isinstance(tool, str) or (tool != ALL_TOOLS and check_tool_name(tool)):
        raise ValueError(f"{where}.tool: a tool name or '*'")
    try:
        action = RuleAction(str(item.get("action")))
    except ValueError:
        raise ValueError(f"{where}.action: one of approve, deny, require") from None
    approvers = item.get("approvers", 1)
    if isinstance(approvers, bool) or not isinstance(approvers, int):
        raise ValueError(f"{where}.approvers: an integer")
    if not 1 <= approvers <= MAX_APPROVERS:
        raise ValueError(f"{where}.approvers: between 1 and {MAX_APPROVERS}")
    if approvers != 1 and action is not RuleAction.REQUIRE:
        raise ValueError(f"{where}.approvers: only a 'require' rule takes approvers")
    condition = item.get("condition", "true")
    try:
        expr = parse(condition)
    except ExprError as exc:
        raise ValueError(f"{where}.condition: {exc}") from None
    return Rule(name, tool, expr, action, approvers)


def parse_rules(data: Any) -> tuple[Rule, ...]:
    """A list of rules, checked whole. Raises ValueError naming the first wrong part."""
    if not isinstance(data, list):
        raise ValueError("rules: a list of rules")
    if len(data) > MAX_RULES:
        raise ValueError(f"rules: at most {MAX_RULES}")
    seen: set[str] = set()
    return tuple(_rule(n, item, seen) for n, item in enumerate(data))


def rules_json(rules: Sequence[Rule]) -> list[dict[str, Any]]:
    return [rule.to_dict() for rule in rules]


@dataclass(frozen=True, slots=True)
class Match:
    """The rule a call hits (None: no rule) and, if a condition could not be decided, why
    (`rules[NAME]: ...`, the first such rule): the rule it names failed closed."""

    rule: Rule | None
    error: str | None = None


def match(rules: Sequence[Rule], tool_name: str, args: Any, budget: Budget | None = None) -> Match:
    """The first rule for this tool whose condition holds of these args, failing closed on
    conditions that cannot be decided (see the module's docstring). All rules together
    spend one `budget` (a fresh one of `MAX_STEPS` if None).

    Raises:
        Spill: only with a `Budget(spill=True)` that ran out (evaluate again in full).
    """
    budget = budget or Budget(MAX_STEPS)
    error: str | None = None
    for rule in rules:
        if rule.tool not in (ALL_TOOLS, tool_name):
            continue
        try:
            if rule.condition.holds(args, budget):
                return Match(rule, error)
        except EvalError as exc:
            error = error or f"rules[{rule.name}]: {exc}"
            if rule.action is not RuleAction.APPROVE:
                return Match(rule, error)
    return Match(None, error)


def first_match(rules: Sequence[Rule], tool_name: str, args: Any) -> Rule | None:
    """The first rule for this tool whose condition holds of these args (None: no rule);
    a `deny` or `require` rule whose condition cannot be decided counts as holding."""
    return match(rules, tool_name, args).rule
