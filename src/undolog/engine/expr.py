"""The policy rules' condition language: a tiny, bounded expression language over a call's args.

A condition is parsed once (when rules are saved or loaded) into a tree of frozen nodes, then
evaluated against each call's arguments under a `Budget` of steps. There is no `eval`, no
attribute access and no loop but `all`/`any` over a list a rule may look at: the size of a
condition is bounded when it is parsed (`MAX_LENGTH` characters, `MAX_NODES` nodes,
`MAX_DEPTH` nesting), the data it may look at when it is evaluated (`expr_ops.MAX_ITEMS`
items of a list, `expr_ops.MAX_STRING` characters of a string), and what one call's rules
may cost by `expr_ops.MAX_STEPS`. The grammar and the semantics are documented in
docs/approvals.md ("The condition language").

    expr    := or
    or      := and ("or" and)*
    and     := not ("and" not)*
    not     := "not" not | compare
    compare := operand [op operand]
    op      := == | != | < | <= | > | >= | in | not in | startswith | endswith | contains
    operand := literal | path | call | "(" expr ")" | "[" literal, ... "]"
    call    := function "(" expr ("," expr)* ")"      (all/any: "(" list "," condition ")")
    path    := name ("." name | "[" integer | string "]")*   (`it`: the item of all/any)

A missing field is null. What cannot be decided honestly (values of different kinds, strings
that differ only by case or Unicode form, data over the caps, the budget spent) raises
`EvalError`, so a rule fails closed (`expr_ops`, `rules.first_match`).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from undolog.engine.expr_ops import (
    FUNCTIONS,
    MAX_STEPS,
    Budget,
    EvalError,
    compare,
    items,
    kind,
    truth,
)

__all__ = ["MAX_DEPTH", "MAX_LENGTH", "MAX_NODES", "EvalError", "Expr", "ExprError", "parse"]

MAX_LENGTH = 2000  # characters of one condition
MAX_NODES = 200  # nodes of its tree: bounds what one evaluation costs
MAX_DEPTH = 16  # nesting of parentheses, `not`, `and`/`or` and paths
MAX_LIST = 100  # items of a list literal

_TOKEN = re.compile(
    r"""\s*(?:
      (?P<number>-?\d+(?:\.\d+)?(?:[eE][+-]?\d+)?)
    | (?P<string>"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*')
    | (?P<op>==|!=|<=|>=|<|>|\(|\)|\[|\]|,|\.)
    | (?P<name>[A-Za-z_][A-Za-z0-9_]*)
    )""",
    re.VERBOSE,
)
_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "\\": "\\", '"': '"', "'": "'", "/": "/"}
_WORD_OPS = frozenset({"in", "startswith", "endswith", "contains"})
_KEYWORDS = frozenset({"and", "or", "not", "true", "false", "null", *_WORD_OPS})
_COMPARISONS = frozenset({"==", "!=", "<", "<=", ">", ">="})


class ExprError(ValueError):
    """A condition that cannot be parsed, or one over the bounds; the message says where."""


@dataclass(frozen=True, slots=True)
class Expr:
    """A parsed condition: `holds(args)` says whether it is true of a call's arguments."""

    source: str
    node: Any
    run: Callable[[Any, Any, Budget], Any] = field(compare=False, repr=False)

    def holds(self, args: Any, budget: Budget | None = None) -> bool:
        """Whether the condition is true of these args, spending `budget` (a fresh one of
        `MAX_STEPS` if None).

        Raises:
            EvalError: it cannot be decided (see `expr_ops`); the caller fails closed.
        """
        return truth(self.run(args, None, budget or Budget(MAX_STEPS)), "the condition")


# Nodes: ("lit", value) ("path", (key, ...)) ("item", (key, ...)) ("list", (value, ...))
# ("not", node) ("and" | "or", (node, ...)) ("cmp", op, left, right) ("call", name, (node, ...))
# ("all" | "any", list node, condition node)


def _unquote(token: str, at: int) -> str:
    body, out, i = token[1:-1], [], 0
    while i < len(body):
        ch = body[i]
        if ch == "\\":
            nxt = body[i + 1 : i + 2]
            if nxt not in _ESCAPES:
                raise ExprError(f"unknown escape \\{nxt} in the string at {at}")
            out.append(_ESCAPES[nxt])
            i += 2
        else:
            out.append(ch)
            i += 1
    return "".join(out)


def _tokens(source: str) -> list[tuple[str, Any, int]]:
    tokens: list[tuple[str, Any, int]] = []
    pos = 0
    end = len(source.rstrip())
    while pos < end:
        match = _TOKEN.match(source, pos)
        if match is None or match.end() == pos:
            raise ExprError(f"unexpected character {source[pos:].lstrip()[:1]!r} at {pos}")
        kind = match.lastgroup
        assert kind is not None
        text = match.group(kind)
        at = match.start(kind)
        if kind == "number":
            value: Any = float(text) if any(c in text for c in ".eE") else int(text)
            tokens.append(("lit", value, at))
        elif kind == "string":
            tokens.append(("lit", _unquote(text, at), at))
        elif kind == "name" and text in ("true", "false", "null"):
            tokens.append(("lit", {"true": True, "false": False, "null": None}[text], at))
        else:
            tokens.append((kind if kind == "op" or text not in _KEYWORDS else "kw", text, at))
        pos = match.end()
    return tokens


class _Parser:
    def __init__(self, source: str) -> None:
        self.tokens = _tokens(source)
        self.i = 0
        self.nodes = 0
        self.depth = 0
        self.quantifiers = 0  # all/any around the current point: `it` is their item

    def _peek(self) -> tuple[str, Any, int] | None:
        return self.tokens[self.i] if self.i < len(self.tokens) else None

    def _is(self, kind: str, text: Any) -> bool:
        tok = self._peek()
        return tok is not None and tok[0] == kind and tok[1] == text

    def _take(self) -> tuple[str, Any, int]:
        tok = self._peek()
        if tok is None:
            raise ExprError("the condition ends too early")
        self.i += 1
        return tok

    def _expect(self, kind: str, text: str) -> None:
        tok = self._take()
        if tok[0] != kind or tok[1] != text:
            raise ExprError(f"expected {text!r} at {tok[2]}, found {tok[1]!r}")

    def _node(self, node: Any) -> Any:
        self.nodes += 1
        if self.nodes > MAX_NODES:
            raise ExprError(f"the condition has more than {MAX_NODES} parts")
        return node

    def _nested(self) -> None:
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise ExprError(f"the condition nests deeper than {MAX_DEPTH} levels")

    def parse(self) -> Any:
        node = self._or()
        tok = self._peek()
        if tok is not None:
            raise ExprError(f"unexpected {tok[1]!r} at {tok[2]}")
        return node

    def _chain(self, word: str, inner: Any) -> Any:
        self._nested()
        parts = [inner()]
        while self._is("kw", word):
            self.i += 1
            parts.append(inner())
        self.depth -= 1
        return parts[0] if len(parts) == 1 else self._node((word, tuple(parts)))

    def _or(self) -> Any:
        return self._chain("or", self._and)

    def _and(self) -> Any:
        return self._chain("and", self._not)

    def _not(self) -> Any:
        if self._is("kw", "not"):
            self.i += 1
            self._nested()
            node = self._node(("not", self._not()))
            self.depth -= 1
            return node
        return self._compare()

    def _compare(self) -> Any:
        left = self._operand()
        tok = self._peek()
        if tok is None:
            return left
        op = None
        if (tok[0] == "op" and tok[1] in _COMPARISONS) or (tok[0] == "kw" and tok[1] in _WORD_OPS):
            op = tok[1]
        elif tok[0] == "kw" and tok[1] == "not" and self._after_is("kw", "in"):
            self.i += 1
            op = "not in"
        if op is None:
            return left
        self.i += 1
        right = self._operand()
        return self._node(("cmp", op, left, right))

    def _after_is(self, kind: str, text: str) -> bool:
        nxt = self.tokens[self.i + 1] if self.i + 1 < len(self.tokens) else None
        return nxt is not None and nxt[0] == kind and nxt[1] == text

    def _operand(self) -> Any:
        kind, text, at = self._take()
        if kind == "lit":
            return self._node(("lit", text))
        if kind == "op" and text == "(":
            self._nested()
            node = self._or()
            self._expect("op", ")")
            self.depth -= 1
            return node
        if kind == "op" and text == "[":
            return self._list()
        if kind == "name" and self._is("op", "("):
            return self._call(text, at)
        if kind == "name":
            return self._path(text)
        raise ExprError(f"expected a value, a field or '(' at {at}, found {text!r}")

    def _list(self) -> Any:
        items: list[Any] = []
        while not self._is("op", "]"):
            if items:
                self._expect("op", ",")
            kind, value, at = self._take()
            if kind != "lit":
                raise ExprError(f"a list holds literals only: {value!r} at {at}")
            items.append(value)
            if len(items) > MAX_LIST:
                raise ExprError(f"a list has more than {MAX_LIST} items")
        self.i += 1
        return self._node(("list", tuple(items)))

    def _call(self, name: str, at: int) -> Any:
        quantifier = name in ("all", "any")
        if not quantifier and name not in FUNCTIONS:
            raise ExprError(f"unknown function {name!r} at {at}")
        self.i += 1  # "("
        self._nested()
        parts: list[Any] = []
        while not self._is("op", ")"):
            if parts:
                self._expect("op", ",")
            if quantifier and len(parts) == 1:
                self.quantifiers += 1
                parts.append(self._or())
                self.quantifiers -= 1
            else:
                parts.append(self._or())
        self.i += 1
        self.depth -= 1
        if quantifier:
            if len(parts) != 2:
                raise ExprError(f"{name}() at {at} takes a list and a condition over `it`")
            return self._node((name, parts[0], parts[1]))
        _, fewest, most = FUNCTIONS[name]
        if not fewest <= len(parts) <= most:
            counts = str(fewest) if fewest == most else f"{fewest} to {most}"
            raise ExprError(f"{name}() at {at} takes {counts} arguments")
        return self._node(("call", name, tuple(parts)))

    def _path(self, first: str) -> Any:
        keys: list[str | int] = [first]
        while True:
            if self._is("op", "."):
                self.i += 1
                kind, text, at = self._take()
                if kind not in ("name", "kw"):
                    raise ExprError(f"expected a field name after '.' at {at}")
                keys.append(text)
            elif self._is("op", "["):
                self.i += 1
                kind, key, at = self._take()
                if kind != "lit" or isinstance(key, bool) or not isinstance(key, (int, str)):
                    raise ExprError(f"expected an index or a quoted key at {at}")
                keys.append(key)
                self._expect("op", "]")
            else:
                break
            if len(keys) > MAX_DEPTH:
                raise ExprError(f"a field path is deeper than {MAX_DEPTH} levels")
        if first == "it" and self.quantifiers:
            return self._node(("item", tuple(keys[1:])))
        return self._node(("path", tuple(keys)))


def parse(source: str) -> Expr:
    """Parse a condition. Raises `ExprError` (a `ValueError`) with a message that says why."""
    if not isinstance(source, str):
        raise ExprError("a condition is a string")
    if len(source) > MAX_LENGTH:
        raise ExprError(f"the condition is longer than {MAX_LENGTH} characters")
    if not source.strip():
        raise ExprError("the condition is empty")
    node = _Parser(source).parse()
    return Expr(source, node, _compile(node))


def _lookup(value: Any, keys: tuple[str | int, ...]) -> Any:
    for key in keys:
        if isinstance(key, str) and isinstance(value, dict):
            value = value.get(key)
        elif isinstance(key, int) and isinstance(value, list) and -len(value) <= key < len(value):
            value = value[key]
        else:
            return None
    return value


Run = Callable[[Any, Any, Budget], Any]  # (args, the item of all/any, budget) -> value


def _compile(node: Any) -> Run:
    """The tree as nested closures, built once: evaluating one is a few calls per node,
    each node a step of the budget."""
    tag = node[0]
    if tag == "lit":
        value = node[1]
        return lambda args, it, budget: value
    if tag == "list":
        listed = list(node[1])  # a list literal is a list: `tags == ["prod"]` compares lists
        return lambda args, it, budget: listed
    if tag in ("path", "item"):
        keys = node[1]
        item = tag == "item"

        def lookup(args: Any, it: Any, budget: Budget) -> Any:
            budget.take()
            return _lookup(it if item else args, keys)

        return lookup
    if tag == "not":
        inner = _compile(node[1])
        return lambda args, it, budget: not truth(inner(args, it, budget), "the operand of not")
    if tag in ("and", "or"):
        return _logic(tag, tuple(_compile(part) for part in node[1]))
    if tag in ("all", "any"):
        return _quantifier(tag, _compile(node[1]), _compile(node[2]))
    if tag == "call":
        function = FUNCTIONS[node[1]][0]
        parts = tuple(_compile(part) for part in node[2])
        return lambda args, it, budget: function(budget, *(p(args, it, budget) for p in parts))
    op, left, right = node[1], _compile(node[2]), _compile(node[3])
    return lambda args, it, budget: compare(
        op, left(args, it, budget), right(args, it, budget), budget
    )


def _logic(tag: str, parts: tuple[Run, ...]) -> Run:
    what = f"an operand of {tag}"
    if tag == "and":

        def run_and(args: Any, it: Any, budget: Budget) -> bool:
            budget.take()
            return all(truth(part(args, it, budget), what) for part in parts)

        return run_and

    def run_or(args: Any, it: Any, budget: Budget) -> bool:
        budget.take()
        return any(truth(part(args, it, budget), what) for part in parts)

    return run_or


def _quantifier(tag: str, listed: Run, condition: Run) -> Run:
    what = f"the condition of {tag}()"

    def run(args: Any, it: Any, budget: Budget) -> bool:
        budget.take()
        values = listed(args, it, budget)
        if values is None:
            values = []
        if not isinstance(values, list):
            raise EvalError(f"{tag}() takes a list, not a {kind(values)}")
        checks = (truth(condition(args, item, budget), what) for item in items(values))
        return all(checks) if tag == "all" else any(checks)

    return run
