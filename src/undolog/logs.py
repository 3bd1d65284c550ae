"""Structured logs: one JSON line per event, with request, org, session and effect ids.

API keys never reach a log line: the edge hashes them before lookup and nothing binds them.
The standard-library loggers (uvicorn's start-up, shutdown and error lines, and ours) are JSON
lines too, in the same shape (`event`, `level`, `timestamp`, plus `logger`), so a log
collector never meets a plain-text `INFO:` line; `uvicorn_log_config` is what every uvicorn
server of the process is given.
"""

from __future__ import annotations

import datetime
import logging
from typing import Any

import orjson
import structlog

__all__ = [
    "JsonFormatter",
    "LazyLog",
    "configure_logging",
    "internal_error_message",
    "uvicorn_log_config",
]


class JsonFormatter(logging.Formatter):
    """A standard-library log record as one JSON line (the traceback, if any, in `exception`)."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "event": record.getMessage(),
            "level": record.levelname.lower(),
            "timestamp": datetime.datetime.fromtimestamp(record.created, datetime.UTC).isoformat(),
            "logger": record.name,
        }
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return orjson.dumps(line, default=str).decode()


def uvicorn_log_config() -> dict[str, Any]:
    """A `logging.config.dictConfig` for uvicorn's loggers (and the root): JSON lines on
    stderr. uvicorn applies it, then sets its loggers' level from its own `log_level`."""
    handler = {"class": "logging.StreamHandler", "formatter": "json", "stream": "ext://sys.stderr"}
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {"json": {"()": JsonFormatter}},
        "handlers": {"json": handler},
        "loggers": {
            "uvicorn": {"handlers": ["json"], "level": "INFO", "propagate": False},
            "uvicorn.error": {"level": "INFO"},
            "uvicorn.access": {"handlers": ["json"], "level": "INFO", "propagate": False},
        },
        "root": {"handlers": ["json"], "level": "WARNING"},
    }


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


class LazyLog:
    """A logger bound to a call's context only when something is logged: most calls log
    nothing, and each structlog `bind` builds a logger and copies its context. Logs exactly
    what `log.bind(**context)` would."""

    __slots__ = ("_context", "_log")

    def __init__(self, log: Any, context: dict[str, Any]) -> None:
        self._log = log
        self._context = context

    def bind(self, **values: Any) -> LazyLog:
        return LazyLog(self._log, {**self._context, **values})

    def __getattr__(self, name: str) -> Any:  # a log method (warning, error, ...): bind now
        return getattr(self._log.bind(**self._context), name)
