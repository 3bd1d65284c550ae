"""OpenTelemetry for the tracing tests: the SDK's in-memory exporter on the global provider,
and a real upstream tool server that records the `traceparent` each request brought.

The global tracer provider can be set once per process: `span_exporter()` sets it the first
time (an SDK `TracerProvider` with a `SimpleSpanProcessor`, so a span is exported as it ends)
and returns the same exporter after. It keeps spans only while a test holds the `traces`
fixture (the tests after it would fill memory otherwise). Tests pick their spans by trace id.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse
from starlette.routing import Route


class ArmedExporter(InMemorySpanExporter):
    """Keeps the spans it is given only while `armed`."""

    armed = False

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        if not self.armed:
            return SpanExportResult.SUCCESS
        return super().export(spans)


_lock = threading.Lock()
_exporter: ArmedExporter | None = None


def span_exporter() -> ArmedExporter:
    global _exporter
    with _lock:
        if _exporter is None:
            exporter = ArmedExporter()
            provider = TracerProvider()
            provider.add_span_processor(SimpleSpanProcessor(exporter))
            trace.set_tracer_provider(provider)
            current = trace.get_tracer_provider()
            if current is not provider:  # set before us: export from it too
                assert isinstance(current, TracerProvider), current
                current.add_span_processor(SimpleSpanProcessor(exporter))
            _exporter = exporter
        return _exporter


@pytest.fixture
def traces() -> Iterator[ArmedExporter]:
    """The exporter, keeping spans for this test; emptied and disarmed after it."""
    exporter = span_exporter()
    exporter.clear()
    exporter.armed = True
    try:
        yield exporter
    finally:
        exporter.armed = False
        exporter.clear()


def spans_of_trace(trace_id: int) -> list[ReadableSpan]:
    return [
        s
        for s in span_exporter().get_finished_spans()
        if s.context is not None and s.context.trace_id == trace_id
    ]


def recording_upstream() -> tuple[Starlette, list[dict[str, Any]]]:
    """A tool server (`POST /tools/{name}` answers a ToolResult echoing the args) that records
    each request's tool, Idempotency-Key and `traceparent`, and whether it had a `tracestate`."""
    seen: list[dict[str, Any]] = []

    async def tool(request: Request) -> JSONResponse:
        body = await request.json()
        seen.append(
            {
                "tool": request.path_params["name"],
                "idempotency_key": request.headers.get("idempotency-key"),
                "traceparent": request.headers.get("traceparent"),
                "tracestate": request.headers.get("tracestate"),
            }
        )
        return JSONResponse({"success": True, "output": body.get("args"), "error": None})

    async def health(_: Request) -> PlainTextResponse:
        return PlainTextResponse("ok")

    app = Starlette(
        routes=[
            Route("/tools/{name}", tool, methods=["POST"]),
            Route("/health", health, methods=["GET"]),
        ]
    )
    return app, seen


def chain_to(span: ReadableSpan | None, ancestor: int, trace_id: int) -> list[str] | None:
    """The names from `span` up to the span whose id is `ancestor`; None until all ended.

    A layer below UndoLog may open its own server span for the request (FastAPI's routes,
    the MCP SDK), which then sits between the caller's span and UndoLog's.
    """
    by_id = {s.context.span_id: s for s in spans_of_trace(trace_id) if s.context is not None}
    names = []
    while span is not None and span.parent is not None:
        names.append(span.name)
        if span.parent.span_id == ancestor:
            return names
        span = by_id.get(span.parent.span_id)
    return None
