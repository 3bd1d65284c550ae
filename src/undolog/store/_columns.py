"""One spelling of each row: column lists, values and row→record mapping from the dataclass.

A record's fields are its table's columns in order; a field named `*_json` is stored in the
column without the suffix (`args_json` → `args`). Everything the SQL needs about a row (its
column list, its `VALUES` marks, its values in order, how a fetched row becomes a record) is
derived here from `dataclasses.fields`, so adding a column means adding a field (and a
migration), nothing else.

Placeholders: the shared SQL is written with `?` (SQLite's style). `numbered` rewrites it for
PostgreSQL (`$1, $2, ...`) with a small scanner that knows SQL's quoting: a `?` inside a
string literal, a quoted identifier or a comment is left alone, and a `$` already in the text
is refused, so a statement can never mix the two styles.
"""

from __future__ import annotations

import dataclasses
import operator
from collections.abc import Callable, Sequence
from functools import lru_cache
from typing import Any, Generic, TypeVar, cast

__all__ = ["Columns", "columns", "numbered"]

R = TypeVar("R")

_JSON_SUFFIX = "_json"


def _column(field_name: str) -> str:
    if field_name.endswith(_JSON_SUFFIX):
        return field_name[: -len(_JSON_SUFFIX)]
    return field_name


@dataclasses.dataclass(frozen=True, slots=True)
class Columns(Generic[R]):
    """The columns of one record type, in field order."""

    record: type[R]
    names: tuple[str, ...]
    attrs: tuple[str, ...]  # the fields behind `names`, in the same order
    _bools: tuple[int, ...]
    # `attrs` read in one C call: built once per column set.
    _get: Callable[[Any], tuple[Any, ...]] = dataclasses.field(init=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_get", _getter(self.attrs))

    def select(self, alias: str = "") -> str:
        """`a, b, c` (or `x.a, x.b, x.c` with an alias), for SELECT and RETURNING."""
        return _joined(self.names, f"{alias}." if alias else "")

    def without(self, *names: str) -> Columns[R]:
        """These columns less some (e.g. a key the database assigns)."""
        missing = set(names) - set(self.names)
        if missing:
            raise ValueError(f"no such columns: {sorted(missing)}")
        kept = [(n, a) for n, a in zip(self.names, self.attrs, strict=True) if n not in names]
        return Columns(self.record, tuple(n for n, _ in kept), tuple(a for _, a in kept), ())

    def marks(self) -> str:
        """`?, ?, ?`: one placeholder per column."""
        return _joined(("?",) * len(self.names), "")

    def insert(self, table: str) -> str:
        """`INSERT INTO table (a, b) VALUES (?, ?)`."""
        return f"INSERT INTO {table} ({self.select()}) VALUES ({self.marks()})"

    def values(self, record: R) -> tuple[Any, ...]:
        """The record's values for these columns, in order."""
        if not isinstance(record, self.record):
            raise TypeError(f"expected {self.record.__name__}, got {type(record).__name__}")
        return self._get(record)

    def row(self, row: Sequence[Any]) -> R:
        """The record a fetched row (all the record's columns, in order) stands for."""
        if len(row) != len(self.names):
            raise ValueError(f"{self.record.__name__}: {len(row)} values for {len(self.names)}")
        if not self._bools:
            return self.record(*row)
        values = list(row)
        for i in self._bools:  # SQLite answers 0/1 for a boolean column
            values[i] = bool(values[i])
        return self.record(*values)


def _getter(attrs: tuple[str, ...]) -> Callable[[Any], tuple[Any, ...]]:
    """A function answering a record's `attrs` as a tuple (`operator.attrgetter` answers a
    bare value for a single name)."""
    if len(attrs) > 1:
        return operator.attrgetter(*attrs)
    if attrs:
        one = operator.attrgetter(attrs[0])
        return lambda record: (one(record),)
    return lambda record: ()


@lru_cache(maxsize=256)
def _joined(names: tuple[str, ...], prefix: str) -> str:
    """`prefix` + each name, comma-separated: built once per column set (the shared SQL
    spells its column lists on every statement)."""
    return ", ".join(prefix + name for name in names)


_CACHE: dict[type[Any], Columns[Any]] = {}


def columns(record: type[R]) -> Columns[R]:
    """The columns of a record dataclass (cached: derived once per type)."""
    found = _CACHE.get(record)
    if found is None:
        fields = dataclasses.fields(cast("Any", record))
        names = tuple(_column(f.name) for f in fields)
        bools = tuple(i for i, f in enumerate(fields) if f.type in ("bool", bool))
        found = _CACHE[record] = Columns(record, names, tuple(f.name for f in fields), bools)
    return cast("Columns[R]", found)


@lru_cache(maxsize=1024)
def numbered(sql: str) -> str:
    """`?` placeholders → `$1, $2, ...` (PostgreSQL), outside quotes and comments.

    Raises ValueError on a `$` outside quotes (a statement already numbered, or a dollar-quoted
    body: write those for one dialect, not in the shared SQL) and on unterminated quotes.
    """
    out: list[str] = []
    n = 0
    i, end = 0, len(sql)
    while i < end:
        ch = sql[i]
        if ch in ("'", '"'):
            close = sql.find(ch, i + 1)
            # A doubled quote ('it''s') is an escaped quote: keep scanning past it.
            while close != -1 and close + 1 < end and sql[close + 1] == ch:
                close = sql.find(ch, close + 2)
            if close == -1:
                raise ValueError(f"unterminated {ch} quote in SQL")
            out.append(sql[i : close + 1])
            i = close + 1
        elif sql.startswith("--", i):
            stop = sql.find("\n", i)
            stop = end if stop == -1 else stop
            out.append(sql[i:stop])
            i = stop
        elif sql.startswith("/*", i):
            stop = sql.find("*/", i + 2)
            if stop == -1:
                raise ValueError("unterminated comment in SQL")
            out.append(sql[i : stop + 2])
            i = stop + 2
        elif ch == "$":
            raise ValueError("shared SQL uses ? placeholders; found $")
        elif ch == "?":
            n += 1
            out.append(f"${n}")
            i += 1
        else:
            out.append(ch)
            i += 1
    return "".join(out)
