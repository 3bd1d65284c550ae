"""`UndoLogSession`: who is calling (org), which run it is (session id), and the step order.

The session in use is also the *current* session of the task (a context variable): inside
`async with session:` or `async with run_with_session(session):`, a decorated tool called
without `_session` uses it, and so do tasks started from there (asyncio copies the context).
"""

from __future__ import annotations

import contextlib
import contextvars
import uuid
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from blake3 import blake3

from undolog_sdk._compat import add_note
from undolog_sdk.client import UndoLogClient, default_client
from undolog_sdk.compensation import unwind
from undolog_sdk.errors import AwaitingApprovalError, EffectInDoubt, InProgress

__all__ = [
    "UndoLogSession",
    "get_current_session",
    "require_current_session",
    "run_with_session",
]

_current: contextvars.ContextVar[UndoLogSession | None] = contextvars.ContextVar(
    "undolog_current_session", default=None
)


def get_current_session() -> UndoLogSession | None:
    """The session of the running task, or None outside any session block."""
    return _current.get()


def require_current_session() -> UndoLogSession:
    """The session of the running task.

    Raises:
        RuntimeError: outside any session block.
    """
    session = _current.get()
    if session is None:
        raise RuntimeError(
            "no current UndoLog session: run the agent inside `async with "
            "run_with_session(UndoLogSession(org_id=...))` (or pass `_session=`)"
        )
    return session


@contextlib.asynccontextmanager
async def run_with_session(session: UndoLogSession) -> AsyncIterator[UndoLogSession]:
    """Run the block with `session` as the current session, and close it as `async with
    session` does (see `UndoLogSession.__aexit__` for when it completes)."""
    async with session:
        yield session


# Steps of calls keyed on a framework's tool-call id: the upper half of the uint32 range, which
# the counter (1, 2, 3...) never reaches, so the two kinds of step never meet in one session.
KEYED_STEP_BASE = 0x8000_0000
_KEYED_STEP_DOMAIN = b"undolog-tool-call-id\x00"


def _new_session_id() -> str:
    return str(uuid.uuid4())


@dataclass
class UndoLogSession:
    """Async context manager for one agent run.

    The step counter orders the session's calls: an agent that restarts with the same
    `session_id` and repeats its calls in the same order gets the recorded results back.

    Attributes:
        org_id: organisation that scopes every intercepted call.
        session_id: a UUID v4 string, generated once per session unless given.
    """

    org_id: str
    session_id: str = field(default_factory=_new_session_id)
    _step_index: int = field(default=0, repr=False)
    client: UndoLogClient | None = field(default=None, repr=False, compare=False)
    """The client used to close the session; by default the one its first tool call used."""
    _used: bool = field(default=False, init=False, repr=False, compare=False)
    _rolled_back: bool = field(default=False, init=False, repr=False, compare=False)
    _awaiting: dict[str, str] = field(default_factory=dict, init=False, repr=False, compare=False)
    """Calls that wait for approval: call signature → approval id (until that call runs)."""
    _tokens: list[contextvars.Token[UndoLogSession | None]] = field(
        default_factory=list, init=False, repr=False, compare=False
    )

    async def __aenter__(self) -> UndoLogSession:
        self._tokens.append(_current.set(self))
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc_val: BaseException | None,
        exc_tb: object | None,
    ) -> None:
        """When a session block ends, the session is:

        - *completed* when the block ends normally and no call of it waits for approval;
        - *left open* when the block ends normally while a call waits for approval (the
          caller caught `AwaitingApprovalError`), or is left by an error that means "not
          now" — `AwaitingApprovalError`, `InProgress`, `EffectInDoubt`: resume it with the
          same session id once the call can go on; a pending approval is never rejected by
          leaving the block;
        - *rolled back* when the block raises any other exception (which then propagates).

        A session none of whose calls reached the proxy, or that was rolled back inside the
        block, is left as it is.
        """
        if self._tokens:
            _current.reset(self._tokens.pop())
        if not self._used or self._rolled_back:
            return None
        if isinstance(exc_val, AwaitingApprovalError | InProgress | EffectInDoubt):
            return None
        if exc_val is None:
            if self._awaiting:  # an approval is pending: completing would withdraw it
                return None
            await self._client().complete_session(self.org_id, self.session_id)
            return None
        if isinstance(exc_val, Exception):
            try:
                await self.rollback()
            except Exception as rollback_exc:  # keep the block's own error as the one raised
                add_note(exc_val, f"UndoLog rollback did not finish: {rollback_exc!r}")
        return None

    async def rollback(self) -> str:
        """Undo what this session did, newest first; returns the outcome
        (`"compensated"` or `"empty_undo_stack"`).

        Raises:
            CompensationFailed: a compensation exhausted its retries; an operator must retry
                or resolve it (`undolog undo retry|resolve`).
            EffectInDoubt: a call's outcome is unknown; an operator must resolve it first.
        """
        self._rolled_back = True
        return await unwind(self._client(), self.org_id, self.session_id)

    async def undo(
        self,
        *,
        entries: Sequence[str] | None = None,
        after_step: int | None = None,
        force: bool = False,
    ) -> str:
        """Undo chosen calls of this session, newest first, and keep it open: the undo
        entries `entries`, or every entry of a call after step `after_step`. Returns the
        outcome (`"compensated"` or `"empty_undo_stack"`).

        Raises:
            DependentEffects: later calls that may rely on the chosen ones would stay in
                place (their ids in `dependents`); pass `force=True` to undo anyway.
            CompensationFailed: a compensation exhausted its retries.
            EffectInDoubt: a chosen call's outcome is unknown; an operator must resolve it.
        """
        selection: dict[str, Any] = {"force": force}
        if entries is not None:
            selection["entries"] = list(entries)
        if after_step is not None:
            selection["after_step"] = after_step
        return await unwind(self._client(), self.org_id, self.session_id, selection)

    def _client(self) -> UndoLogClient:
        if self.client is None:
            self.client = default_client()
        return self.client

    def next_step(self) -> int:
        """Advance and return the next step index: 1, then 2, 3, ..."""
        self._step_index += 1
        return self._step_index

    def step_for_call(self, call_id: str) -> int:
        """The step of the tool call a framework names `call_id` (the model's tool-call id):
        the same in every process, so a run resumed from the framework's saved state, or
        restarted, signs the call as before. The counter is left alone.

        It is `2**31` plus 31 bits of the BLAKE3 hash of the id, so it never meets a step of
        the counter; two ids of one session with the same 31 bits would share a step, which
        matters only when they also call the same tool with the same arguments (the later
        call would replay the earlier one's result). See docs/sdk.md, "Steps from a
        framework's call ids".

        Raises:
            ValueError: an empty call id.
        """
        if not call_id:
            raise ValueError("a tool-call id must not be empty")
        digest = blake3(_KEYED_STEP_DOMAIN + call_id.encode("utf-8")).digest(length=4)
        return KEYED_STEP_BASE | (int.from_bytes(digest, "little") & 0x7FFF_FFFF)

    def _give_back_step(self, step: int) -> None:
        """Un-take `step` if it is still the latest: a call that did not complete (awaiting
        approval, in progress, failed) keeps its step for the retry."""
        if self._step_index == step:
            self._step_index = step - 1
