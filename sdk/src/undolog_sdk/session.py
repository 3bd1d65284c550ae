"""`UndoLogSession`: who is calling (org), which run it is (session id), and the step order."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from undolog_sdk._compat import add_note

if TYPE_CHECKING:
    from undolog_sdk.client import UndoLogClient

__all__ = ["UndoLogSession"]


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

    async def __aenter__(self) -> UndoLogSession:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc_val: BaseException | None,
        exc_tb: object | None,
    ) -> None:
        """A block that raises rolls the session back (then the exception propagates); one
        that ends normally completes it. A block left by an error that means "not now" —
        `AwaitingApprovalError`, `InProgress`, `EffectInDoubt` — does neither: the session
        stays open, to be resumed with the same session id once the call can go on."""
        from undolog_sdk.decorators import AwaitingApprovalError
        from undolog_sdk.errors import EffectInDoubt, InProgress

        if not self._used or self._rolled_back:
            return None
        if isinstance(exc_val, AwaitingApprovalError | InProgress | EffectInDoubt):
            return None
        if exc_val is None:
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
        from undolog_sdk.compensation import unwind

        self._rolled_back = True
        return await unwind(self._client(), self.org_id, self.session_id)

    def _client(self) -> UndoLogClient:
        if self.client is None:
            from undolog_sdk.decorators import _get_default_client

            self.client = _get_default_client()
        return self.client

    def next_step(self) -> int:
        """Advance and return the next step index: 1, then 2, 3, ..."""
        self._step_index += 1
        return self._step_index

    def _give_back_step(self, step: int) -> None:
        """Un-take `step` if it is still the latest: a call that did not complete (awaiting
        approval, in progress, failed) keeps its step for the retry."""
        if self._step_index == step:
            self._step_index = step - 1
