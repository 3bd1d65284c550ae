"""Query parameters of the paged lists, and their cursors (docs/dashboard.md).

A list answers a JSON array, as before; when there is more, the header `X-UndoLog-Next-Cursor`
carries an opaque cursor: pass it as `cursor=` (with the same filters) for the next page. The
cursor is a position only, the last row's (sort value, id): the org, the caller's own sessions
and the filters always come from the key and the query, so a forged cursor can move within
what the caller may see, never beyond it. A bad parameter is a 400 `invalid_request` saying
which and why.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping

import orjson
from starlette.datastructures import QueryParams

from undolog.engine.pages import MAX_RECENT_CALLS, Keyset
from undolog.proxy.inputs import MAX_EVENT_ID
from undolog_sdk.errors import InvalidRequest
from undolog_sdk.wire import unstorable

__all__ = [
    "APPROVALS",
    "NEXT_CURSOR_HEADER",
    "SESSIONS",
    "decode_cursor",
    "encode_cursor",
    "next_headers",
    "number",
    "recent_calls",
    "text",
]

NEXT_CURSOR_HEADER = "X-UndoLog-Next-Cursor"
SESSIONS, APPROVALS = "s", "a"  # which list a cursor belongs to
MAX_TEXT = 200  # search text, tool names
_MAX_CURSOR = 400
_MAX_ID = 200


def encode_cursor(kind: str, after: Keyset) -> str:
    raw = orjson.dumps([kind, after[0], after[1]])
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")


def decode_cursor(kind: str, cursor: str | None) -> Keyset | None:
    """The keyset a cursor of list `kind` stands for (None: no cursor, the first page).

    Raises:
        InvalidRequest: anything this list did not hand out.
    """
    if cursor is None or cursor == "":
        return None
    problem = InvalidRequest(
        "cursor is not one this list handed out: pass the X-UndoLog-Next-Cursor value "
        "unchanged, or leave it out for the first page"
    )
    if len(cursor) > _MAX_CURSOR or not cursor.isascii():
        raise problem
    try:
        data = orjson.loads(base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)))
    except (binascii.Error, ValueError):
        raise problem from None
    if not (isinstance(data, list) and len(data) == 3 and data[0] == kind):
        raise problem
    _, value, id_ = data
    if type(value) is not int or not 0 <= value <= MAX_EVENT_ID:
        raise problem
    if not isinstance(id_, str) or len(id_) > _MAX_ID or unstorable(id_):
        raise problem
    return value, id_


def next_headers(kind: str, after: Keyset | None) -> Mapping[str, str] | None:
    """The header that leads to the next page, if there is one (`Page.after`)."""
    if after is None:
        return None
    return {NEXT_CURSOR_HEADER: encode_cursor(kind, after)}


def text(params: QueryParams, name: str) -> str | None:
    """A text filter: up to 200 characters a store can hold (empty: no filter)."""
    value = params.get(name)
    if value is None or not value.strip():
        return None
    if len(value) > MAX_TEXT:
        raise InvalidRequest(f"{name} must be at most {MAX_TEXT} characters")
    if unstorable(value):
        raise InvalidRequest(f"{name} must not contain NUL characters or lone surrogates")
    return value.strip()


def number(params: QueryParams, name: str, default: int, low: int, high: int) -> int:
    """A whole number from `low` to `high` (absent: `default`).

    Raises:
        InvalidRequest: anything else.
    """
    raw = params.get(name)
    if raw is None:
        return default
    if not (raw.isascii() and raw.isdigit() and len(raw) <= 6) or not low <= int(raw) <= high:
        raise InvalidRequest(f"{name} must be a whole number from {low} to {high}")
    return int(raw)


def recent_calls(params: QueryParams) -> int:
    """How many of each session's latest calls to include (`recent_calls`, 0 to 20)."""
    return number(params, "recent_calls", 0, 0, MAX_RECENT_CALLS)
