"""OpenTelemetry spans for calls and rollbacks, when the `otel` extra is installed
(docs/observability.md, "Traces").

Without `opentelemetry-api` every function here does nothing, so the server runs without it.
With it, spans go to the global tracer provider: none is configured here (an app that sets one
up, or `opentelemetry-instrument`, decides where they go); until one is, no span is made, and
the caller's trace context passes through to the upstream as it came.

What is traced: a call (`undolog.call`, with `undolog.intercept`, `undolog.upstream` and
`undolog.commit` — or `undolog.fail` / `undolog.mark_in_doubt` — as its children) and a
rollback (`undolog.rollback`, with one `undolog.compensation` per undo entry it runs, each
with its `undolog.upstream`). The caller's W3C `traceparent` (REST: the header; MCP: the
header or `_meta["traceparent"]`) is the parent of the call's span (through the MCP SDK's own
server span, when it opened one), and the upstream's request
carries a `traceparent` naming the `undolog.upstream` span. Only `traceparent` is taken from
the caller — not `tracestate` nor baggage, which would carry client text to the upstream — and
a malformed one is ignored (the call starts a new trace).
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator, MutableMapping
from contextlib import AbstractContextManager
from typing import Any

try:
    from opentelemetry import context as otel_context
    from opentelemetry import trace
    from opentelemetry.environment_variables import OTEL_PYTHON_TRACER_PROVIDER
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
except ImportError:  # the `otel` extra is not installed: tracing is off
    HAVE_OTEL = False
else:
    HAVE_OTEL = True
    _PROPAGATOR = TraceContextTextMapPropagator()

__all__ = [
    "HAVE_OTEL",
    "TRACEPARENT",
    "annotate",
    "caller_context",
    "flush",
    "inject",
    "span",
    "traceparent_of",
]

TRACEPARENT = "traceparent"
TRACER_NAME = "undolog"
# A W3C traceparent is 55 characters (version 00); anything much longer is not one.
_MAX_TRACEPARENT = 128
# The longest a server's stop waits for its last spans to be sent (a collector that does not
# answer delays the stop by this much, at most).
FLUSH_SECONDS = 10.0
# What a span or a caller's context is when there is nothing to record (shared: it holds
# no state).
_NOTHING: AbstractContextManager[Any] = contextlib.nullcontext()
# A tracer provider named in the environment is loaded by OpenTelemetry on first use.
_PROVIDER_IN_ENV = HAVE_OTEL and OTEL_PYTHON_TRACER_PROVIDER in os.environ
_UNKNOWN = object()


def _off() -> bool:
    """Whether a span would record nothing: no OpenTelemetry, or no tracer provider set.

    Asked for every span (four a call), so the usual answer is cheap. OpenTelemetry's own
    `get_tracer_provider` reads `os.environ` on each call until a provider is set (~4% of the
    proxy's CPU on the bench); its global says the same when no provider is set and none is
    named in the environment. Should that global go in a later release, the public call
    answers."""
    if not HAVE_OTEL:
        return True
    if getattr(trace, "_TRACER_PROVIDER", _UNKNOWN) is None and not _PROVIDER_IN_ENV:
        return True
    return isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider)


def traceparent_of(value: object) -> str | None:
    """A candidate traceparent from client input: a short string, else None."""
    if isinstance(value, str) and 0 < len(value) <= _MAX_TRACEPARENT:
        return value
    return None


def caller_context(traceparent: str | None) -> AbstractContextManager[Any]:
    """Spans started inside are children of the caller's span named by `traceparent`.

    Unless a span is current already: a server span that a layer below opened from the same
    request (the MCP SDK opens one per request, from the same header or `_meta`) is the
    better parent, and it is a child of the caller's span itself.
    """
    if not HAVE_OTEL or traceparent is None or trace.get_current_span().get_span_context().is_valid:
        return _NOTHING
    return _attached(traceparent)


@contextlib.contextmanager
def _attached(traceparent: str) -> Iterator[None]:
    parent = _PROPAGATOR.extract({TRACEPARENT: traceparent})
    token = otel_context.attach(parent)
    try:
        yield
    finally:
        otel_context.detach(token)


def span(name: str, **attributes: Any) -> AbstractContextManager[Any]:
    """A span named `name` (a child of the current one); None when tracing is off: no
    OpenTelemetry, or no tracer provider set (a span would record nothing; the four of a
    call cost ~0.06 ms of CPU on the bench machine, and next to nothing when skipped here)."""
    if _off():
        return _NOTHING
    return _recording(name, attributes)


@contextlib.contextmanager
def _recording(name: str, attributes: dict[str, Any]) -> Iterator[Any]:
    tracer = trace.get_tracer(TRACER_NAME)
    with tracer.start_as_current_span(name, attributes=_attributes(attributes)) as current:
        yield current


def annotate(current: Any, **attributes: Any) -> None:
    """Add attributes to a span from `span` (nothing when tracing is off)."""
    if current is not None:
        current.set_attributes(_attributes(attributes))


def inject(headers: MutableMapping[str, str]) -> None:
    """Put the current span's `traceparent` into an outgoing request's headers."""
    if HAVE_OTEL:
        _PROPAGATOR.inject(headers)


def _attributes(values: dict[str, Any]) -> dict[str, Any]:
    """`undolog.`-prefixed attributes; None values left out."""
    return {f"undolog.{k}": v for k, v in values.items() if v is not None}


def flush(timeout_seconds: float = FLUSH_SECONDS) -> None:
    """Send the spans the tracer provider still batches, if it batches (an SDK provider with
    a `BatchSpanProcessor`, as `undolog.telemetry` sets up); waits `timeout_seconds` at most.

    Called as the proxy's lifespan ends: uvicorn ends a process stopped by a signal by raising
    the signal again once the app has shut down, so no exit hook after it would run. The SDK's
    own flush takes the exporter's timeout per batch against a collector that does not answer,
    so it runs in a daemon thread that is given up on, not waited for, after the bound."""
    if _off():
        return
    force_flush = getattr(trace.get_tracer_provider(), "force_flush", None)
    if force_flush is not None:
        flushing = threading.Thread(target=force_flush, name="undolog-span-flush", daemon=True)
        flushing.start()
        flushing.join(timeout_seconds)
