"""PostgreSQL group commit of new calls: concurrent `execute_new` calls share a transaction.

A new call writes its intent (session touch, effect, undo entry, event) in one call of the
`undolog_execute_new` function: one statement, one transaction, one WAL flush. When calls
wait for one another, they go as one statement over the same function (the parameters of
each as arrays, `unnest` ... `CROSS JOIN LATERAL`): one round trip, one transaction and one
WAL flush for all of them.

- A call that finds fewer than `LANES` statements out goes alone, at once, as before: a lone
  caller waits for nobody.
- Calls that come while `LANES` statements are out wait for one of them to come back, then
  go together (up to `MAX_BATCH`), ordered by (org, session, signature): every batch locks
  its session rows in that order, so batches (of this process or others) do not deadlock on
  them.
- Each caller is answered after the commit that holds its writes: an acknowledged call is
  on disk (`synchronous_commit` as configured: on).
- Within a batch each call is exactly what it is alone: the function runs once per call, in
  order, and each of its statements sees the writes of the calls before it (a duplicate of
  a call earlier in the batch finds its effect: "exists").
- A batch the server refuses (an error in one call rolls the whole statement back: nothing of
  it was written) is sent again one call at a time, so each call gets its own answer and one
  failing call does not fail the others. A connection lost under a batch is not retried
  (the batch may have committed): each of its callers gets the error, as a lone call does.
- A caller cancelled while it waits does not stop the others: a call not yet sent is left
  out; one already sent completes with its batch (as a lone call that was sent does).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import asyncpg

__all__ = ["LANES", "MAX_BATCH", "NewCallGroup", "Shared"]

# The most calls one statement carries.
MAX_BATCH = 64
# How many statements may be out at once (alone or batches) before calls wait to go together:
# measured at 32 sessions on 2 cores, 4 did more new calls/s than 1 (one batch at a time
# leaves the server idle while it flushes) and than 20 (no grouping). docs/performance.md.
LANES = 4

# `undolog_execute_new`'s parameters (migration 20), in order: the per-call ones with their
# types, and `None` where a parameter is the same for every call of a batch (`Shared`).
_PER_CALL = (
    "bigint", "text", "text", "text", "bigint", "text", "text", "text", "text", "text", "text",
    "text", "integer", "bigint", "bigint", "bigint", "text", "text", "text", "text", "text",
    "text", "integer", "integer", "bigint", "text", "text",
)  # fmt: skip
_PER_CALL_TAIL = ("text", "text", "boolean")  # replay payload, owner, owner only

# (replay states, replay event type, the active session state, the touch interval)
Shared = tuple[tuple[str, ...], str, str, int]


def _single_sql() -> str:
    marks = ", ".join(f"${i}" for i in range(1, 35))
    return f"SELECT * FROM undolog_execute_new({marks})"


def _batch_sql() -> str:
    types = (*_PER_CALL, *_PER_CALL_TAIL)
    arrays = ", ".join(f"${i + 1}::{t}[]" for i, t in enumerate(types))
    columns = ", ".join(f"c{i}" for i in range(len(types)))
    head = ", ".join(f"b.c{i}" for i in range(len(_PER_CALL)))
    n = len(types)
    tail = ", ".join(f"b.c{i}" for i in range(len(_PER_CALL), n))
    return (
        f"SELECT b.n, r.* FROM unnest({arrays}) WITH ORDINALITY AS b({columns}, n) "
        f"CROSS JOIN LATERAL undolog_execute_new({head}, ${n + 1}::text[], ${n + 2}, {tail}, "
        f"${n + 3}, ${n + 4}::bigint) AS r ORDER BY b.n"
    )


SINGLE_SQL = _single_sql()
_BATCH_SQL = _batch_sql()


def single_args(args: Sequence[Any], shared: Shared) -> list[Any]:
    """The single statement's parameters: one call's, with the shared ones in place."""
    states, replay_type, active, touch_us = shared
    head = len(_PER_CALL)
    return [*args[:head], list(states), replay_type, *args[head:], active, touch_us]


@dataclass
class _Waiting:
    key: tuple[str, str, str]
    args: Sequence[Any]
    shared: Shared
    future: asyncio.Future[Sequence[Any]] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )


class NewCallGroup:
    """Sends `undolog_execute_new` calls, alone or, when they wait for one another, together.

    `lanes`: how many statements may be out at once. `statements` counts the statements sent
    (each one transaction, one WAL flush) and `calls` the calls they carried: for tests and
    measurements.
    """

    def __init__(self, pool: asyncpg.Pool, *, lanes: int = LANES) -> None:
        self._pool = pool
        self._queue: list[_Waiting] = []
        self.lanes = max(1, lanes)
        self._out = 0  # statements out (alone or a batch), at most `lanes`
        self._tasks: set[asyncio.Task[None]] = set()
        self.statements = 0
        self.calls = 0

    async def run(
        self, key: tuple[str, str, str], args: Sequence[Any], shared: Shared
    ) -> Sequence[Any]:
        """One call's row of `undolog_execute_new`; raises what the driver raises."""
        if self._out < self.lanes:
            self._out += 1
            try:
                return await self._alone(args, shared)
            finally:
                self._hand_on()
        waiting = _Waiting(key, args, shared)
        self._queue.append(waiting)
        return await waiting.future

    async def _alone(self, args: Sequence[Any], shared: Shared) -> Sequence[Any]:
        self.statements += 1
        self.calls += 1
        async with self._pool.acquire() as conn:
            row = await conn.fetchrow(SINGLE_SQL, *single_args(args, shared))
        assert row is not None
        return tuple(row)

    def _hand_on(self) -> None:
        """A statement is back: its lane sends what waited, or is free for a call alone."""
        self._queue = [w for w in self._queue if not w.future.done()]
        if not self._queue:
            self._out -= 1
            return
        task = asyncio.get_running_loop().create_task(self._drain())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _drain(self) -> None:
        """Send the waiting calls, a batch at a time, until none waits."""
        batch: list[_Waiting] = []
        try:
            while True:
                self._queue = [w for w in self._queue if not w.future.done()]
                if not self._queue:
                    self._out -= 1
                    return
                shared = self._queue[0].shared
                batch = [w for w in self._queue if w.shared == shared][:MAX_BATCH]
                taken = {id(w) for w in batch}
                self._queue = [w for w in self._queue if id(w) not in taken]
                batch.sort(key=lambda w: w.key)
                results = await self._send(batch, shared)
                for waiting, result in zip(batch, results, strict=True):
                    if waiting.future.done():
                        continue
                    if isinstance(result, BaseException):
                        waiting.future.set_exception(result)
                    else:
                        waiting.future.set_result(result)
        except BaseException as exc:  # cancelled (the store closes): nobody is left waiting
            for waiting in (*batch, *self._queue):
                if waiting.future.done():
                    continue
                if isinstance(exc, asyncio.CancelledError):
                    waiting.future.cancel()
                else:
                    waiting.future.set_exception(exc)
            self._queue = []
            self._out -= 1
            raise

    async def _send(
        self, batch: list[_Waiting], shared: Shared
    ) -> list[Sequence[Any] | BaseException]:
        if len(batch) == 1:
            try:
                return [await self._alone(batch[0].args, shared)]
            except Exception as exc:
                return [exc]
        try:
            rows = await self._together(batch, shared)
        except asyncpg.PostgresError:
            # Refused by the server: the statement was rolled back, nothing of it is written.
            # Each call alone, so that each gets its own answer.
            results: list[Sequence[Any] | BaseException] = []
            for waiting in batch:
                try:
                    results.append(await self._alone(waiting.args, shared))
                except Exception as exc:
                    results.append(exc)
            return results
        except Exception as exc:
            return [exc] * len(batch)
        return list(rows)

    async def _together(self, batch: list[_Waiting], shared: Shared) -> list[Sequence[Any]]:
        columns = [list(column) for column in zip(*(w.args for w in batch), strict=True)]
        states, replay_type, active, touch_us = shared
        self.statements += 1
        self.calls += len(batch)
        async with self._pool.acquire() as conn:
            rows = await conn.fetch(
                _BATCH_SQL, *columns, list(states), replay_type, active, touch_us
            )
        # One row per call (every way out of the function returns one), numbered from 1.
        by_n = {int(row[0]): tuple(row[1:]) for row in rows}
        return [by_n[i + 1] for i in range(len(batch))]
