"""The OpenAPI document (`undolog.proxy.openapi`) is complete and true.

Complete: every route of the app, and the routes served outside FastAPI's routing, with
security and a response model per status. True: schemathesis (`--checks all`) drives a real
proxy on each store from the document alone and finds no server error and no answer the
document does not describe; its few excused failures are listed, with reasons, in
`schemathesis_hooks.py`.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
from starlette.routing import Route

from tests.proxy.conftest import ProxyHarness
from tests.proxy.schemathesis_hooks import EXCUSED_LOG
from undolog.proxy.edge import PUBLIC_PATHS
from undolog.proxy.roles import PERMISSIONS

REPO = Path(__file__).resolve().parents[2]
# How much schemathesis generates per operation and phase: 60 gives about 2,500 cases per store
# and keeps CI's run short; UNDOLOG_TEST_SCHEMATHESIS_EXAMPLES asks for more (a longer fuzz).
MAX_EXAMPLES = int(os.environ.get("UNDOLOG_TEST_SCHEMATHESIS_EXAMPLES", "60"))


def _document(proxy: ProxyHarness) -> dict[str, Any]:
    with httpx.Client(base_url=proxy.url) as anonymous:  # the document needs no key
        response = anonymous.get("/openapi.json")
    assert response.status_code == 200
    spec: dict[str, Any] = response.json()
    return spec


def _app_routes(proxy: ProxyHarness) -> set[tuple[str, str]]:
    """(method, path) of every route the app serves and documents (not the dashboard's)."""
    api = proxy.server.app.fastapi if proxy.server else None
    assert api is not None
    routes = set()
    for route in api.routes:
        path = getattr(route, "path", "")
        methods = getattr(route, "methods", None) or set()
        documented = getattr(route, "include_in_schema", True) or type(route) is Route
        if path.startswith("/ui") or path.startswith("/docs") or path == "/openapi.json":
            continue
        if documented:
            routes.update((m, path) for m in methods - {"HEAD", "OPTIONS"})
    return routes


def test_every_route_is_documented_with_its_security_and_responses(proxy: ProxyHarness) -> None:
    spec = _document(proxy)
    schemes = spec["components"]["securitySchemes"]
    assert schemes["ApiKey"] == {"type": "apiKey", "in": "header", "name": "X-Api-Key"}
    expected = _app_routes(proxy) | {("GET", "/health"), ("GET", "/metrics")}
    expected |= {k for k in PERMISSIONS if "//" not in k[1]}  # every route with a role
    assert ("POST", "/mcp") in expected and ("GET", "/events") in expected
    for method, path in sorted(expected):
        op = spec["paths"].get(path, {}).get(method.lower())
        assert op is not None, f"{method} {path} is not in the document"
        if path in PUBLIC_PATHS or path == "/health":
            assert op["security"] == [], path
        elif path == "/metrics":
            assert op["security"] == [{"MetricsToken": []}]
        else:
            assert op["security"] == [{"ApiKey": []}], f"{method} {path}"
            assert {"401", "403", "429"} <= set(op["responses"]), f"{method} {path}"
        assert "422" not in op["responses"], f"{method} {path}: 422 is never sent"
        for status, answer in op["responses"].items():
            assert answer["description"], f"{method} {path} {status}"
            content = answer["content"]  # every answer has a body, described
            for media in content.values():
                assert media["schema"] is not None
            if status >= "400":
                ref = content["application/json"]["schema"]["$ref"]
                assert ref == "#/components/schemas/ErrorBody", f"{method} {path} {status}"
    # Nothing undocumented leaks in from FastAPI's defaults.
    assert "HTTPValidationError" not in spec["components"]["schemas"]


def test_the_statuses_bodies_and_queries_are_those_the_routes_use(proxy: ProxyHarness) -> None:
    spec = _document(proxy)
    paths = spec["paths"]
    call = paths["/mcp/tool_call"]["post"]
    assert {"200", "202", "400", "404", "409", "413", "502", "503"} <= set(call["responses"])
    pending = call["responses"]["202"]["content"]["application/json"]["schema"]["$ref"]
    assert pending.endswith("/ToolCallPending")
    approve = call["responses"]["202"]["links"]["Approve"]  # the ids lead on (OpenAPI links)
    assert approve["operationId"] == paths["/approvals/{id}/approve"]["post"]["operationId"]
    assert approve["parameters"] == {"id": "$response.body#/approval_id"}
    for path, model in [
        ("/effects/{id}/commit", "CommitBody"),
        ("/effects/{id}/fail", "FailBody"),
        ("/effects/{id}/resolve", "ResolveBody"),
        ("/approvals/{id}/approve", "DecisionBody"),
        ("/approvals/{id}/reject", "RejectBody"),  # changed args go with an approval only
        ("/undo/{entry}/complete", "UndoReportBody"),
    ]:
        body = paths[path]["post"]["requestBody"]
        assert body["content"]["application/json"]["schema"]["title"] == model
    assert paths["/approvals/{id}/approve"]["post"]["requestBody"]["required"] is False
    schemas = spec["components"]["schemas"]
    assert schemas["DecisionBody"]["additionalProperties"] is False  # decided_by: refused
    assert schemas["RejectBody"]["additionalProperties"] is False
    assert schemas["ResolveBody"]["properties"]["outcome"]["enum"] == ["committed", "failed"]
    assert "502" in paths["/sessions/{id}/rollback"]["post"]["responses"]
    assert "202" not in paths["/approvals/{id}/approve"]["post"]["responses"]
    queries = {
        path: {p["name"] for p in paths[path]["get"].get("parameters", [])}
        for path in ("/approvals", "/sessions", "/events", "/events/recent")
    }
    assert queries == {
        "/approvals": {"state", "limit", "tool", "cursor", "recent_calls"},
        "/sessions": {"limit", "state", "q", "cursor"},
        "/events": {"last_event_id", "Last-Event-ID"},
        "/events/recent": {"limit", "session_id"},
    }
    for paged in ("/approvals", "/sessions"):
        headers = paths[paged]["get"]["responses"]["200"]["headers"]
        assert "X-UndoLog-Next-Cursor" in headers
    assert "requested_by" in schemas["Approval"]["required"]
    assert "mode" in schemas["Approval"]["required"]
    assert paths["/events"]["get"]["responses"]["200"]["content"] == {
        "text/event-stream": {"schema": {"type": "string"}}
    }
    # The error body as every route sends it, fields and all.
    with proxy.client() as client:
        missing = client.get("/effects/no-such-effect")
    assert missing.status_code == 404
    assert set(schemas["ErrorBody"]["required"]) <= set(missing.json())


def test_swagger_ui_and_the_document_are_public_the_api_is_not(proxy: ProxyHarness) -> None:
    with httpx.Client(base_url=proxy.url) as anonymous:
        docs = anonymous.get("/docs")
        assert docs.status_code == 200
        assert "swagger-ui" in docs.text and "/openapi.json" in docs.text
        assert anonymous.get("/openapi.json").status_code == 200
        refused = anonymous.get("/tools")
        assert refused.status_code == 401
        assert refused.json()["code"] == "auth_missing" or "X-Api-Key" in refused.json()["message"]
        # The liveness answer is the documented one.
        assert anonymous.get("/health").json() == {"status": "ok", "service": "undolog-proxy"}


def _schemathesis(proxy: ProxyHarness, workdir: Path) -> dict[str, Any]:
    """Run schemathesis's CLI against the proxy; its JSON report."""
    config = workdir / "schemathesis.toml"
    # `GET /approvals/{id}?wait=N` holds a request up to N seconds by design (55 at most):
    # the run sends `wait=1`, or its cases would not fit its time (the waits themselves are
    # tested in test_approval_waits.py).
    config.write_text('hooks = "tests.proxy.schemathesis_hooks"\n[parameters]\n"query.wait" = 1\n')
    report = workdir / "report.json"
    st = shutil.which("st", path=str(Path(sys.executable).parent)) or "st"
    command = [
        st, "--config-file", str(config), "run", f"{proxy.url}/openapi.json",
        "--checks", "all",
        "-H", f"X-Api-Key: {proxy.api_key}",
        "--max-examples", str(MAX_EXAMPLES),
        "--seed", "20261201",  # the same cases on every run
        "--no-shrink",
        "--workers", "1",
        "--request-timeout", "20",
        # /mcp speaks MCP (JSON-RPC over Streamable HTTP): tests/mcp drive it with the
        # official client. /events is an endless SSE stream: a request never ends.
        "--exclude-path", "/mcp",
        "--exclude-path", "/events",
        "--report-json-path", str(report),
    ]  # fmt: skip
    excused = workdir / "excused.txt"
    excused.touch()
    env = {**os.environ, "PYTHONPATH": str(REPO), "NO_COLOR": "1", EXCUSED_LOG: str(excused)}
    done = subprocess.run(
        command, cwd=workdir, env=env, capture_output=True, text=True, timeout=300, check=False
    )
    assert report.exists(), done.stdout[-4000:] + done.stderr[-4000:]
    result: dict[str, Any] = json.loads(report.read_text())
    (workdir / "output.txt").write_text(done.stdout)
    result["output"] = done.stdout
    result["excused"] = Counter(excused.read_text().splitlines())
    return result


def test_schemathesis_finds_no_server_error_and_no_schema_violation(
    proxy_factory: Any, tmp_path: Path
) -> None:
    # Its auth checks send wrong keys by the hundred: the per-address limit would answer 429.
    proxy: ProxyHarness = proxy_factory(auth_failure_limit=1_000_000)
    result = _schemathesis(proxy, tmp_path)
    cases = result["test_cases"]
    print(  # the numbers, in the test's log
        f"schemathesis: {cases['generated']} cases, {cases['with_failures']} failed, "
        f"{result['filtered']} excused failures dropped, {len(result['errors'])} errors; "
        f"excused by reason: {dict(result['excused'])}"
    )
    assert result["failures"] == [], result["output"][-6000:]
    assert result["errors"] == [], result["output"][-6000:]
    assert result["operations"]["tested"] == result["operations"]["selected"] >= 24
    assert cases["generated"] >= 2000
    assert result["exit_code"] == 0


def test_a_mode_that_is_not_a_string_is_a_400_not_a_500(proxy: ProxyHarness) -> None:
    """Found by schemathesis: a list or object `mode` was unhashable in the parser's check."""
    body = {"session_id": "6f1c1f5e-0a7e-4c39-9d38-3e0b7f3a2b11", "tool_name": "read_record"}
    with proxy.client() as client:
        for mode in ({}, [], ["sdk"]):
            answer = client.post("/mcp/tool_call", json={**body, "args": {}, "mode": mode})
            assert answer.status_code == 400, answer.text
            assert answer.json()["code"] == "invalid_request"
            assert answer.json()["message"] == "mode must be 'proxy' or 'sdk'"


def test_an_empty_mode_header_is_a_400_not_the_bodys_mode(proxy: ProxyHarness) -> None:
    """Found by schemathesis: `X-UndoLog-Mode:` (empty) fell back to the body's mode."""
    body = {"session_id": "6f1c1f5e-0a7e-4c39-9d38-3e0b7f3a2b12", "tool_name": "echo", "args": {}}
    with proxy.client() as client:
        answer = client.post("/mcp/tool_call", json=body, headers={"X-UndoLog-Mode": ""})
    assert answer.status_code == 400, answer.text
    assert answer.json()["code"] == "invalid_request"


def test_the_dry_run_refuses_args_that_have_no_canonical_form(proxy: ProxyHarness) -> None:
    """Found by schemathesis: the dry run took an integer beyond 2**64 - 1 a call refuses."""
    body = {"tool_name": "delete_database", "args": {"n": 2**64}}
    with proxy.client() as client:
        answer = client.post("/policy/dry-run", json=body)
    assert answer.status_code == 400, answer.text
    assert answer.json()["code"] == "invalid_request"
