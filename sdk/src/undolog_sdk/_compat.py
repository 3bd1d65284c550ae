"""What the SDK needs on Python 3.10 that 3.11 has built in."""

from __future__ import annotations

__all__ = ["add_note"]


def add_note(exc: BaseException, note: str) -> None:
    """`exc.add_note(note)`, also on Python 3.10 (which the SDK supports), where the note is
    kept in `__notes__` as 3.11 keeps it, though tracebacks do not show it there."""
    adder = getattr(exc, "add_note", None)
    if adder is not None:
        adder(note)
    else:  # Python 3.10
        notes = getattr(exc, "__notes__", None)
        if not isinstance(notes, list):
            notes = []
            setattr(exc, "__notes__", notes)  # noqa: B010 - not a declared attribute on 3.10
        notes.append(note)
