"""Checks on client input that every store can hold, so bad input is a clear 400.

PostgreSQL `TEXT` refuses the NUL character and `BIGINT` stops at 2**63 - 1; SQLite takes
both. A value that reached the store unchecked came back as a 503 carrying the database's
own message on one store and worked on the other. These checks run at the edge of the API,
one rule for every route, so both stores see the same input and a caller sees what is wrong
with it, never the driver's text. The text rule itself (`unstorable`, `scrub`) is the one the
SDK and the engine use too, in `undolog_sdk.wire`.
"""

from __future__ import annotations

import re

from undolog_sdk.errors import InvalidRequest
from undolog_sdk.wire import scrub, unstorable

__all__ = ["MAX_EVENT_ID", "event_id", "path_problem", "scrubbed", "storable"]

MAX_EVENT_ID = 2**63 - 1  # a BIGINT (BIGSERIAL / SQLite INTEGER) event id
_ASCII_DIGITS = re.compile(r"[0-9]{1,19}")  # str.isdigit() also takes '²' and '٣'


def storable(text: str, field: str) -> str:
    """`text` unchanged if every store can hold it.

    Raises:
        InvalidRequest: it holds a NUL character or a lone surrogate.
    """
    if unstorable(text):
        raise InvalidRequest(f"{field} must not contain NUL characters or lone surrogates")
    return text


# `text` made storable, for failure reports from runners (the SDK's rule, under the name the
# routes use).
scrubbed = scrub


def path_problem(path: str) -> str | None:
    """Why no route can take this (decoded) path, or None: every id in a path ends up in a
    store query, so a NUL there is refused once, here, for every route."""
    if unstorable(path):
        return "the path must not contain NUL characters (%00) or lone surrogates"
    return None


def event_id(raw: str | None) -> int | None:
    """An event id given by a client (`Last-Event-ID`), or None when none was given.

    Raises:
        InvalidRequest: not a decimal number from 0 to 2**63 - 1 in ASCII digits.
    """
    if raw is None or raw == "":
        return None
    if _ASCII_DIGITS.fullmatch(raw) is None or int(raw) > MAX_EVENT_ID:
        raise InvalidRequest(
            f"Last-Event-ID must be an event id: a whole number from 0 to {MAX_EVENT_ID}"
        )
    return int(raw)
