"""What the SDK needs from Python 3.11 that 3.10 lacks (the SDK supports 3.10)."""

from __future__ import annotations

__all__ = ["add_note"]


def add_note(exc: BaseException, note: str) -> None:
    """`exc.add_note(note)` where exceptions have notes (3.11+); on 3.10 the note is dropped:
    the exception itself is still the one raised."""
    adder = getattr(exc, "add_note", None)
    if adder is not None:
        adder(note)
