"""What the condition language's operators and functions do to values, under a step budget.

The parser (`expr.py`) builds the tree; this module holds the semantics, chosen to fail
closed: a comparison that cannot be decided honestly is an `EvalError`, never a silent
`false`, and `rules.py` turns an error of a `deny` or `require` rule into a match (the call
is refused, or waits for a person). What is an error (docs/approvals.md, "Errors fail closed"):

- values of different kinds compared (a string and a list, a boolean and a number); a
  missing field (`null`) is the one exception: it equals only `null` and orders nothing;
- a string compared with a number, unless the string is a number (`"50000"` is 50000);
- two strings whose result differs once both are put in NFKC form and case-folded (`"PROD"`
  and `"prod"`, its full-width form): neither equal nor unequal, so neither a deny rule
  nor an approve rule can be slipped past by case or a compatibility form;
- a value over the caps a rule may look at (`MAX_ITEMS` items of a list, `MAX_STRING`
  characters of a string, `MAX_VALUE_DEPTH` levels of nesting), and a budget of steps spent
  (`Budget`): what one call's rules cost is bounded by the rules' size times these caps.
"""

from __future__ import annotations

import math
import re
import unicodedata
from typing import Any

__all__ = [
    "FUNCTIONS",
    "INLINE_STEPS",
    "MAX_ITEMS",
    "MAX_STEPS",
    "MAX_STRING",
    "MAX_VALUE_DEPTH",
    "Budget",
    "BudgetExceeded",
    "EvalError",
    "Spill",
    "compare",
    "truth",
]

MAX_STEPS = 50_000  # steps of one call's rules, all together (see `Budget`)
INLINE_STEPS = 2_000  # steps a match may take on the event loop before it moves to a thread
MAX_ITEMS = 1000  # items of one list a rule may look at (args' lists, split and addresses)
MAX_STRING = 65_536  # characters of one string a rule may look at
MAX_VALUE_DEPTH = 16  # nesting of the args' lists and objects a comparison walks
_CHARS_PER_STEP = 64  # a string operation costs a step per this many characters


class EvalError(ValueError):
    """A condition that cannot be decided for these args: the rule fails closed."""


class BudgetExceeded(EvalError):
    """The call's rules used up their steps: the rule being evaluated fails closed."""


class Budget:
    """The steps one call's rules may take, all rules together. With `spill`, running out
    raises `Spill` instead (the caller re-runs the match off the event loop, in full)."""

    __slots__ = ("_folded", "left", "spill")

    def __init__(self, steps: int, *, spill: bool = False) -> None:
        self.left = steps
        self.spill = spill
        # id -> (the string itself, kept alive so the id stays its own; its folded form)
        self._folded: dict[int, tuple[str, str]] = {}

    def take(self, steps: int = 1) -> None:
        self.left -= steps
        if self.left < 0:
            if self.spill:
                raise Spill
            raise BudgetExceeded("the rules took more steps than a call may use")

    def folded(self, text: str) -> str:
        """NFKC then case-folded, computed once per string per call."""
        hit = self._folded.get(id(text))
        if hit is not None and hit[0] is text:
            return hit[1]
        self.take(1 + len(text) // _CHARS_PER_STEP)
        out = text.casefold() if text.isascii() else unicodedata.normalize("NFKC", text).casefold()
        self._folded[id(text)] = (text, out)
        return out


class Spill(Exception):
    """The inline budget ran out: evaluate again, off the event loop, with the full budget."""


def kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, (list, tuple)):
        return "list"
    if isinstance(value, dict):
        return "object"
    return type(value).__name__


def truth(value: Any, what: str) -> bool:
    """A value where a condition is expected: a boolean, or null (a missing field: false)."""
    if value is True or value is False:
        return value
    if value is None:
        return False
    raise EvalError(f"{what} is a {kind(value)}, not a boolean")


def text(value: Any, budget: Budget) -> str:
    """A string a rule looks at, within the cap."""
    if len(value) > MAX_STRING:
        raise EvalError(f"a string is longer than {MAX_STRING} characters")
    budget.take(len(value) // _CHARS_PER_STEP)  # the operation took its own step
    return str(value)


def items(value: Any) -> list[Any] | tuple[Any, ...]:
    """A list a rule looks at, within the cap."""
    if len(value) > MAX_ITEMS:
        raise EvalError(f"a list has more than {MAX_ITEMS} items")
    return value  # type: ignore[no-any-return]


def number(value: str) -> int | float:
    """A numeric string as its number (`"50000"`, `" 5e4 "`, full-width digits); else an error."""
    if len(value) <= 100:
        try:
            return int(value)
        except ValueError:
            pass
        try:
            found = float(value)
        except ValueError:
            pass
        else:
            if math.isfinite(found):
                return found
    raise EvalError(f"the string {value[:40]!r} is compared with a number but is not one")


def _numbers(left: Any, right: Any) -> tuple[Any, Any] | None:
    """Both as numbers when one is a number and the other a number or a numeric string."""
    lk, rk = kind(left), kind(right)
    if lk == "number" and rk == "number":
        return left, right
    if lk == "number" and rk == "string":
        return left, number(right)
    if lk == "string" and rk == "number":
        return number(left), right
    return None


def _mismatch(left: Any, right: Any) -> EvalError:
    return EvalError(f"a {kind(left)} is compared with a {kind(right)}")


def _strings(op: str, left: str, right: str, budget: Budget) -> bool:
    """A string operation, exact; an error when the folded forms answer otherwise."""
    left, right = text(left, budget), text(right, budget)
    exact: bool = _STRING_OPS[op](left, right)
    if exact != _STRING_OPS[op](budget.folded(left), budget.folded(right)):
        raise EvalError(
            f"{left[:40]!r} and {right[:40]!r} differ only by letter case or Unicode form"
        )
    return exact


_STRING_OPS: dict[str, Any] = {
    "==": str.__eq__,
    "<": str.__lt__,
    "<=": str.__le__,
    ">": str.__gt__,
    ">=": str.__ge__,
    "in": lambda needle, hay: needle in hay,
    "startswith": str.startswith,
    "endswith": str.endswith,
}


def equal(left: Any, right: Any, budget: Budget, depth: int = 0) -> bool:
    """`==`: null equals only null; numbers and numeric strings by value; lists item by
    item; objects key by key; any other pair of kinds is an error."""
    budget.take()
    if left is None or right is None:
        return left is None and right is None
    if depth > MAX_VALUE_DEPTH:
        raise EvalError(f"a value nests deeper than {MAX_VALUE_DEPTH} levels")
    lk, rk = kind(left), kind(right)
    if lk == "string" and rk == "string":
        return _strings("==", left, right, budget)
    pair = _numbers(left, right)
    if pair is not None:
        return bool(pair[0] == pair[1])
    if lk != rk:
        raise _mismatch(left, right)
    if lk == "boolean":
        return bool(left is right)
    if lk == "list":
        left, right = items(left), items(right)
        if len(left) != len(right):
            return False
        return all(equal(a, b, budget, depth + 1) for a, b in zip(left, right, strict=True))
    if lk == "object":
        budget.take(len(left))
        if left.keys() != right.keys():
            return False
        return all(equal(left[key], right[key], budget, depth + 1) for key in left)
    raise _mismatch(left, right)


def member(needle: Any, hay: Any, budget: Budget) -> bool:
    """`needle in hay`: a substring of a string, an item of a list (by `equal`), a key of an
    object. Found is true even if another item could not be compared; not found then is
    an error."""
    budget.take()
    if hay is None:
        return False
    hk = kind(hay)
    if hk == "string":
        if needle is None:
            return False
        if kind(needle) != "string":
            raise _mismatch(needle, hay)
        return _strings("in", needle, hay, budget)
    if hk == "list":
        problem: EvalError | None = None
        for item in items(hay):
            try:
                if equal(needle, item, budget):
                    return True
            except BudgetExceeded:
                raise
            except EvalError as exc:
                problem = problem or exc
        if problem is not None:
            raise problem
        return False
    if hk == "object" and kind(needle) == "string":
        if needle in hay:
            return True
        budget.take(len(items(hay)))
        folded = budget.folded(needle)
        if any(isinstance(key, str) and budget.folded(key) == folded for key in hay):
            raise EvalError(f"{needle[:40]!r} differs from a key only by case or Unicode form")
        return False
    raise _mismatch(needle, hay)


def compare(op: str, left: Any, right: Any, budget: Budget) -> bool:
    """One comparison of the language (`==` ... `contains`); see the module's docstring."""
    if op == "==":
        return equal(left, right, budget)
    if op == "!=":
        return not equal(left, right, budget)
    if op == "in":
        return member(left, right, budget)
    if op == "not in":
        return not member(left, right, budget)
    if op == "contains":  # a substring of a string, an item of a list
        if kind(left) not in ("string", "list", "null"):
            raise EvalError(f"contains needs a string or a list on its left, not a {kind(left)}")
        return member(right, left, budget)
    budget.take()
    if left is None or right is None:
        return False  # a missing field: no ordering, no prefix, no suffix
    if op in ("startswith", "endswith"):
        if kind(left) != "string" or kind(right) != "string":
            raise _mismatch(left, right)
        return _strings(op, left, right, budget)
    pair = _numbers(left, right)
    if pair is None:
        if kind(left) == "string" and kind(right) == "string":
            return _strings(op, left, right, budget)
        raise _mismatch(left, right)
    a, b = pair
    return bool(a < b if op == "<" else a <= b if op == "<=" else a > b if op == ">" else a >= b)


# --- functions ---------------------------------------------------------------------------


def _string_arg(name: str, value: Any, budget: Budget) -> str | None:
    if value is None:
        return None
    if kind(value) != "string":
        raise EvalError(f"{name}() takes a string, not a {kind(value)}")
    return text(value, budget)


def _lower(budget: Budget, value: Any) -> Any:
    found = _string_arg("lower", value, budget)
    return None if found is None else found.lower()


def _nfkc(budget: Budget, value: Any) -> Any:
    found = _string_arg("nfkc", value, budget)
    return None if found is None else unicodedata.normalize("NFKC", found)


def _len(budget: Budget, value: Any) -> Any:
    budget.take()
    if value is None:
        return 0
    if kind(value) in ("string", "list", "object"):
        return len(value)
    raise EvalError(f"len() takes a string, a list or an object, not a {kind(value)}")


def _split(budget: Budget, value: Any, sep: Any) -> Any:
    found = _string_arg("split", value, budget)
    if kind(sep) != "string" or not sep:
        raise EvalError("split() takes a non-empty string separator")
    if found is None:
        return []
    parts = [part.strip() for part in found.split(sep, MAX_ITEMS)]
    if len(parts) > MAX_ITEMS:
        raise EvalError(f"split() gives more than {MAX_ITEMS} items")
    budget.take(len(parts))
    return [part for part in parts if part]


# An address list: items separated by `,` or `;` outside quotes and angle brackets. Anything
# this reading is not sure of (a comment, a group, a stray bracket or quote, a control
# character) is an error, so a rule never decides on an address it read differently from
# the mail system.
_ADDRESS_PARTS = re.compile(r'"(?:[^"\\\r\n]|\\[^\r\n])*"|<[^<>"\r\n]*>|[,;]|[^",;<>]+|.', re.S)
_ADDR_SPEC = re.compile(
    r'^(?:[^\s@<>(),;:"\\\[\]]+|"(?:[^"\\\r\n]|\\[^\r\n])*")@[^\s@<>(),;:"\\\[\]]+$'
)
_DISPLAY = re.compile(r'^(?:[^"<>(),;:@\\\r\n]|"(?:[^"\\\r\n]|\\[^\r\n])*")*$')


_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def _one_address(item: str) -> str:
    if _CONTROL.search(item):
        raise EvalError("an address holds a control character")
    if item.endswith(">") and "<" in item:
        display, _, rest = item.rpartition("<")
        spec = rest[:-1].strip()
        if not _DISPLAY.match(display.strip()):
            raise EvalError(f"cannot read the address {item[:60]!r}")
    else:
        spec = item
    if not _ADDR_SPEC.match(spec):
        raise EvalError(f"cannot read the address {item[:60]!r}")
    return spec


def _addresses_of(value: str) -> list[str]:
    found: list[str] = []
    current: list[str] = []
    for match in _ADDRESS_PARTS.finditer(value):
        part = match.group()
        if part in (",", ";"):
            found.append("".join(current).strip())
            current = []
        elif part in ('"', "<", ">"):
            raise EvalError(f"cannot read the address list {value[:60]!r}")
        else:
            current.append(part)
        if len(found) > MAX_ITEMS:
            raise EvalError(f"an address list has more than {MAX_ITEMS} addresses")
    found.append("".join(current).strip())
    return [_one_address(item) for item in found if item]


def _addresses(budget: Budget, *values: Any) -> Any:
    out: list[str] = []
    for value in values:
        if value is None:
            continue
        strings = items(value) if kind(value) == "list" else [value]
        for one in strings:
            if kind(one) != "string":
                raise EvalError(f"addresses() takes strings, not a {kind(one)}")
            one = text(one, budget)
            budget.take(len(one) // 8)  # reading a list costs more than comparing it
            out.extend(_addresses_of(one))
            if len(out) > MAX_ITEMS:
                raise EvalError(f"more than {MAX_ITEMS} addresses")
    budget.take(len(out))
    return out


def _domain(budget: Budget, value: Any) -> Any:
    found = _string_arg("domain", value, budget)
    if found is None:
        return None
    local, at, host = found.strip().rpartition("@")
    if not at or not local:
        raise EvalError(f"{found[:60]!r} is not an address")
    host = unicodedata.normalize("NFKC", host.rstrip(">").strip()).lower().rstrip(".")
    if not host:
        raise EvalError(f"{found[:60]!r} has no domain")
    return host


# name -> (the function, the fewest and the most arguments)
FUNCTIONS: dict[str, tuple[Any, int, int]] = {
    "lower": (_lower, 1, 1),
    "nfkc": (_nfkc, 1, 1),
    "len": (_len, 1, 1),
    "split": (_split, 2, 2),
    "addresses": (_addresses, 1, 8),
    "domain": (_domain, 1, 1),
}
