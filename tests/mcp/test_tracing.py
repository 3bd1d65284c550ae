"""The MCP gateway's `tools/call` is traced like a REST call, under the caller's trace
(docs/observability.md, "Traces"); the official MCP client and the real memory server."""

from __future__ import annotations

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan

from tests.mcp.conftest import Gateway
from tests.support.otel import chain_to, spans_of_trace, traces  # noqa: F401 (traces: a fixture)
from tests.support.servers import await_until


def _entity(name: str) -> dict[str, object]:
    return {"name": name, "entityType": "person", "observations": ["traced"]}


def _call_span(trace_id: int) -> ReadableSpan | None:
    found = [s for s in spans_of_trace(trace_id) if s.name == "undolog.call"]
    return found[0] if found else None


def _chain(trace_id: int, caller: int) -> list[str] | None:
    return chain_to(_call_span(trace_id), caller, trace_id)


@pytest.mark.usefixtures("traces")
async def test_a_gateway_call_is_a_span_under_the_agents_trace(
    gateway: Gateway, session_id: str
) -> None:
    """The agent's span is current while its MCP client calls: the client sends its trace
    context in `_meta` (the MCP SDK does), the SDK's server span takes it, `undolog.call` is
    that span's child, with intercept, upstream and commit under it."""
    with trace.get_tracer("agent").start_as_current_span("agent step") as agent:
        async with gateway.client(session_id) as client:
            result = await client.call_tool(
                "memory.create_entities", {"entities": [_entity("traced")]}
            )
    assert not result.is_error
    context = agent.get_span_context()
    trace_id, agent_span = context.trace_id, context.span_id
    await await_until(lambda: _chain(trace_id, agent_span) is not None, what="the span chain")
    chain = _chain(trace_id, agent_span)
    assert chain is not None and chain[0] == "undolog.call", chain
    assert not [n for n in chain[1:] if n.startswith("undolog.")], chain  # the MCP SDK's spans
    span = _call_span(trace_id)
    assert span is not None and span.attributes is not None
    assert span.attributes["undolog.status"] == "executed"
    assert span.attributes["undolog.tool"] == "memory.create_entities"
    children = sorted(
        s.name for s in spans_of_trace(trace_id)
        if s.parent is not None and span.context is not None
        and s.parent.span_id == span.context.span_id
    )  # fmt: skip
    assert children == ["undolog.commit", "undolog.intercept", "undolog.upstream"]
