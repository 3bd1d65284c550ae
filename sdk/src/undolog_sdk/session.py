"""`UndoLogSession`: who is calling (org), which run it is (session id), and the step order."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field

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

    async def __aenter__(self) -> UndoLogSession:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc_val: BaseException | None,
        exc_tb: object | None,
    ) -> None:
        return None

    def next_step(self) -> int:
        """Advance and return the next step index: 1, then 2, 3, ..."""
        self._step_index += 1
        return self._step_index

    def _give_back_step(self, step: int) -> None:
        """Un-take `step` if it is still the latest: a call that did not complete (awaiting
        approval, in progress, failed) keeps its step for the retry."""
        if self._step_index == step:
            self._step_index = step - 1
