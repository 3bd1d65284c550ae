"""OTLP export built in (`undolog.telemetry`): `undolog serve` with the standard
`OTEL_EXPORTER_OTLP_*` variables sends its spans to an OTLP/HTTP receiver the test runs, which
decodes each request as a collector would (`ExportTraceServiceRequest`, protobuf).

The server is a child process: a tracer provider is global, one per process. The batch
processor is told to wait ten minutes between exports, so the spans the receiver gets were
sent by the flush at stop. The export does not depend on the store: SQLite serves one process,
PostgreSQL two workers (each sets up its own export). docs/observability.md, "Exporting spans
over OTLP".
"""

from __future__ import annotations

import gzip
import os
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from opentelemetry import trace
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from tests.proxy.conftest import spawn_proxy, write_org_config
from tests.proxy.test_tracing import blocking
from tests.support.otel import recording_upstream, span_exporter
from tests.support.servers import ThreadServer, wait_until
from undolog.telemetry import start_span_export

CALLER_SPAN = 0x00F067AA0BA902B7
PROTOBUF = "application/x-protobuf"


@dataclass(frozen=True)
class ReceivedSpan:
    name: str
    trace_id: str
    span_id: str
    parent_span_id: str
    attributes: dict[str, Any]
    resource: dict[str, Any]


class OtlpReceiver:
    """A minimal OTLP/HTTP collector: `POST /v1/traces` (protobuf, gzip or not), kept decoded."""

    def __init__(self) -> None:
        self.spans: list[ReceivedSpan] = []
        self.requests = 0
        self._lock = threading.Lock()
        self.server = ThreadServer(
            Starlette(routes=[Route("/v1/traces", self._traces, methods=["POST"])])
        )

    @property
    def url(self) -> str:
        return self.server.url

    async def _traces(self, request: Request) -> Response:
        body = await request.body()
        if request.headers.get("content-encoding") == "gzip":
            body = gzip.decompress(body)
        if request.headers.get("content-type") != PROTOBUF:
            return Response(status_code=415)
        decoded = ExportTraceServiceRequest.FromString(body)
        spans = [
            ReceivedSpan(
                name=span.name,
                trace_id=span.trace_id.hex(),
                span_id=span.span_id.hex(),
                parent_span_id=span.parent_span_id.hex(),
                attributes=_values(span.attributes),
                resource=_values(resource_spans.resource.attributes),
            )
            for resource_spans in decoded.resource_spans
            for scope_spans in resource_spans.scope_spans
            for span in scope_spans.spans
        ]
        with self._lock:
            self.requests += 1
            self.spans.extend(spans)
        answer = ExportTraceServiceResponse().SerializeToString()
        return Response(answer, media_type=PROTOBUF)

    def of_trace(self, trace_id: int) -> list[ReceivedSpan]:
        with self._lock:
            return [s for s in self.spans if s.trace_id == f"{trace_id:032x}"]


def _values(attributes: Any) -> dict[str, Any]:
    """OTLP `KeyValue`s as a dict of plain values."""
    found = {}
    for kv in attributes:
        field = kv.value.WhichOneof("value")
        found[kv.key] = getattr(kv.value, field) if field else None
    return found


@pytest.fixture
def collector() -> Iterator[OtlpReceiver]:
    receiver = OtlpReceiver()
    receiver.server.start()
    try:
        yield receiver
    finally:
        receiver.server.stop()


@pytest.fixture
def tool_server() -> Iterator[ThreadServer]:
    app, _ = recording_upstream()
    server = ThreadServer(app).start()
    try:
        yield server
    finally:
        server.stop()


def _org(tmp_path: Path) -> tuple[Path, str]:
    org_id, key = f"org-{uuid.uuid4().hex[:8]}", "ul_test_" + uuid.uuid4().hex
    return write_org_config(tmp_path / "undolog.toml", org_id, key), key


def _call(base_url: str, key: str, traceparent: str | None = None) -> httpx.Response:
    headers = {"X-Api-Key": key} | ({"traceparent": traceparent} if traceparent else {})
    with httpx.Client(base_url=base_url, headers=headers, timeout=30) as c:
        spec = {"tier": "compensable", "compensation": {"fn_name": "unecho"}}
        c.put("/tools/echo", json=spec).raise_for_status()
        body = {"session_id": str(uuid.uuid4()), "tool_name": "echo", "step_index": 1,
                "args": {"n": 1}}  # fmt: skip
        return c.post("/mcp/tool_call", json=body)


@pytest.mark.slow
@pytest.mark.parametrize("deployment", ["sqlite", "postgres-2-workers"])
def test_serve_exports_a_calls_spans_over_otlp_http_and_flushes_them_at_stop(
    deployment: str,
    tmp_path: Path,
    collector: OtlpReceiver,
    tool_server: ThreadServer,
    request: pytest.FixtureRequest,
) -> None:
    config, key = _org(tmp_path)
    env = {"OTEL_BSP_SCHEDULE_DELAY": "600000"}  # no export before the stop's flush
    if deployment == "sqlite":
        store_url = f"sqlite:///{tmp_path / 'undolog.db'}"
        env["OTEL_EXPORTER_OTLP_ENDPOINT"] = collector.url  # the exporter adds /v1/traces
        service_name = "undolog"  # the default
    else:
        store_url = str(request.getfixturevalue("pg_url"))
        env |= {
            "UNDOLOG_WORKERS": "2",
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": f"{collector.url}/v1/traces",
            "OTEL_SERVICE_NAME": "undolog-eu",
        }
        service_name = "undolog-eu"
    trace_id = uuid.uuid4().int
    server = spawn_proxy(store_url, tool_server.url, config, **env)
    try:
        answer = _call(server.url, key, f"00-{trace_id:032x}-{CALLER_SPAN:016x}-01")
        assert answer.status_code == 200, answer.text
        assert collector.requests == 0  # batched, not sent yet
    finally:
        server.stop()

    wait_until(lambda: collector.of_trace(trace_id), timeout=10, what="the exported spans")
    spans = collector.of_trace(trace_id)
    [call] = [s for s in spans if s.name == "undolog.call"]
    assert call.parent_span_id == f"{CALLER_SPAN:016x}"
    assert call.attributes["undolog.status"] == "executed"
    assert call.attributes["undolog.tool"] == "echo"
    assert call.attributes["undolog.effect_id"] == answer.json()["effect_id"]
    children = [s.name for s in spans if s.parent_span_id == call.span_id]
    assert children == ["undolog.intercept", "undolog.upstream", "undolog.commit"]
    assert call.resource["service.name"] == service_name
    assert call.resource["service.version"]


@pytest.mark.slow
def test_serve_warns_and_runs_when_the_variables_are_set_without_the_exporter(
    tmp_path: Path, collector: OtlpReceiver, tool_server: ThreadServer
) -> None:
    """The `otel` extra's exporter not importable (a sitecustomize refuses it): one warning
    naming the variable and the extra at start; calls run; nothing is sent."""
    config, key = _org(tmp_path)
    log = tmp_path / "serve.log"
    server = spawn_proxy(
        f"sqlite:///{tmp_path / 'undolog.db'}",
        tool_server.url,
        config,
        log_path=log,
        OTEL_EXPORTER_OTLP_ENDPOINT=collector.url,
        OTEL_BSP_SCHEDULE_DELAY="10",
        PYTHONPATH=blocking(tmp_path, "opentelemetry.exporter"),
    )
    try:
        answer = _call(server.url, key)
    finally:
        server.stop()
    assert answer.status_code == 200, answer.text
    [warning] = [line for line in log.read_text().splitlines() if "otlp_export_unavailable" in line]
    assert "OTEL_EXPORTER_OTLP_ENDPOINT is set" in warning
    assert "undolog[server,otel]" in warning
    assert collector.requests == 0


@pytest.mark.parametrize(
    "env",
    [
        pytest.param({}, id="no-endpoint"),
        pytest.param({"OTEL_EXPORTER_OTLP_ENDPOINT": " "}, id="blank-endpoint"),
        pytest.param(
            {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9", "OTEL_SDK_DISABLED": "TRUE"},
            id="sdk-disabled",
        ),
        pytest.param(
            {
                "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://127.0.0.1:9",
                "OTEL_TRACES_EXPORTER": "none",
            },
            id="traces-exporter-none",
        ),
    ],
)
def test_nothing_is_set_up_unless_the_environment_asks_for_an_export(env: dict[str, str]) -> None:
    before = trace.get_tracer_provider()
    assert start_span_export(env) is None
    assert trace.get_tracer_provider() is before


def test_a_tracer_provider_set_before_is_left_as_it_is() -> None:
    """`opentelemetry-instrument` (or an app embedding the proxy) chose where spans go."""
    span_exporter()  # this process's provider: an SDK one, set once
    before = trace.get_tracer_provider()
    assert not isinstance(before, trace.ProxyTracerProvider)
    assert start_span_export({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9"}) is None
    assert trace.get_tracer_provider() is before


def test_the_flush_at_stop_gives_up_on_a_collector_that_does_not_answer() -> None:
    """The SDK's own flush takes the exporter's timeout per batch (four batches against a
    closed port: ~9 s with a 3 s timeout); `tracing.flush` waits its bound, then lets the
    process end. In a process of its own: a provider is set once per process."""
    probe = (
        "import time\n"
        "from opentelemetry import trace\n"
        "import undolog.services.tracing as t\n"
        "from undolog.telemetry import start_span_export\n"
        "assert start_span_export() is not None\n"
        "tracer = trace.get_tracer('probe')\n"
        "for _ in range(2000):\n"
        "    with tracer.start_as_current_span('s'):\n"
        "        pass\n"
        "started = time.monotonic()\n"
        "t.flush(timeout_seconds=0.5)\n"
        "print(round(time.monotonic() - started, 2))\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")} | {
        "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9",  # discard: nothing listens
        "OTEL_EXPORTER_OTLP_TIMEOUT": "3",
        "OTEL_BSP_SCHEDULE_DELAY": "600000",
    }
    done = subprocess.run(
        [sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=60,
        check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    waited = float(done.stdout.splitlines()[-1])
    assert waited < 5.0, waited  # the bound is 0.5 s; generous on a loaded machine
