"""`undolog demo`: a scripted agent run that shows what UndoLog does, printed as a timeline.

The agent searches the web (SAFE), sends an email and moves money (COMPENSABLE), retries the
transfer (a replay: the money moves once), asks to delete a database (IRREVERSIBLE: it waits
for approval), then hits a failure and gives up; the session is rolled back and the email and
the transfer are undone, newest first. With no `--url` it runs on its own: a proxy on a
temporary SQLite database and the demo tool server, both on free loopback ports.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import socket
import tempfile
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import httpx
import uvicorn

from undolog.config import KeyConfig, OrgConfig, Settings, ToolConfig, hash_api_key
from undolog.demo.catalog import DEMO_TOOLS
from undolog.demo.tools import create_demo_tools_app
from undolog.logs import uvicorn_log_config

__all__ = ["run_scenario", "self_contained"]

Echo = Callable[[str], None]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def _start(app: Any, port: int) -> tuple[uvicorn.Server, asyncio.Task[None]]:
    server = uvicorn.Server(
        uvicorn.Config(
            app,
            host="127.0.0.1",
            port=port,
            log_level="error",
            lifespan="on",
            log_config=uvicorn_log_config(),
        )
    )
    task = asyncio.create_task(server.serve())
    deadline = asyncio.get_running_loop().time() + 30
    while not server.started:
        if task.done() or asyncio.get_running_loop().time() > deadline:
            raise RuntimeError("the demo server did not start")
        await asyncio.sleep(0.02)
    return server, task


@contextlib.asynccontextmanager
async def self_contained() -> AsyncIterator[tuple[str, str]]:
    """A proxy and the demo tools on free ports; yields (proxy URL, the agent's API key).

    The demo tools come from the config, the agent gets an `agent` key: what it may do
    in production too."""
    from undolog.proxy import create_app

    key = "ul_demo_" + secrets.token_urlsafe(18)
    agent_key = KeyConfig(name="demo-agent", role="agent", key_hash=hash_api_key(key))
    upstream_secret = secrets.token_urlsafe(32)  # the tools verify what the proxy signs
    tools_port, proxy_port = _free_port(), _free_port()
    with tempfile.TemporaryDirectory() as tmp:
        settings = Settings(
            database_url=f"sqlite:///{Path(tmp) / 'demo.db'}",
            upstream_url=f"http://127.0.0.1:{tools_port}",
            upstream_secret=upstream_secret,
            log_level="error",
            orgs=(OrgConfig(org_id="demo", keys=(agent_key,)),),
            tools=tuple(
                ToolConfig(org_id="demo", name=name, **spec) for name, spec in DEMO_TOOLS.items()
            ),
        )
        servers = [
            await _start(create_demo_tools_app(secret=upstream_secret), tools_port),
            await _start(create_app(settings), proxy_port),
        ]
        try:
            yield f"http://127.0.0.1:{proxy_port}", key
        finally:
            for server, task in reversed(servers):
                server.should_exit = True
                await task


async def run_scenario(proxy_url: str, api_key: str, echo: Echo) -> dict[str, Any]:
    """Run the scripted session against a proxy; returns the final session view."""
    session_id = str(uuid.uuid4())
    async with httpx.AsyncClient(
        base_url=proxy_url, headers={"X-Api-Key": api_key}, timeout=30
    ) as client:
        for name, spec in DEMO_TOOLS.items():
            registered = await client.put(f"/tools/{name}", json=spec)
            if registered.status_code == 403 and registered.json().get("code") == "forbidden":
                continue  # an agent key (or config tools): the operator registered them
            registered.raise_for_status()

        async def call(step: int, tool: str, **args: Any) -> dict[str, Any]:
            body = {"session_id": session_id, "tool_name": tool, "step_index": step, "args": args}
            response = await client.post("/mcp/tool_call", json=body)
            data: dict[str, Any] = response.json()
            outcome = data.get("status") or data.get("code")
            detail = ""
            if isinstance(data.get("result"), dict):
                result = data["result"]
                detail = (
                    f"-> {result.get('output') if result.get('success') else result.get('error')}"
                )
            elif data.get("approval_id"):
                detail = f"-> approval {data['approval_id']} (a person must approve it)"
            if len(detail) > 90:
                detail = detail[:87] + "..."
            echo(f"  step {step}: {tool:<22} {response.status_code} {outcome:<17} {detail}")
            return data

        echo(f"session {session_id}\n")
        await call(1, "search_web", query="refund policy")
        await call(2, "send_email", to="ada@example.com", subject="Your refund is on its way")
        await call(3, "transfer_funds", from_account="ops", to_account="ada", amount=120)
        echo("  (the agent crashes and retries step 3: the recorded result comes back)")
        await call(3, "transfer_funds", from_account="ops", to_account="ada", amount=120)
        await call(4, "delete_database", db_name="refunds_staging")
        failed = await call(5, "transfer_funds", from_account="ops", to_account="ada", amount=5000)
        error = (failed.get("result") or {}).get("error")
        echo(f"\nthe agent fails ({error}) and the session is rolled back, newest first:\n")
        rollback = (await client.post(f"/sessions/{session_id}/rollback")).json()
        echo(f"  rollback: {rollback['outcome']}")
        view: dict[str, Any] = (await client.get(f"/sessions/{session_id}")).json()
    return view


async def demo_main(url: str | None, api_key: str | None, echo: Echo) -> dict[str, Any]:
    from undolog.cli_ops import render_session

    if url:
        if not api_key:
            raise SystemExit("error: --url needs the org's --api-key")
        try:
            view = await run_scenario(url, api_key, echo)
        except httpx.HTTPStatusError as exc:
            raise SystemExit(
                f"error: the proxy at {url} refused: {exc.response.status_code} {exc.response.text}"
            ) from None
        except httpx.RequestError as exc:
            raise SystemExit(f"error: cannot reach the proxy at {url}: {exc!r}") from None
    else:
        async with self_contained() as (proxy_url, key):
            view = await run_scenario(proxy_url, key, echo)
    echo("\n" + render_session(view))
    return view
