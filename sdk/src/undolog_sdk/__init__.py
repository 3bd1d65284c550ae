"""UndoLog agent SDK: exactly-once, undoable and approval-gated tool calls."""

from undolog_sdk.client import InterceptResponse, ProxyError, UndoLogClient
from undolog_sdk.decorators import (
    AwaitingApprovalError,
    current_effect_id,
    undolog_tool,
    wrap_tools,
)
from undolog_sdk.errors import UndoLogError
from undolog_sdk.session import (
    UndoLogSession,
    get_current_session,
    require_current_session,
    run_with_session,
)
from undolog_sdk.signature import call_signature, canonical_json
from undolog_sdk.tier import CompensationDescriptor, TierMismatchWarning, ToolTier

__all__ = [
    "AwaitingApprovalError",
    "CompensationDescriptor",
    "InterceptResponse",
    "ProxyError",
    "TierMismatchWarning",
    "ToolTier",
    "UndoLogClient",
    "UndoLogError",
    "UndoLogSession",
    "call_signature",
    "canonical_json",
    "current_effect_id",
    "get_current_session",
    "require_current_session",
    "run_with_session",
    "undolog_tool",
    "wrap_tools",
]
