"""The fault suite's tool server: it counts every real execution in an fsync'd file.

The demo tool server counts in memory, which is enough while it outlives everything else. The
fault suite wants the count to be evidence that survives the crash of anything, so each real
execution appends one JSON line (tool, idempotency key, logical call, result) to a file and
fsyncs it before the answer is sent: a line exists for every execution a client may have seen.

Tools (all take `{"call": "<logical call id>", "seconds": <optional delay>}`; a compensation
takes its forward call's id from `original_args` and counts as the logical call `undo:<id>`):

- `write` (and `kwrite`, the same tool under a second name, with another undo): not
  idempotent. Every request is a new execution (and a new result).
- `iwrite`: honours the `Idempotency-Key`: a repeated key gets the first result back (waiting
  for it while it still runs) and is not an execution. Registered `idempotent_upstream`.
- `unwrite` / `iunwrite`: the compensations of either, with the same two behaviours.

`seconds` delays the tool before it acts: the long-running call is the behaviour under test.
`GET /inflight` says how many requests are being served, so a test can wait for a tool that
still runs after its caller gave up before it counts executions.
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

__all__ = ["IDEMPOTENT", "TOOLS", "ExecutionLog", "create_counting_app"]

IDEMPOTENT = frozenset({"iwrite", "iunwrite"})
TOOLS = frozenset({"write", "kwrite", "unwrite"}) | IDEMPOTENT

_JSON = "application/json"


@dataclass(frozen=True)
class ExecutionLog:
    """The file of executions, one JSON object per line, and what the tests ask of it."""

    path: Path

    def lines(self) -> list[dict[str, Any]]:
        if not self.path.exists():
            return []
        with self.path.open("rb") as f:
            return [orjson.loads(line) for line in f if line.strip()]

    def per_key(self, tool: str | None = None) -> Counter[str]:
        """How many times each idempotency key really ran (`tool`, or any tool)."""
        return Counter(e["key"] for e in self.lines() if tool is None or e["tool"] == tool)

    def per_call(self, tools: frozenset[str] | None = None) -> Counter[str]:
        """How many times each logical call (the `call` argument) really ran."""
        return Counter(e["call"] for e in self.lines() if tools is None or e["tool"] in tools)

    def duplicates(self, tools: frozenset[str], sessions: set[str] | None = None) -> int:
        """Executions beyond the first, per key and per logical call, of `tools` (in
        `sessions`, or all)."""
        lines = [e for e in self.lines() if e["tool"] in tools
                 and (sessions is None or e["session_id"] in sessions)]  # fmt: skip
        by_key = Counter(e["key"] for e in lines)
        by_call = Counter(e["call"] for e in lines)
        return max(sum(n - 1 for n in by_key.values()), sum(n - 1 for n in by_call.values()))

    def results(self) -> dict[str, list[Any]]:
        """Every result the tool produced, per idempotency key."""
        found: dict[str, list[Any]] = {}
        for e in self.lines():
            found.setdefault(e["key"], []).append(e["result"])
        return found


class _Recorder:
    """Appends and fsyncs one line per execution; one writer at a time across threads."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._seq = 0

    def record(self, tool: str, key: str, call: str, session_id: Any) -> dict[str, Any]:
        with self._lock:
            self._seq += 1
            result = {"call": call, "tool": tool, "n": self._seq}
            line = {"tool": tool, "key": key, "call": call, "session_id": session_id,
                    "result": result}  # fmt: skip
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                os.write(fd, orjson.dumps(line) + b"\n")
                os.fsync(fd)
            finally:
                os.close(fd)
        return result


def create_counting_app(path: Path) -> Starlette:
    """The tool server, logging executions to `path`."""
    recorder = _Recorder(path)
    done: dict[tuple[str, str], Any] = {}
    running: dict[tuple[str, str], asyncio.Future[Any]] = {}

    async def execute(tool: str, key: str, args: dict[str, Any], session_id: Any) -> Any:
        seconds = args.get("seconds", 0)
        if seconds:
            await asyncio.sleep(float(seconds))  # the slow tool: the behaviour under test
        call = args.get("call") or (args.get("original_args") or {}).get("call", "")
        if tool in ("unwrite", "iunwrite"):
            call = f"undo:{call}"  # an undo is a logical call of its own
        return recorder.record(tool, key, str(call), session_id)

    async def idempotent(tool: str, key: str, args: dict[str, Any], session_id: Any) -> Any:
        if (tool, key) in done:
            return done[(tool, key)]
        if (tool, key) in running:
            return await asyncio.shield(running[(tool, key)])
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        running[(tool, key)] = future
        try:
            result = await execute(tool, key, args, session_id)
        except BaseException as exc:
            future.set_exception(exc)
            future.exception()  # retrieved: no "never retrieved" warning when nobody waits
            raise
        finally:
            running.pop((tool, key), None)
        done[(tool, key)] = result
        future.set_result(result)
        return result

    inflight = [0]

    async def count_inflight(request: Request) -> Response:
        return Response(orjson.dumps({"inflight": inflight[0]}), media_type=_JSON)

    async def call_tool(request: Request) -> Response:
        inflight[0] += 1
        try:
            return await _call_tool(request)
        finally:
            inflight[0] -= 1

    async def _call_tool(request: Request) -> Response:
        tool = request.path_params["name"]
        if tool not in TOOLS:
            body = {"success": False, "output": None, "error": f"unknown tool '{tool}'"}
            return Response(orjson.dumps(body), 404, media_type=_JSON)
        data = orjson.loads(await request.body())
        args = data.get("args") or {}
        key = request.headers.get("idempotency-key") or "-"
        run = idempotent if tool in IDEMPOTENT else execute
        result = await run(tool, key, args, data.get("session_id"))
        body = {"success": True, "output": result, "error": None}
        return Response(orjson.dumps(body), media_type=_JSON)

    return Starlette(
        routes=[
            Route("/tools/{name}", call_tool, methods=["POST"]),
            Route("/inflight", count_inflight),
        ]
    )
