"""The policy rules' condition language: a tiny, bounded expression language over a call's args.

A condition is parsed once (when rules are saved or loaded) into a tree of frozen nodes, then
evaluated against each call's arguments. There is no `eval`, no attribute access, no function
call and no loop: what an expression can cost is bounded by its size, and its size is bounded
when it is parsed (`MAX_LENGTH` characters, `MAX_NODES` nodes, `MAX_DEPTH` nesting). The
grammar and the semantics are documented in docs/approvals.md ("The condition language").

    expr    := or
    or      := and ("or" and)*
    and     := not ("and" not)*
    not     := "not" not | compare
    compare := operand [op operand]
    op      := == | != | < | <= | > | >= | in | not in | startswith | endswith | contains
    operand := literal | path | "(" expr ")" | "[" literal, ... "]"
    path    := name ("." name | "[" integer | string "]")*

A missing field is null. A comparison between values of different kinds (a number and a
string, a missing field and a number) is false, never an error, so a condition over a field a
call does not send simply does not match.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

__all__ = ["MAX_DEPTH", "MAX_LENGTH", "MAX_NODES", "Expr", "ExprError", "parse"]

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
    run: Callable[[Any], Any] = field(compare=False, repr=False)

    def holds(self, args: Any) -> bool:
        return self.run(args) is True


# Nodes: ("lit", value) ("path", (key, ...)) ("list", (value, ...)) ("not", node)
# ("and" | "or", (node, ...)) ("cmp", op, left, right)


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


def _lookup(args: Any, keys: tuple[str | int, ...]) -> Any:
    value = args
    for key in keys:
        if isinstance(key, str) and isinstance(value, dict):
            value = value.get(key)
        elif isinstance(key, int) and isinstance(value, list) and -len(value) <= key < len(value):
            value = value[key]
        else:
            return None
    return value


def _kind(value: Any) -> str:
    if value is None or isinstance(value, bool):
        return type(value).__name__
    if isinstance(value, (int, float)):
        return "number"
    return type(value).__name__


def _compare(op: str, left: Any, right: Any) -> bool:
    if op in ("in", "not in"):
        if not isinstance(right, (list, tuple, str)):
            return False
        if isinstance(right, str):
            found = isinstance(left, str) and left in right
        else:
            found = any(_kind(left) == _kind(item) and left == item for item in right)
        return found if op == "in" else not found
    if op in ("startswith", "endswith", "contains"):
        if not isinstance(left, str) or not isinstance(right, str):
            return op == "contains" and isinstance(left, list) and right in left
        if op == "startswith":
            return left.startswith(right)
        return left.endswith(right) if op == "endswith" else right in left
    same = _kind(left) == _kind(right)
    if op == "==":
        return same and left == right
    if op == "!=":
        return not (same and left == right)
    if not same or _kind(left) not in ("number", "str"):
        return False
    if op == "<":
        return bool(left < right)
    if op == "<=":
        return bool(left <= right)
    if op == ">":
        return bool(left > right)
    return bool(left >= right)


def _compile(node: Any) -> Callable[[Any], Any]:
    """The tree as nested closures, built once: evaluating one is a few calls per node."""
    tag = node[0]
    if tag in ("lit", "list"):
        value = node[1]
        return lambda args: value
    if tag == "path":
        keys = node[1]
        if len(keys) == 1 and isinstance(keys[0], str):
            key = keys[0]
            return lambda args: args.get(key) if isinstance(args, dict) else None
        return lambda args: _lookup(args, keys)
    if tag == "not":
        inner = _compile(node[1])
        return lambda args: inner(args) is not True
    if tag in ("and", "or"):
        parts = tuple(_compile(part) for part in node[1])
        if tag == "and":
            return lambda args: all(part(args) is True for part in parts)
        return lambda args: any(part(args) is True for part in parts)
    op, left, right = node[1], _compile(node[2]), _compile(node[3])
    return lambda args: _compare(op, left(args), right(args))
