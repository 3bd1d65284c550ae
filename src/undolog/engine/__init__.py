"""The engine: the decision table, the state machines and the operations over a store."""

from undolog.engine.core import Engine
from undolog.engine.decide import Action, decide
from undolog.engine.model import Decision, Outcome, SessionView
from undolog.engine.states import ApprovalStatus, EffectState, SessionState, UndoState

__all__ = [
    "Action",
    "ApprovalStatus",
    "Decision",
    "EffectState",
    "Engine",
    "Outcome",
    "SessionState",
    "SessionView",
    "UndoState",
    "decide",
]
