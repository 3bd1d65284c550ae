"""OpenTelemetry spans of a call and of a rollback, through a real proxy, on both stores.

The proxy runs in a thread of the test process, so the SDK's in-memory exporter on the global
tracer provider sees its spans (tests/support/otel.py). The upstream is a real tool server that
records the `traceparent` each request brought. A server without the `otel` extra is a child
process whose imports of `opentelemetry` fail (docs/observability.md, "Traces").
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from opentelemetry.sdk.trace import ReadableSpan

from tests.proxy.conftest import ProxyHarness, spawn_proxy, write_org_config
from tests.support.otel import (  # noqa: F401 (traces: a fixture)
    chain_to,
    recording_upstream,
    span_exporter,
    spans_of_trace,
    traces,
)
from tests.support.servers import ThreadServer, wait_until

pytestmark = pytest.mark.usefixtures("traces")  # keep the spans of each test

TOOL_CALL = "/mcp/tool_call"
CALLER_SPAN = 0x00F067AA0BA902B7


def caller() -> tuple[int, str]:
    """A fresh trace id (spans of every test share the exporter) and its `traceparent`."""
    trace_id = uuid.uuid4().int
    return trace_id, f"00-{trace_id:032x}-{CALLER_SPAN:016x}-01"


@pytest.fixture
def recorder() -> Iterator[tuple[ThreadServer, list[dict[str, Any]]]]:
    app, seen = recording_upstream()
    server = ThreadServer(app).start()
    try:
        yield server, seen
    finally:
        server.stop()


@pytest.fixture
def traced(proxy_factory: Any, recorder: tuple[ThreadServer, list[dict[str, Any]]]) -> ProxyHarness:
    """A proxy in front of the recording upstream, with `echo` compensated by `unecho`."""
    proxy: ProxyHarness = proxy_factory(upstream_url=recorder[0].url)
    with proxy.client() as c:
        spec = {"tier": "compensable", "compensation": {"fn_name": "unecho", "max_retries": 0}}
        c.put("/tools/echo", json=spec).raise_for_status()
    return proxy


def echo(c: httpx.Client, session: str, step: int = 1, **headers: str) -> httpx.Response:
    body = {"session_id": session, "tool_name": "echo", "step_index": step, "args": {"n": step}}
    return c.post(TOOL_CALL, json=body, headers=headers)


def named(spans: list[ReadableSpan], name: str) -> list[ReadableSpan]:
    return [s for s in spans if s.name == name]


def one(spans: list[ReadableSpan], name: str) -> ReadableSpan:
    [found] = named(spans, name)
    return found


def parent_id(span: ReadableSpan) -> int | None:
    return span.parent.span_id if span.parent is not None else None


def span_id(span: ReadableSpan) -> int:
    assert span.context is not None
    return span.context.span_id


def sent_traceparent(span: ReadableSpan) -> str:
    """What the upstream must have received for a request made inside `span`."""
    assert span.context is not None
    ctx = span.context
    return f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{int(ctx.trace_flags):02x}"


def test_a_call_is_a_span_under_the_callers_trace_with_intercept_upstream_and_commit(
    traced: ProxyHarness, recorder: tuple[ThreadServer, list[dict[str, Any]]]
) -> None:
    session = str(uuid.uuid4())
    trace_id, traceparent = caller()
    with traced.client() as c:
        answer = echo(c, session, traceparent=traceparent)
    assert answer.status_code == 200, answer.text
    effect_id = answer.json()["effect_id"]

    wait_until(lambda: named(spans_of_trace(trace_id), "undolog.call"), what="the call span")
    spans = spans_of_trace(trace_id)
    call = one(spans, "undolog.call")
    assert parent_id(call) == CALLER_SPAN
    assert call.attributes is not None
    assert call.attributes["undolog.status"] == "executed"
    assert call.attributes["undolog.effect_id"] == effect_id
    assert call.attributes["undolog.tool"] == "echo"
    children = [s.name for s in spans if parent_id(s) == span_id(call)]
    assert children == ["undolog.intercept", "undolog.upstream", "undolog.commit"]
    upstream = one(spans, "undolog.upstream")
    [request] = [r for r in recorder[1] if r["idempotency_key"] == effect_id]
    assert request["traceparent"] == sent_traceparent(upstream)


def test_a_replay_has_a_call_span_and_no_upstream(traced: ProxyHarness) -> None:
    session = str(uuid.uuid4())
    trace_id, traceparent = caller()
    with traced.client() as c:
        assert echo(c, session).status_code == 200
        again = echo(c, session, traceparent=traceparent)
    assert again.json()["status"] == "replayed"
    wait_until(lambda: spans_of_trace(trace_id), what="the replay's span")
    spans = spans_of_trace(trace_id)
    assert sorted(s.name for s in spans) == ["undolog.call", "undolog.intercept"]
    attributes = one(spans, "undolog.call").attributes
    assert attributes is not None and attributes["undolog.status"] == "replayed"


def test_a_rollback_is_a_span_with_one_compensation_each_under_the_callers_trace(
    traced: ProxyHarness, recorder: tuple[ThreadServer, list[dict[str, Any]]]
) -> None:
    session = str(uuid.uuid4())
    rollback_trace, parent = caller()
    with traced.client() as c:
        for step in (1, 2):
            assert echo(c, session, step).status_code == 200
        answer = c.post(f"/sessions/{session}/rollback", headers={"traceparent": parent})
    assert answer.status_code == 200, answer.text
    assert answer.json()["outcome"] == "compensated"

    def chain() -> list[str] | None:
        found = named(spans_of_trace(rollback_trace), "undolog.rollback")
        return chain_to(found[0] if found else None, CALLER_SPAN, rollback_trace)

    # Under the caller's span, maybe through the web framework's own span of the request.
    wait_until(lambda: chain() is not None, what="the rollback's span chain")
    found = chain() or []
    assert not [n for n in found[1:] if n.startswith("undolog.")], found  # FastAPI's spans only
    spans = spans_of_trace(rollback_trace)
    rollback = one(spans, "undolog.rollback")
    assert rollback.attributes is not None
    assert rollback.attributes["undolog.outcome"] == "compensated"
    compensations = named(spans, "undolog.compensation")
    assert [parent_id(s) for s in compensations] == [span_id(rollback)] * 2
    entries = [s.attributes["undolog.entry_id"] for s in compensations if s.attributes]
    for compensation, entry_id in zip(compensations, entries, strict=True):
        [upstream] = [s for s in spans if parent_id(s) == span_id(compensation)]
        assert upstream.name == "undolog.upstream"
        [request] = [r for r in recorder[1] if r["idempotency_key"] == entry_id]
        assert (request["tool"], request["traceparent"]) == ("unecho", sent_traceparent(upstream))


@pytest.mark.security
@pytest.mark.parametrize(
    "bad",
    [
        "not-a-traceparent",
        "00-" + "0" * 32 + "-" + "0" * 16 + "-01",  # all-zero ids are invalid
        "00-" + "a" * 32 + "-" + "b" * 16 + "-01" + "x" * 500,  # far too long
    ],
)
def test_a_malformed_traceparent_starts_a_new_trace_and_never_reaches_the_upstream(
    traced: ProxyHarness, recorder: tuple[ThreadServer, list[dict[str, Any]]], bad: str
) -> None:
    session = str(uuid.uuid4())
    with traced.client() as c:
        answer = echo(c, session, traceparent=bad)
    assert answer.status_code == 200, answer.text
    effect_id = answer.json()["effect_id"]

    def call_span() -> ReadableSpan | None:
        for s in span_exporter().get_finished_spans():
            if (
                s.name == "undolog.call"
                and (s.attributes or {}).get("undolog.effect_id") == effect_id
            ):
                return s
        return None

    wait_until(lambda: call_span() is not None, what="the call span")
    span = call_span()
    assert span is not None and span.parent is None  # a root: the bad parent was dropped
    [request] = [r for r in recorder[1] if r["idempotency_key"] == effect_id]
    upstream = [s for s in span_exporter().get_finished_spans() if s.name == "undolog.upstream"
                and s.context is not None and span.context is not None
                and s.context.trace_id == span.context.trace_id]  # fmt: skip
    assert request["traceparent"] == sent_traceparent(upstream[0])
    assert bad not in request["traceparent"] and request["tracestate"] is None


def test_the_callers_tracestate_is_not_passed_to_the_upstream(
    traced: ProxyHarness, recorder: tuple[ThreadServer, list[dict[str, Any]]]
) -> None:
    session = str(uuid.uuid4())
    trace_id, traceparent = caller()
    with traced.client() as c:
        answer = echo(c, session, traceparent=traceparent, tracestate="vendor=client-text")
    effect_id = answer.json()["effect_id"]
    [request] = [r for r in recorder[1] if r["idempotency_key"] == effect_id]
    assert request["traceparent"] is not None
    assert request["traceparent"].split("-")[1] == f"{trace_id:032x}"
    assert request["tracestate"] is None


def blocking(tmp_path: Path, package: str) -> str:
    """A PYTHONPATH whose sitecustomize makes every import of `package` fail."""
    blocker = tmp_path / f"no_{package.replace('.', '_')}"
    blocker.mkdir()
    (blocker / "sitecustomize.py").write_text(
        "import sys\n"
        "class _Blocked:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        f"        if name == {package!r} or name.startswith({package + '.'!r}):\n"
        "            raise ImportError(name + ' is not installed here')\n"
        "        return None\n"
        "sys.meta_path.insert(0, _Blocked())\n"
    )
    return os.pathsep.join([str(blocker), os.environ.get("PYTHONPATH", "")])


def test_tracing_is_off_without_the_opentelemetry_api(tmp_path: Path) -> None:
    """The module on its own: no `opentelemetry` at all, every function a no-op."""
    probe = (
        "import undolog.services.tracing as t\n"
        "assert not t.HAVE_OTEL\n"
        "headers = {}\n"
        "with t.caller_context('00-' + 'a' * 32 + '-' + 'b' * 16 + '-01'):\n"
        "    with t.span('undolog.call', tool='x') as s:\n"
        "        t.annotate(s, status='executed')\n"
        "        t.inject(headers)\n"
        "assert s is None and headers == {}, headers\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe],
        env={**os.environ, "PYTHONPATH": blocking(tmp_path, "opentelemetry")},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr


def test_spans_record_nothing_until_a_tracer_provider_is_set_then_record() -> None:
    """With OpenTelemetry installed and no tracer provider, a span is skipped cheaply (the
    module reads OpenTelemetry's global, not `os.environ`, on each span); a provider set
    later, while the process runs, is used from the next span on. In a process of its own:
    a provider is set only once per process."""
    probe = (
        "from opentelemetry import trace\n"
        "from opentelemetry.sdk.trace import TracerProvider\n"
        "from opentelemetry.sdk.trace.export import SimpleSpanProcessor\n"
        "from opentelemetry.sdk.trace.export.in_memory_span_exporter import "
        "InMemorySpanExporter\n"
        "import undolog.services.tracing as t\n"
        "with t.span('undolog.before', tool='x') as s:\n"
        "    assert s is None, s\n"
        "exporter = InMemorySpanExporter()\n"
        "provider = TracerProvider()\n"
        "provider.add_span_processor(SimpleSpanProcessor(exporter))\n"
        "trace.set_tracer_provider(provider)\n"
        "with t.span('undolog.after', tool='x') as s:\n"
        "    assert s is not None\n"
        "names = [span.name for span in exporter.get_finished_spans()]\n"
        "assert names == ['undolog.after'], names\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "OTEL_PYTHON_TRACER_PROVIDER"}
    done = subprocess.run(
        [sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=60,
        check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr


@pytest.mark.slow
def test_the_server_runs_without_the_opentelemetry_sdk(
    tmp_path: Path, store_url: str, recorder: tuple[ThreadServer, list[dict[str, Any]]]
) -> None:
    """`undolog serve` without the `otel` extra's SDK (the API comes with FastAPI and mcp):
    calls run; no span is recorded, so the caller's trace context passes through as it came."""
    org_id, key = f"org-{uuid.uuid4().hex[:8]}", "ul_test_" + uuid.uuid4().hex
    config = tmp_path / "undolog.toml"
    write_org_config(config, org_id, key)
    pythonpath = blocking(tmp_path, "opentelemetry.sdk")
    server = spawn_proxy(store_url, recorder[0].url, config, PYTHONPATH=pythonpath)
    _, traceparent = caller()
    try:
        with httpx.Client(base_url=server.url, headers={"X-Api-Key": key}, timeout=30) as c:
            spec = {"tier": "compensable", "compensation": {"fn_name": "unecho"}}
            c.put("/tools/echo", json=spec).raise_for_status()
            traced_call = echo(c, str(uuid.uuid4()), traceparent=traceparent)
            plain_call = echo(c, str(uuid.uuid4()))
    finally:
        server.stop()
    for answer in (traced_call, plain_call):
        assert answer.status_code == 200, answer.text
        assert answer.json()["status"] == "executed"
    sent = {r["idempotency_key"]: r["traceparent"] for r in recorder[1]}
    assert sent[traced_call.json()["effect_id"]] == traceparent
    assert sent[plain_call.json()["effect_id"]] is None
