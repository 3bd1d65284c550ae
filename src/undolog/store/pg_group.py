"""PostgreSQL group commit: concurrent calls of one function share a statement and a transaction.

A new call writes its intent (session touch, effect, undo entry, event) in one call of the
`undolog_execute_new` function, and its commit (the effect's result and its event) in one
call of `undolog_finish_effect`: each one statement, one transaction, one WAL flush. When
calls of the same function wait for one another, they go as one statement over it (the
parameters of each as arrays, `unnest` ... `CROSS JOIN LATERAL`): one round trip, one
transaction and one WAL flush for all of them. `CallGroup` does that for any such function
(`Function`); the store has one group per function (`NEW_CALL`, `FINISH`).

- A call that finds fewer than `LANES` statements out goes alone, at once, as before: a lone
  caller waits for nobody.
- Calls that come while `LANES` statements are out wait for one of them to come back, then
  go together (up to `MAX_BATCH`), ordered by their key (a new call: org, session,
  signature; a finish: org, effect): every batch locks its rows in that order, so batches
  (of this process or others) do not deadlock on them.
- Each caller is answered after the commit that holds its writes: an acknowledged call is
  on disk (`synchronous_commit` as configured: on).
- Within a batch each call is exactly what it is alone: the function runs once per call, in
  order, and each of its statements sees the writes of the calls before it (a duplicate of
  a new call earlier in the batch finds its effect: "exists"; a second finish of an effect
  finds it finished: no row).
- A batch the server refuses (an error in one call rolls the whole statement back: nothing of
  it was written) is sent again one call at a time, so each call gets its own answer and one
  failing call does not fail the others. A connection lost under a batch is not retried
  (the batch may have committed), nor one the server ends under it (a terminated backend, a
  shutdown: no call of the batch caused it): each of its callers gets the error, as a lone
  call does.
- A caller cancelled while it waits does not stop the others: a call not yet sent is left
  out; one already sent completes with its batch (as a lone call that was sent does).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import asyncpg

from undolog.store._sql.rows import EFFECT

__all__ = ["FINISH", "LANES", "MAX_BATCH", "NEW_CALL", "CallGroup", "Function", "Shared"]

# The most calls one statement carries.
MAX_BATCH = 64
# How many statements may be out at once (alone or batches) before calls wait to go together:
# measured at 32 sessions on 2 cores, 4 did more new calls/s than 1 (one batch at a time
# leaves the server idle while it flushes) and than 20 (no grouping). docs/performance.md.
LANES = 4


class Shared(str):
    """The SQL type of a parameter that is the same for every call of a batch."""

    __slots__ = ()


@dataclass(frozen=True)
class Function:
    """A set-returning SQL function that a group calls once per call.

    `params`: its parameters' SQL types in order; a `Shared` one takes the call's next
    shared value, any other the call's next own argument. `columns`: the output columns a
    call answers with (empty: all)."""

    name: str
    params: tuple[str, ...]
    columns: tuple[str, ...] = ()

    def single_sql(self) -> str:
        marks = ", ".join(f"${i}" for i in range(1, len(self.params) + 1))
        return f"SELECT {', '.join(self.columns) or '*'} FROM {self.name}({marks})"

    def single_args(self, args: Sequence[Any], shared: Sequence[Any]) -> list[Any]:
        """One call's parameters in the function's order, the shared ones in place."""
        own, common = iter(args), iter(_bound(shared))
        return [next(common) if isinstance(p, Shared) else next(own) for p in self.params]

    def batch_sql(self) -> str:
        """Several calls: their own parameters as arrays ($1, ...), then the shared ones;
        the function runs per call in array order, and each row is numbered by its call."""
        own = [p for p in self.params if not isinstance(p, Shared)]
        arrays = ", ".join(f"${i}::{t}[]" for i, t in enumerate(own, 1))
        names = ", ".join(f"c{i}" for i in range(len(own)))
        call, column, mark = [], 0, len(own)
        for p in self.params:
            if isinstance(p, Shared):
                mark += 1
                call.append(f"${mark}::{p}")
            else:
                call.append(f"b.c{column}")
                column += 1
        out = ", ".join(f"r.{c}" for c in self.columns) or "r.*"
        return (
            f"SELECT b.n, {out} FROM unnest({arrays}) WITH ORDINALITY AS b({names}, n) "
            f"CROSS JOIN LATERAL {self.name}({', '.join(call)}) AS r ORDER BY b.n"
        )

    def batch_args(self, calls: Sequence[Sequence[Any]], shared: Sequence[Any]) -> list[Any]:
        columns = [list(column) for column in zip(*calls, strict=True)]
        return [*columns, *_bound(shared)]


def _bound(shared: Sequence[Any]) -> list[Any]:
    """Shared values as the driver takes them: a tuple (hashable, to compare) as a list."""
    return [list(v) if isinstance(v, tuple) else v for v in shared]


# `undolog_execute_new` (migration 20). A call's own: the lock key, the effect, its event
# and its undo entry, then the replay payload, owner and owner-only flag; shared: the replay
# states and event type, the active session state and the touch interval.
NEW_CALL = Function(
    "undolog_execute_new",
    (
        "bigint", "text", "text", "text", "bigint", "text", "text", "text", "text", "text",
        "text", "text", "integer", "bigint", "bigint", "bigint", "text", "text", "text", "text",
        "text", "text", "integer", "integer", "bigint", "text", "text",
        Shared("text[]"), Shared("text"),
        "text", "text", "boolean",
        Shared("text"), Shared("bigint"),
    ),
)  # fmt: skip

# `undolog_finish_effect` (migration 22). A call's own: org, effect, target state, result,
# error, time, event type, extra payload; shared: the states it may finish from and the mode
# of a runner that reports its own calls. It answers the effect's row, or none.
FINISH = Function(
    "undolog_finish_effect",
    ("text", "text", "text", "text", "text", "bigint", "text", "text",
     Shared("text[]"), Shared("text")),
    EFFECT.names,
)  # fmt: skip

# SQLSTATEs with which the server ends the connection rather than refuse a statement: the
# connection exceptions (class 08) and the shutdowns of operator intervention (57P01 admin
# shutdown, 57P02 crash shutdown, 57P03 cannot connect now, ...; not 57014, a cancel).
_CONNECTION_ENDED = ("08", "57P")


def _connection_ended(exc: asyncpg.PostgresError) -> bool:
    """The batch's connection was ended under it: no call of it made it fail, and none is
    sent again (each caller gets the error, as a lone call would)."""
    return (exc.sqlstate or "").startswith(_CONNECTION_ENDED)


# A call's answer: the function's row, or None when it returned none.
Row = tuple[Any, ...] | None


@dataclass
class _Waiting:
    key: tuple[str, ...]
    args: Sequence[Any]
    shared: tuple[Any, ...]
    future: asyncio.Future[Row] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )


class CallGroup:
    """Sends calls of one `Function`, alone or, when they wait for one another, together.

    `lanes`: how many statements may be out at once. `statements` counts the statements sent
    (each one transaction, one WAL flush) and `calls` the calls they carried: for tests and
    measurements.
    """

    def __init__(self, pool: asyncpg.Pool, function: Function, *, lanes: int = LANES) -> None:
        self._pool = pool
        self._function = function
        self._single_sql = function.single_sql()
        self._batch_sql = function.batch_sql()
        self._queue: list[_Waiting] = []
        self.lanes = max(1, lanes)
        self._out = 0  # statements out (alone or a batch), at most `lanes`
        self._tasks: set[asyncio.Task[None]] = set()
        self.statements = 0
        self.calls = 0

    async def run(self, key: tuple[str, ...], args: Sequence[Any], shared: tuple[Any, ...]) -> Row:
        """One call's row (None: the function returned none); raises what the driver raises.

        `key` orders the calls of a batch. `shared`: the values of the function's `Shared`
        parameters, in order (tuples, not lists: calls go together only when these are
        equal)."""
        if self._out < self.lanes:
            self._out += 1
            try:
                return await self._alone(args, shared)
            finally:
                self._hand_on()
        waiting = _Waiting(key, args, shared)
        self._queue.append(waiting)
        return await waiting.future

    async def _alone(self, args: Sequence[Any], shared: tuple[Any, ...]) -> Row:
        self.statements += 1
        self.calls += 1
        async with self._pool.acquire() as conn:
            row = await conn.fetchrow(self._single_sql, *self._function.single_args(args, shared))
        return tuple(row) if row is not None else None

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
        self, batch: list[_Waiting], shared: tuple[Any, ...]
    ) -> list[Row | BaseException]:
        if len(batch) == 1:
            try:
                return [await self._alone(batch[0].args, shared)]
            except Exception as exc:
                return [exc]
        try:
            rows = await self._together(batch, shared)
        except asyncpg.PostgresError as exc:
            if _connection_ended(exc):
                return [exc] * len(batch)
            # Refused by the server: the statement was rolled back, nothing of it is written.
            # Each call alone, so that each gets its own answer.
            results: list[Row | BaseException] = []
            for waiting in batch:
                try:
                    results.append(await self._alone(waiting.args, shared))
                except Exception as exc:
                    results.append(exc)
            return results
        except Exception as exc:
            return [exc] * len(batch)
        return list(rows)

    async def _together(self, batch: list[_Waiting], shared: tuple[Any, ...]) -> list[Row]:
        self.statements += 1
        self.calls += len(batch)
        args = self._function.batch_args([w.args for w in batch], shared)
        async with self._pool.acquire() as conn:
            rows = await conn.fetch(self._batch_sql, *args)
        # The rows of each call, numbered from 1; a call whose function returned none has none.
        by_n = {int(row[0]): tuple(row[1:]) for row in rows}
        return [by_n.get(i) for i in range(1, len(batch) + 1)]
