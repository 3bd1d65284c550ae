"""The anchors' row of the benchmark: the same `echo` call made durable by DBOS Transact.

A small HTTP server (aiohttp) in its own process, so that it has its own event loop and its
CPU is counted apart, like the proxy's: `POST /echo` with `{"args", "call_id"}` runs one DBOS
workflow whose id is the caller's `call_id` (DBOS's exactly-once key, as the effect id is
UndoLog's) and whose one step posts the arguments to the demo tool server's `/tools/echo`.
DBOS checkpoints the workflow's start, the step's output and the workflow's result in its
system database on the same PostgreSQL server as UndoLog's (a database of its own).

Run by bench/run.py (`python bench/dbos_anchor.py --port P --database-url URL
--upstream-url URL`); bench/README.md, "The anchors' row". Needs `pip install dbos`
(the `bench` extra); without it the process exits with status 3 and says so on stderr.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
from typing import Any

import aiohttp
import orjson
from aiohttp import web

try:
    from dbos import DBOS, DBOSConfig, SetWorkflowID
except ImportError:  # the row says why; bench/run.py goes on without it
    HAVE_DBOS = False
else:
    HAVE_DBOS = True

MISSING_EXIT = 3


def build(upstream_url: str) -> tuple[web.Application, Any]:
    """The app and the workflow; DBOS's decorators register at definition time."""
    state: dict[str, aiohttp.ClientSession] = {}

    @DBOS.step()
    async def call_echo(args: dict[str, Any], call_id: str) -> dict[str, Any]:
        body = orjson.dumps({"args": args, "session_id": call_id, "effect_id": call_id})
        async with state["http"].post(
            upstream_url + "/tools/echo",
            data=body,
            headers={"Content-Type": "application/json", "Idempotency-Key": call_id},
        ) as response:
            answer: dict[str, Any] = orjson.loads(await response.read())
            return answer

    @DBOS.workflow()
    async def echo_workflow(args: dict[str, Any], call_id: str) -> dict[str, Any]:
        return await call_echo(args, call_id)

    async def echo(request: web.Request) -> web.Response:
        payload = orjson.loads(await request.read())
        call_id = str(payload["call_id"])
        with SetWorkflowID(call_id):
            result = await echo_workflow(payload["args"], call_id)
        return web.Response(body=orjson.dumps(result), content_type="application/json")

    async def health(_: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def on_startup(_: web.Application) -> None:
        state["http"] = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=60)
        )

    async def on_cleanup(_: web.Application) -> None:
        await state["http"].close()

    app = web.Application()
    app.router.add_post("/echo", echo)
    app.router.add_get("/health", health)
    app.on_startup.append(on_startup)
    app.on_cleanup.append(on_cleanup)
    return app, echo_workflow


async def serve(args: argparse.Namespace) -> None:
    app, _ = build(args.upstream_url.rstrip("/"))
    config: DBOSConfig = {
        "name": "undolog-bench-anchor",
        "system_database_url": args.database_url,
        "log_level": "WARNING",
        # One connection per concurrent caller, like the proxy's pool at 32 sessions.
        "sys_db_pool_size": args.pool_size,
    }
    DBOS(config=config)
    DBOS.launch()
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", args.port)
    await site.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    print(f"dbos anchor on 127.0.0.1:{args.port}", flush=True)
    try:
        await stop.wait()
    finally:
        await runner.cleanup()
        DBOS.destroy()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--database-url", required=True, help="DBOS's system database")
    parser.add_argument("--upstream-url", required=True, help="the demo tool server")
    parser.add_argument("--pool-size", type=int, default=40)
    args = parser.parse_args()
    if not HAVE_DBOS:
        print("dbos is not installed (pip install -e '.[server]' --group bench)", file=sys.stderr)
        return MISSING_EXIT
    try:
        import uvloop
    except ImportError:
        asyncio.run(serve(args))
    else:
        uvloop.run(serve(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
