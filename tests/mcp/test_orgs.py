"""MCP upstreams belong to orgs: an org sees and calls only the upstreams that list it (or are
`shared`), and a shared upstream is told which org is calling: a signed `X-UndoLog-Org` over
Streamable HTTP, a process of its own with `UNDOLOG_ORG` over stdio.

Two orgs on one real proxy, in front of the real npm memory server, an `mcp` package server
over HTTP that keeps notes per verified org, and a small stdio server that says who it runs for.
"""

from __future__ import annotations

import contextlib
import secrets
import sys
import textwrap
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from mcp import MCPError
from mcp.server.mcpserver import Context, MCPServer
from mcp_types import INVALID_PARAMS, ToolAnnotations

from tests.mcp.conftest import Gateway, gateway_config, text_of
from tests.mcp.test_resources_prompts import _notes_app as _resource_notes_app
from tests.proxy.conftest import role_keys
from tests.support.servers import ThreadServer
from undolog.config import OrgConfig, Settings
from undolog.mcp.config import McpUpstream, parse_mcp_settings
from undolog.mcp.upstreams import UpstreamPool
from undolog.services.executor import ToolUnreachable
from undolog_sdk.upstream import InvalidUpstreamSignature, verify_request

pytestmark = pytest.mark.slow

SECRET = "notes-upstream-secret"


@contextlib.contextmanager
def two_orgs(mcp: dict[str, Any], tmp_path: Path) -> Iterator[tuple[Gateway, Gateway]]:
    """One proxy, orgs `a-…` and `b-…`; each Gateway's key is its org's admin key, and
    `.agent`/`.approver` keys are on `keys`."""
    from undolog.proxy import create_app

    ids = [f"{name}-{secrets.token_hex(4)}" for name in ("a", "b")]
    keys = {org: "ul_test_" + secrets.token_urlsafe(18) for org in ids}
    settings = Settings(
        database_url=f"sqlite:///{tmp_path / 'undolog.db'}",
        upstream_timeout_seconds=20.0,
        lease_seconds=30.0,
        log_level="warning",
        orgs=tuple(OrgConfig(org_id=org, keys=role_keys(keys[org])) for org in ids),
        mcp=parse_mcp_settings({"approval_wait_seconds": 0, **_with_orgs(mcp, ids)}),
        allow_self_approval=True,  # each org's one admin key calls and approves
    )
    server = ThreadServer(create_app(settings)).start()
    try:
        a, b = (Gateway(server.url, keys[o], o, tmp_path / "memory.jsonl", server) for o in ids)
        yield a, b
    finally:
        server.stop()


def _with_orgs(mcp: dict[str, Any], ids: list[str]) -> dict[str, Any]:
    """`orgs = ["A"]` in the config stands for the first org's generated id."""
    named = {"A": ids[0], "B": ids[1]}
    upstreams = [
        {**u, "orgs": [named[o] for o in u["orgs"]]} if "orgs" in u else u for u in mcp["upstreams"]
    ]
    return {**mcp, "upstreams": upstreams}


def _entity(name: str) -> dict[str, object]:
    return {"name": name, "entityType": "note", "observations": ["org A's private note"]}


# -- an upstream of one org ----------------------------------------------------------------------


@pytest.mark.security
async def test_another_orgs_upstream_is_neither_listed_nor_called(tmp_path: Path) -> None:
    """The attack: org B's agent read org A's note through a SAFE tool of A's memory server,
    then wiped it with an IRREVERSIBLE one that B's own approver approved."""
    (_, memory) = gateway_config(tmp_path / "memory.jsonl")["upstreams"]
    config = {"upstreams": [{**memory, "orgs": ["A"]}]}
    with two_orgs(config, tmp_path) as (a, b):
        async with a.client(str(uuid.uuid4())) as client:
            created = await client.call_tool(
                "memory.create_entities", {"entities": [_entity("a-note")]}
            )
            assert not created.is_error, text_of(created)
            assert "memory.read_graph" in {t.name for t in (await client.list_tools()).tools}

        session_b = str(uuid.uuid4())
        async with b.client(session_b) as client:
            assert (await client.list_tools()).tools == []
            for tool, args in [
                ("memory.read_graph", {}),
                ("memory.search_nodes", {"query": "a-note"}),
                ("memory.delete_entities", {"entityNames": ["a-note"]}),
            ]:
                with pytest.raises(MCPError) as refused:
                    await client.call_tool(tool, args)
                assert refused.value.error.code == INVALID_PARAMS, tool
                assert "a-note" not in refused.value.error.message
        async with b.client() as client:  # a read without a session: no session to gate it
            with pytest.raises(MCPError) as refused:
                await client.call_tool("memory.read_graph", {})
            assert refused.value.error.code == INVALID_PARAMS

        with b.rest() as rest:
            # Nothing waits for B's approver, nothing was recorded for B.
            assert rest.get("/approvals", params={"state": "pending"}).json() == []
            assert rest.get(f"/sessions/{session_b}").status_code == 404
            # Nor through the REST API: the tool is not B's, and B cannot register it.
            put = rest.put("/tools/memory.delete_entities", json={"tier": "safe"})
            assert put.status_code == 403
            called = rest.post(
                "/mcp/tool_call",
                json={
                    "session_id": session_b,
                    "tool_name": "memory.delete_entities",
                    "args": {"entityNames": ["a-note"]},
                },
            )
            assert called.status_code == 404, called.text
        assert a.entities() == ["a-note"]


@pytest.mark.security
async def test_another_orgs_resources_and_prompts_are_neither_listed_nor_read(
    tmp_path: Path,
) -> None:
    upstream = ThreadServer(_resource_notes_app()).start()
    config = {"upstreams": [{"name": "notes", "url": f"{upstream.url}/mcp", "orgs": ["A"]}]}
    try:
        with two_orgs(config, tmp_path) as (a, b):
            async with a.client() as client:
                assert (await client.list_resources()).resources
                assert (await client.read_resource("notes://ideas")).contents
            async with b.client() as client:
                assert (await client.list_resources()).resources == []
                assert (await client.list_resource_templates()).resource_templates == []
                assert (await client.list_prompts()).prompts == []
                for ask in (
                    client.read_resource("notes://ideas"),
                    client.get_prompt("notes.summarize", {"name": "ideas"}),
                ):
                    with pytest.raises(MCPError) as refused:
                        await ask
                    assert refused.value.error.code == INVALID_PARAMS
                    assert "a gateway for prompts" not in str(refused.value)
    finally:
        upstream.stop()


@pytest.mark.security
async def test_the_executor_path_refuses_an_org_the_upstream_does_not_list() -> None:
    """A proxy-executed call (an approved one, a compensation) is routed by tool name: the
    pool checks the org too, and starts nothing for an org the upstream does not list."""
    upstream = McpUpstream(
        name="memory", transport="stdio", command=sys.executable, orgs=("org-a",)
    )
    pool = UpstreamPool((upstream,), timeout_seconds=5)
    try:
        assert pool.handles("memory.delete_entities")
        with pytest.raises(ToolUnreachable, match="not open to this org"):
            await pool.call(
                "memory.delete_entities", {"entityNames": ["a-note"]},
                org_id="org-b", effect_id=str(uuid.uuid4()), idempotency_key="k",
            )  # fmt: skip
        assert pool.connections() == []
    finally:
        await pool.close()


# -- a shared upstream over Streamable HTTP: the signed org ----------------------------------------


def _verifying(app: Any) -> Any:
    """ASGI middleware that verifies UndoLog's signature over each whole request (method,
    path, body, org, tool, effect, time) and answers 401 to what it cannot verify."""

    async def asgi(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await app(scope, receive, send)
            return
        messages, body, more = [], b"", True
        while more:
            message = await receive()
            messages.append(message)
            body += message.get("body", b"")
            more = message.get("more_body", False)
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
        try:
            verify_request(SECRET, headers, scope["method"], scope["path"], body)
        except InvalidUpstreamSignature:
            await send({"type": "http.response.start", "status": 401, "headers": []})
            await send({"type": "http.response.body", "body": b"not signed by UndoLog"})
            return

        async def replay() -> Any:
            return messages.pop(0) if messages else await receive()

        await app(scope, replay, send)

    return asgi


def _notes_app(notes: dict[str, list[str]], seen: list[tuple[str, str, str]]) -> Any:
    """A notes server shared by orgs: it keeps each org's notes apart by the org UndoLog
    signed (the whole request verified by `_verifying`)."""
    server = MCPServer("notes")

    def caller(tool: str, ctx: Context) -> str:
        meta = ctx.request_context.meta or {}
        effect_id = str(meta.get("undolog/effect_id") or "")
        org = str((ctx.headers or {}).get("x-undolog-org"))
        seen.append((tool, org, effect_id))
        return org

    @server.tool(annotations=ToolAnnotations(read_only_hint=True))
    def read_notes(ctx: Context) -> list[str]:
        """This org's notes."""
        return notes.get(caller("read_notes", ctx), [])

    @server.tool(annotations=ToolAnnotations(destructive_hint=False))
    def write_note(text: str, ctx: Context) -> int:
        """Add a note."""
        mine = notes.setdefault(caller("write_note", ctx), [])
        mine.append(text)
        return len(mine)

    @server.tool(annotations=ToolAnnotations(destructive_hint=True))
    def wipe_notes(ctx: Context) -> int:
        """Delete this org's notes."""
        return len(notes.pop(caller("wipe_notes", ctx), []))

    return _verifying(server.streamable_http_app(stateless_http=True, json_response=True))


@pytest.mark.security
async def test_a_shared_http_upstream_is_told_the_calling_org_signed(tmp_path: Path) -> None:
    notes: dict[str, list[str]] = {}
    seen: list[tuple[str, str, str]] = []
    upstream = ThreadServer(_notes_app(notes, seen)).start()
    config = {
        "upstreams": [
            {
                "name": "notes",
                "url": f"{upstream.url}/mcp",
                "shared": True,
                "secret": SECRET,
                "headers": {"X-UndoLog-Org": "forged"},  # cannot stand in for the signed org
                "tools": {
                    "write_note": {
                        "tier": "compensable",
                        "compensation": {"tool": "wipe_notes"},
                    }
                },
            }
        ]
    }
    try:
        with two_orgs(config, tmp_path) as (a, b):
            async with a.client(str(uuid.uuid4())) as client:
                wrote = await client.call_tool("notes.write_note", {"text": "A's secret"})
                assert not wrote.is_error, text_of(wrote)
                effect_a = wrote.meta["undolog"]["effect_id"]  # type: ignore[index]
            async with b.client(str(uuid.uuid4())) as client:
                read = await client.call_tool("notes.read_notes", {})
                assert not read.is_error, text_of(read)
                assert "A's secret" not in text_of(read)
                wipe = await client.call_tool("notes.wipe_notes", {})
                assert wipe.meta["undolog"]["status"] == "pending_approval"  # type: ignore[index]
            with b.rest() as rest:  # B's own approver approves B's wipe: B's notes only
                (approval,) = rest.get("/approvals", params={"state": "pending"}).json()
                approved = rest.post(f"/approvals/{approval['id']}/approve", json={})
                assert approved.json()["execution"] == "committed", approved.text
            assert notes == {a.org_id: ["A's secret"]}
            tools = {(tool, org) for tool, org, _ in seen}
            assert ("write_note", a.org_id) in tools
            assert {("read_notes", b.org_id), ("wipe_notes", b.org_id)} <= tools
            # The recorded calls carry their effect id, and the signature covers it.
            assert ("write_note", a.org_id, effect_a) in seen
            assert all(effect for tool, _, effect in seen if tool == "wipe_notes")
    finally:
        upstream.stop()


# -- a shared upstream over stdio: one process per org --------------------------------------------

_WHOAMI = """
    import os, sys
    from mcp.server.mcpserver import MCPServer
    from mcp_types import ToolAnnotations

    server = MCPServer("whoami")

    @server.tool(annotations=ToolAnnotations(read_only_hint=True))
    def whoami() -> str:
        return f"{os.environ.get('UNDOLOG_ORG')} {sys.argv[1]} {os.environ['DATA']} {os.getpid()}"

    server.run()
"""


@pytest.mark.security
async def test_a_shared_stdio_upstream_runs_a_process_per_org_that_knows_its_org(
    tmp_path: Path,
) -> None:
    script = tmp_path / "whoami.py"
    script.write_text(textwrap.dedent(_WHOAMI))
    config = {
        "upstreams": [
            {
                "name": "who",
                "command": sys.executable,
                "args": [str(script), "--data=/srv/{org}/db"],
                "env": {"DATA": "/var/lib/{org}"},
                "shared": True,
            }
        ]
    }
    with two_orgs(config, tmp_path) as (a, b):
        answers = {}
        for gateway in (a, b):
            async with gateway.client() as client:
                answers[gateway.org_id] = text_of(await client.call_tool("who.whoami", {}))
    org_a, arg_a, data_a, pid_a = answers[a.org_id].split()
    org_b, arg_b, data_b, pid_b = answers[b.org_id].split()
    assert (org_a, arg_a, data_a) == (
        a.org_id,
        f"--data=/srv/{a.org_id}/db",
        f"/var/lib/{a.org_id}",
    )
    assert (org_b, arg_b, data_b) == (
        b.org_id,
        f"--data=/srv/{b.org_id}/db",
        f"/var/lib/{b.org_id}",
    )
    assert pid_a != pid_b
