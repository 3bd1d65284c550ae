"""A small Server-Sent Events reader for tests: `GET /events` read by a background task.

`EventStream` opens the stream, parses it line by line (RFC: `event:`, `id:`, `data:`, comment
lines starting with `:`, a blank line ends an event) and queues what it reads, so a test can
wait for the next event with a deadline instead of sleeping. The raw lines are kept too, for
tests of the wire format.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from dataclasses import dataclass, field
from typing import Any

import httpx

__all__ = ["EventStream", "SseEvent"]


@dataclass(frozen=True)
class SseEvent:
    event: str | None
    id: str | None
    data: str
    lines: tuple[str, ...]

    @property
    def json(self) -> dict[str, Any]:
        value: dict[str, Any] = json.loads(self.data)
        return value

    @property
    def number(self) -> int:
        assert self.id is not None
        return int(self.id)


@dataclass
class EventStream:
    """`GET path` as an SSE stream; use as `async with EventStream(client) as stream:`."""

    client: httpx.AsyncClient
    path: str = "/events"
    headers: dict[str, str] = field(default_factory=dict)
    params: dict[str, str] = field(default_factory=dict)
    response: httpx.Response | None = None
    raw_lines: list[str] = field(default_factory=list)
    comments: list[str] = field(default_factory=list)
    closed: asyncio.Event = field(default_factory=asyncio.Event)
    _events: asyncio.Queue[SseEvent] = field(default_factory=asyncio.Queue)
    _comment_seen: asyncio.Event = field(default_factory=asyncio.Event)
    _opened: asyncio.Future[httpx.Response] | None = None
    _task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> EventStream:
        self._opened = asyncio.get_running_loop().create_future()
        self._task = asyncio.create_task(self._read())
        self.response = await asyncio.wait_for(asyncio.shield(self._opened), 15)
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, httpx.HTTPError):
                await self._task

    @property
    def status_code(self) -> int:
        assert self.response is not None
        return self.response.status_code

    async def _read(self) -> None:
        assert self._opened is not None
        timeout = httpx.Timeout(15, read=None)
        try:
            async with self.client.stream(
                "GET", self.path, headers=self.headers, params=self.params, timeout=timeout
            ) as response:
                if response.status_code != 200:
                    await response.aread()
                    self._opened.set_result(response)
                    return
                self._opened.set_result(response)
                await self._parse(response)
        except httpx.HTTPError as exc:  # the server went away (kill -9): the stream ends
            if not self._opened.done():
                self._opened.set_exception(exc)
        finally:
            self.closed.set()

    async def _parse(self, response: httpx.Response) -> None:
        fields: dict[str, str] = {}
        data: list[str] = []
        lines: list[str] = []
        async for line in response.aiter_lines():
            self.raw_lines.append(line)
            if line == "":
                if fields or data:
                    self._events.put_nowait(
                        SseEvent(fields.get("event"), fields.get("id"), "\n".join(data),
                                 tuple(lines))
                    )  # fmt: skip
                fields, data, lines = {}, [], []
                continue
            if line.startswith(":"):
                self.comments.append(line)
                self._comment_seen.set()
                continue
            lines.append(line)
            name, _, value = line.partition(":")
            value = value.removeprefix(" ")
            if name == "data":
                data.append(value)
            else:
                fields[name] = value

    async def next(self, within: float = 15.0) -> SseEvent:
        """The next event, or TimeoutError after `within` seconds."""
        return await asyncio.wait_for(self._events.get(), within)

    async def take(self, count: int, within: float = 15.0) -> list[SseEvent]:
        """The next `count` events, all within `within` seconds."""
        async with asyncio.timeout(within):
            return [await self._events.get() for _ in range(count)]

    async def until(self, type_: str, within: float = 15.0) -> list[SseEvent]:
        """Events up to and including the first of type `type_`."""
        seen: list[SseEvent] = []
        async with asyncio.timeout(within):
            while not seen or seen[-1].event != type_:
                seen.append(await self._events.get())
        return seen

    def pending(self) -> list[SseEvent]:
        """Events read but not yet taken, without waiting."""
        items = []
        while not self._events.empty():
            items.append(self._events.get_nowait())
        return items

    async def comment(self, within: float = 15.0) -> str:
        """Wait for a comment line (`: ping`) and return the first one seen."""
        await asyncio.wait_for(self._comment_seen.wait(), within)
        return self.comments[0]
