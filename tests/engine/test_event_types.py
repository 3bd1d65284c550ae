"""Every event type the server inserts is an `EventType` member, and the server's enums are
the SDK's wire enums (one spelling of each wire value).

The event check reads the source: each call that writes an event row (`insert_event`, and the
store operations that write one with their update) must name its type through `EventType`
(a member, a choice between members, or `EventType.compensation(...)` of `UndoState` members),
possibly through a local variable, or pass its own parameter on. A bare string or an
f-string there fails, naming the line.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

import undolog
from undolog.engine import model, saga, states
from undolog.ui import STATIC_DIR
from undolog_sdk import wire
from undolog_sdk.wire import EventType, UndoState

SRC = Path(undolog.__file__).parent

# Calls that write an event row, and where their event type is: (position, keyword, index in
# the tuple at that position or None).
EVENT_WRITERS: dict[str, list[tuple[int, str, int | None]]] = {
    "insert_event": [(1, "type_", None)],
    "insert_executing_effect": [(2, "event_type", None)],
    "Finish": [(6, "event_type", None)],  # the record `finish_effect` writes
    "execute_new": [(1, "replay", 1)],
}
_ENUMS = {"EventType": EventType, "UndoState": UndoState}


class NotAnEventType(Exception):
    pass


def _functions(tree: ast.AST) -> Iterator[ast.FunctionDef | ast.AsyncFunctionDef]:
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            yield node


def _members(node: ast.expr, scope: ast.FunctionDef | ast.AsyncFunctionDef) -> set[object]:
    """The enum members `node` can evaluate to; raises NotAnEventType for anything else."""
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
        enum_cls = _ENUMS.get(node.value.id)
        if enum_cls is not None and node.attr in enum_cls.__members__:
            return {enum_cls[node.attr]}
    if isinstance(node, ast.IfExp):
        return _members(node.body, scope) | _members(node.orelse, scope)
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and isinstance(node.func.value, ast.Name)
        and node.func.value.id == "EventType"
        and node.func.attr == "compensation"
        and len(node.args) == 1
    ):
        return {EventType.compensation(state) for state in _members(node.args[0], scope)}
    params = {a.arg for a in (*scope.args.args, *scope.args.kwonlyargs)}
    field_of_param = (
        isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Name)
        and node.value.id in params
    )
    if field_of_param:
        return set()  # a parameter's field (a `Finish`'s): where it was made is checked
    if isinstance(node, ast.Name):
        if node.id in params:
            return set()  # passed on: its callers are checked
        values: set[object] = set()
        assigned = False
        for statement in ast.walk(scope):
            if isinstance(statement, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == node.id for t in statement.targets
            ):
                assigned = True
                values |= _members(statement.value, scope)
        if assigned:
            return values
    raise NotAnEventType(ast.unparse(node))


def _written_event_types() -> Iterator[tuple[str, set[object] | str]]:
    """(where, the members written there) per event-writing call; a string where it is not
    made of EventType."""
    for path in sorted(SRC.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for function in _functions(tree):
            for call in ast.walk(function):
                if not isinstance(call, ast.Call):
                    continue
                if isinstance(call.func, ast.Attribute):
                    name = call.func.attr  # a store's or a query's method
                elif isinstance(call.func, ast.Name):
                    name = call.func.id  # a record
                else:
                    continue
                for position, keyword, index in EVENT_WRITERS.get(name, []):
                    args = {k.arg: k.value for k in call.keywords}
                    if keyword in args:
                        node: ast.expr | None = args[keyword]
                    elif 0 <= position < len(call.args):
                        node = call.args[position]
                    else:
                        node = None
                    if node is None:
                        continue
                    if index is not None:
                        if not isinstance(node, ast.Tuple):
                            continue  # a tuple passed on whole (the store's own wrappers)
                        node = node.elts[index]
                    where = f"{path.relative_to(SRC)}:{call.lineno}"
                    try:
                        yield where, _members(node, function)
                    except NotAnEventType as exc:
                        yield where, str(exc)


def test_every_event_the_server_writes_has_an_event_type_member_as_its_type() -> None:
    written = list(_written_event_types())
    bare = [f"{where}: {expr}" for where, expr in written if isinstance(expr, str)]
    assert not bare, "event types not spelled with EventType:\n" + "\n".join(bare)
    assert len(written) >= 20  # the walk finds the writers at all


def test_every_event_type_member_is_written_somewhere() -> None:
    """No member is dead: each is the type of some event the server writes."""
    used: set[object] = set()
    for _, members in _written_event_types():
        if not isinstance(members, str):
            used |= members
    assert set(EventType) - used == set()


def test_the_dashboard_listens_for_every_event_type() -> None:
    script = (STATIC_DIR / "live.js").read_text(encoding="utf-8")  # the live feed's module
    listed = script.split("const EVENT_TYPES = [", 1)[1].split("]", 1)[0]
    missing = [t.value for t in EventType if f'"{t.value}"' not in listed]
    assert not missing


@pytest.mark.parametrize(
    ("server", "sdk"),
    [
        (states.EffectState, wire.EffectState),
        (states.SessionState, wire.SessionState),
        (states.UndoState, wire.UndoState),
        (states.ApprovalStatus, wire.ApprovalStatus),
        (model.Outcome, wire.Outcome),
        (saga.RollbackStatus, wire.RollbackOutcome),
    ],
    ids=lambda e: f"{e.__module__}.{e.__name__}",
)
def test_the_server_enums_are_the_sdk_wire_enums(server: type, sdk: type) -> None:
    assert server is sdk
