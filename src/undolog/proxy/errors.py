"""The REST front end's one exception mapping: every route raises, this answers.

An `UndoLogError` becomes the reference's error body (its code, message, fields and status,
`Retry-After` when it has one), except a `Database` error: its text is the driver's (addresses,
"connection_lost()"...), so the client gets `503 database_error` with a fixed message, the
request id and `Retry-After: 1`, and the log gets the text. Anything else is a bug: the
client gets a fixed message with the request id, never the exception's text; the traceback
goes to the log under that id. The FastAPI app registers `answer_error` for both; the edge's
fast routes (`POST /mcp/tool_call`) call it themselves, since they bypass FastAPI.
"""

from __future__ import annotations

import structlog
from starlette.requests import Request
from starlette.responses import Response

from undolog.proxy.wire import error_body, error_response, internal_error_message, json_response
from undolog_sdk.errors import Database, UndoLogError

__all__ = ["STORE_DOWN_RETRY_AFTER", "answer_error", "error_handler", "store_down_message"]

STORE_DOWN_RETRY_AFTER = 1  # seconds: a store outage is retried soon (the error is retryable)

_log = structlog.get_logger("undolog.proxy")


def answer_error(request_id: str, exc: BaseException, path: str) -> Response:
    """The response for an exception a route raised."""
    if isinstance(exc, Database):
        _log.warning("store_unavailable", request_id=request_id, path=path, error=exc.message)
        retry = STORE_DOWN_RETRY_AFTER
        return json_response(
            error_body(request_id, exc.code, store_down_message(request_id), retry_after=retry),
            exc.http_status,
            {"Retry-After": str(retry)},
        )
    if isinstance(exc, UndoLogError):
        return error_response(request_id, exc)
    # A bug: the details go to the log; the client gets the request id to find them.
    _log.error("unhandled_error", request_id=request_id, path=path, exc_info=exc)
    return json_response(
        error_body(request_id, "internal_error", internal_error_message(request_id)), 500
    )


async def error_handler(request: Request, exc: Exception) -> Response:
    """`answer_error` as a FastAPI/Starlette exception handler."""
    return answer_error(request.state.request_id, exc, request.url.path)


def store_down_message(request_id: str) -> str:
    """What a client is told when the store cannot be reached: no database text."""
    return f"The store is unavailable right now; retry shortly (request id {request_id})."
