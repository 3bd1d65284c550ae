"""The one spelling of a row (columns derived from the record dataclasses) and the explicit
placeholder numbering PostgreSQL gets from the shared `?` SQL."""

from __future__ import annotations

import dataclasses

import pytest

from undolog.store._columns import columns, numbered
from undolog.store.base import load_functions
from undolog.store.records import (
    ApprovalRecord,
    EffectRecord,
    EventRecord,
    KeyRecord,
    OrgRecord,
    SessionRecord,
    ToolRecord,
    UndoEntryRecord,
)

RECORDS = [
    ApprovalRecord,
    EffectRecord,
    EventRecord,
    KeyRecord,
    OrgRecord,
    SessionRecord,
    ToolRecord,
    UndoEntryRecord,
]


def test_effect_columns_follow_the_dataclass_with_json_fields_renamed() -> None:
    cols = columns(EffectRecord)
    assert cols.select() == (
        "effect_id, org_id, session_id, step_index, tool_name, tool_version, tier, "
        "call_signature, args, state, mode, attempts, result, error, lease_expires_us, "
        "executed_us, finished_us, created_us, updated_us"
    )
    assert cols.select("e").startswith("e.effect_id, e.org_id, ")
    assert cols.marks() == ", ".join(["?"] * 19)
    assert (
        cols.insert("effects") == f"INSERT INTO effects ({cols.select()}) VALUES ({cols.marks()})"
    )


@pytest.mark.parametrize("record", RECORDS, ids=lambda r: r.__name__)
def test_a_record_round_trips_through_its_row(record: type) -> None:
    fields = dataclasses.fields(record)
    values = [True if f.type == "bool" else f"v{i}" for i, f in enumerate(fields)]
    original = record(*values)
    cols = columns(record)
    assert len(cols.names) == len(fields)
    assert cols.row(cols.values(original)) == original


def test_boolean_columns_come_back_as_bools_from_sqlite_integers() -> None:
    org = columns(OrgRecord).row(("o", "name", 60, 1, 5, None))
    assert org.auto_approve_on_timeout is True
    tool = columns(ToolRecord).row(("o", "t", "safe", "1", None, 0, None, 5))
    assert tool.idempotent_upstream is False


def test_without_drops_a_column_from_the_list_and_the_values() -> None:
    undo = columns(UndoEntryRecord)
    fresh = undo.without("seq")
    assert "seq" not in fresh.names
    assert fresh.names == undo.names[1:]
    entry = UndoEntryRecord(7, "u", "o", "s", "e", "fn", "1", "{}", 3, 10, 1, "pending", 0, None, 1)
    assert fresh.values(entry) == undo.values(entry)[1:]
    with pytest.raises(ValueError, match="no such columns"):
        undo.without("nope")


def test_values_are_a_tuple_for_any_number_of_columns() -> None:
    org = columns(OrgRecord)
    record = OrgRecord("o", "name", 60, True, 5)
    names = org.names
    assert org.without(*names[1:]).values(record) == ("o",)
    assert org.without(*names[2:]).values(record) == ("o", "name")
    assert org.without(*names).values(record) == ()


def test_failure_paths_of_the_mapping() -> None:
    cols = columns(OrgRecord)
    with pytest.raises(ValueError, match="OrgRecord"):
        cols.row(("o", "name"))
    with pytest.raises(TypeError, match="expected OrgRecord"):
        cols.values(SessionRecord("o", "s", "active", 1, 1, 1))  # type: ignore[arg-type]


def test_columns_are_derived_once_per_type() -> None:
    assert columns(EffectRecord) is columns(EffectRecord)


@pytest.mark.parametrize(
    ("sql", "expected"),
    [
        ("SELECT 1", "SELECT 1"),
        ("a = ? AND b = ?", "a = $1 AND b = $2"),
        ("x IN (?, ?, ?) LIMIT ?", "x IN ($1, $2, $3) LIMIT $4"),
        ("a = '?' AND b = ?", "a = '?' AND b = $1"),
        ("a = 'it''s ?' AND b = ?", "a = 'it''s ?' AND b = $1"),
        ('SELECT "we?ird" FROM t WHERE a = ?', 'SELECT "we?ird" FROM t WHERE a = $1'),
        ("a = ? -- why?\nAND b = ?", "a = $1 -- why?\nAND b = $2"),
        ("a = ? /* ? */ AND b = ?", "a = $1 /* ? */ AND b = $2"),
        ("SELECT '$1'", "SELECT '$1'"),
    ],
)
def test_numbered_rewrites_only_real_placeholders(sql: str, expected: str) -> None:
    assert numbered(sql) == expected


@pytest.mark.parametrize(
    ("sql", "error"),
    [
        ("a = $1 AND b = ?", r"found \$"),
        ("a = 'open", "unterminated ' quote"),
        ('SELECT "open', 'unterminated " quote'),
        ("a = ? /* open", "unterminated comment"),
    ],
)
def test_numbered_refuses_what_it_cannot_number_safely(sql: str, error: str) -> None:
    with pytest.raises(ValueError, match=error):
        numbered(sql)


def test_the_new_call_functions_row_is_the_effect_record() -> None:
    """PostgreSQL's `undolog_execute_new` returns an outcome and an effect row; the store maps
    that row with `columns(EffectRecord)`, so the function's columns must be the record's."""
    functions = load_functions("postgres")
    definition = functions.split("FUNCTION undolog_execute_new(", 1)[1]
    returns = definition.split("RETURNS TABLE (", 1)[1].split(")", 1)[0]
    names = [line.split()[0] for line in returns.strip().splitlines()]
    assert names == ["outcome", *columns(EffectRecord).names]
