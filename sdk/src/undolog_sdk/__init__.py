"""UndoLog agent SDK: exactly-once, undoable and approval-gated tool calls."""

from importlib import metadata as _metadata

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


def _installed_version() -> str:
    """The `undolog` distribution's version, from its installed metadata (one source:
    pyproject's `version`); `0+unknown` when the sources run without being installed."""
    try:
        return _metadata.version("undolog")
    except _metadata.PackageNotFoundError:
        return "0+unknown"


__version__ = _installed_version()

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
