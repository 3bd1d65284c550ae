"""Whether an answer reached its client: the ASGI side of `services.delivery`.

`AnswerWatch` follows one request: did its final response body go out while the client was
still connected? `WatchedResponse` sends a REST answer under a watch and then tells
`Deliveries` whether the calls it answered were delivered. The REST proxy and the MCP gateway
both use them; the service they report to knows nothing of HTTP.
"""

from __future__ import annotations

import asyncio
import contextlib

from starlette.responses import Response
from starlette.types import Message, Receive, Scope, Send

from undolog.services.delivery import Deliveries, Delivery

__all__ = ["AnswerWatch", "WatchedResponse"]


class AnswerWatch:
    """One request: did its final response body go out while the client was connected?

    `receive` must be past the request body: from here on it only reports a disconnect
    (or, once the response is complete, returns one at once).
    """

    def __init__(self, receive: Receive) -> None:
        self.gone = False  # the client left before the answer was sent
        self.sent = False  # the final body was handed to the server with the client there
        self.left = asyncio.Event()  # set once the connection has closed (a long wait ends)
        self._task = asyncio.create_task(self._watch(receive))

    async def _watch(self, receive: Receive) -> None:
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                if not self.sent:
                    self.gone = True
                self.left.set()
                return

    def wrap(self, send: Send) -> Send:
        async def send_watched(message: Message) -> None:
            if (
                message["type"] == "http.response.body"
                and not message.get("more_body", False)
                and not self.gone
            ):
                self.sent = True
            await send(message)

        return send_watched

    async def close(self) -> None:
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task


class WatchedResponse(Response):
    """A REST answer sent under an `AnswerWatch`; its deliveries are marked once it is out."""

    def __init__(
        self,
        response: Response,
        watch: AnswerWatch,
        deliveries: Deliveries,
        answers: list[Delivery],
    ) -> None:
        super().__init__(response.body, response.status_code)
        self.raw_headers = response.raw_headers
        self._watch = watch
        self._deliveries = deliveries
        self._answers = answers

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, self._watch.wrap(send))
        finally:
            await self._watch.close()
            if self._answers:
                await self._deliveries.finish(self._answers, sent=self._watch.sent)
