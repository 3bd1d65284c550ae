"""OTLP export of UndoLog's spans, set up by `undolog serve` from the standard `OTEL_*`
environment variables (docs/observability.md, "Exporting spans over OTLP").

When `OTEL_EXPORTER_OTLP_ENDPOINT` or `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` is set, each
serving process (the one process, or each worker of `--workers N`) gets an SDK
`TracerProvider` whose `BatchSpanProcessor` sends the spans of `undolog.services.tracing` to
that endpoint over OTLP/HTTP (protobuf). At stop the proxy's lifespan flushes the batch
(`undolog.services.tracing.flush`, bounded: a process stopped by a signal ends right after
it), and so does the end of serving otherwise. The exporter reads the other
`OTEL_EXPORTER_OTLP_*` variables itself (headers, timeout, compression, certificates) and the
SDK the `OTEL_BSP_*` and sampler ones.

Nothing is set up when `OTEL_SDK_DISABLED=true` or `OTEL_TRACES_EXPORTER=none`, nor when a
tracer provider is set already (`opentelemetry-instrument`, or an app embedding the proxy, has
chosen where spans go: UndoLog leaves it). Without the `otel` extra the server starts anyway
and says once, at start, that the variables are set but nothing can export them.

These are OpenTelemetry's own variables, read as its SDK reads them, so they are not UndoLog
settings (`undolog.config`).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator, Mapping

import structlog

import undolog
from undolog.services import tracing

__all__ = ["DEFAULT_SERVICE_NAME", "ENDPOINT_VARS", "exporting_spans", "start_span_export"]

DEFAULT_SERVICE_NAME = "undolog"
# Either one turns the export on (the traces one wins for spans, as the exporter reads them).
ENDPOINT_VARS = ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")
_INSTALL_HINT = "pip install 'undolog[server,otel]'"

_log = structlog.get_logger("undolog.telemetry")


def start_span_export(env: Mapping[str, str] | None = None) -> Callable[[], None] | None:
    """Set up the OTLP span export if the environment asks for it; returns what sends the
    spans still batched (call it at server stop), or None when nothing was set up."""
    env = os.environ if env is None else env
    named = [name for name in ENDPOINT_VARS if env.get(name, "").strip()]
    if not named:
        return None
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return None
    if env.get("OTEL_TRACES_EXPORTER", "").strip().lower() == "none":
        return None
    try:
        from opentelemetry import trace
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import (
            SERVICE_NAME,
            SERVICE_VERSION,
            OTELResourceDetector,
            Resource,
        )
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError:
        _log.warning(
            "otlp_export_unavailable",
            message=f"{named[0]} is set but the OTLP exporter is not installed "
            f"({_INSTALL_HINT}): spans are not exported",
        )
        return None
    if not isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider):
        # opentelemetry-instrument, or the app's embedder, set one: it decides where spans go.
        _log.info("otlp_export_left_to_existing_provider")
        return None
    from_env = OTELResourceDetector().detect().attributes  # OTEL_SERVICE_NAME, _RESOURCE_ATTRIBUTES
    defaults = {SERVICE_NAME: DEFAULT_SERVICE_NAME, SERVICE_VERSION: undolog.__version__}
    resource = Resource.create({k: v for k, v in defaults.items() if k not in from_env})
    # Not shut down at exit: its export thread is a daemon, and a shutdown would wait for
    # every batch against a collector that does not answer; `tracing.flush` is bounded.
    provider = TracerProvider(resource=resource, shutdown_on_exit=False)
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    trace.set_tracer_provider(provider)
    if trace.get_tracer_provider() is not provider:  # set by another thread meanwhile
        provider.shutdown()
        return None
    _log.info("otlp_export_started", service_name=resource.attributes.get(SERVICE_NAME))
    return tracing.flush


@contextlib.contextmanager
def exporting_spans(env: Mapping[str, str] | None = None) -> Iterator[None]:
    """`start_span_export` for the body's duration, the spans still batched sent when it ends
    without a signal (on SIGTERM/SIGINT the proxy's lifespan has sent them: the process ends
    with the signal before this runs)."""
    stop = start_span_export(env)
    try:
        yield
    finally:
        if stop is not None:
            stop()
