"""`select_entries`, the pure rule of a selective undo: which entries a request names and
which later calls may depend on them (docs/undo.md)."""

from __future__ import annotations

import dataclasses

import pytest

from tests.engine.test_saga import effect, entry
from undolog.engine.selective import select_entries
from undolog_sdk.errors import InvalidRequest, NotFound

# Steps 1..4, one undo entry each (newest first, as the store lists a stack).
STACK = [entry(4), entry(3), entry(2), entry(1)]
EFFECTS = [effect(1), effect(2), effect(3), effect(4)]


def test_one_entry_lists_every_later_committed_call_as_a_dependent() -> None:
    chosen = select_entries(STACK, EFFECTS, entries=["entry-2"])
    assert chosen.entry_ids == {"entry-2"}
    assert [e.effect_id for e in chosen.dependents] == ["effect-3", "effect-4"]


def test_the_newest_entry_has_no_dependents() -> None:
    assert select_entries(STACK, EFFECTS, entries=["entry-4"]).dependents == ()


def test_after_a_step_takes_every_later_entry_and_leaves_no_dependent_among_them() -> None:
    chosen = select_entries(STACK, EFFECTS, after_step=2)
    assert chosen.entry_ids == {"entry-3", "entry-4"}
    assert chosen.dependents == ()


def test_after_the_last_step_takes_nothing() -> None:
    assert select_entries(STACK, EFFECTS, after_step=4).entry_ids == frozenset()


@pytest.mark.parametrize(
    ("state", "tier", "depends"),
    [
        ("committed", "compensable", True),
        ("committed", "irreversible", True),
        ("in_doubt", "compensable", True),
        ("executing", "compensable", True),
        ("compensation_failed", "compensable", True),
        ("committed", "safe", False),  # a read relies on nothing staying done
        ("failed", "compensable", False),
        ("rejected", "irreversible", False),
        ("awaiting_approval", "irreversible", False),
        ("compensated", "compensable", False),
    ],
)
def test_a_later_call_is_a_dependent_when_its_effect_is_or_may_be_in_place(
    state: str, tier: str, depends: bool
) -> None:
    later = dataclasses.replace(effect(5), state=state, tier=tier)
    chosen = select_entries(STACK, [*EFFECTS, later], after_step=3)
    assert ([e.effect_id for e in chosen.dependents] == ["effect-5"]) is depends


@pytest.mark.parametrize(
    ("entries", "after_step", "error"),
    [
        (None, None, InvalidRequest),
        (["entry-1"], 1, InvalidRequest),
        ([], None, InvalidRequest),
        (["entry-1"] * 101, None, InvalidRequest),
        (["entry-9"], None, NotFound),
    ],
)
def test_a_bad_selection_is_refused(
    entries: list[str] | None, after_step: int | None, error: type[Exception]
) -> None:
    with pytest.raises(error):
        select_entries(STACK, EFFECTS, entries=entries, after_step=after_step)
