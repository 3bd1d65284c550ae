"""Structured logs: one JSON line per event, with request, org, session and effect ids.

API keys never reach a log line: the edge hashes them before lookup and nothing binds them.
"""

from __future__ import annotations

import logging

import structlog

__all__ = ["configure_logging", "internal_error_message"]


def configure_logging(level: str = "info") -> None:
    numeric = logging.getLevelName(level.upper())
    if not isinstance(numeric, int):
        numeric = logging.INFO
    structlog.configure(
        processors=[
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.JSONRenderer(),
        ],
        wrapper_class=structlog.make_filtering_bound_logger(numeric),
        cache_logger_on_first_use=True,
    )


def internal_error_message(request_id: str) -> str:
    """What a client is told about a bug, by any front end: a fixed text and the request id
    that finds the details in the log; never the exception, whose text may carry internals."""
    return f"internal error: the proxy logged the details under request id {request_id}"
