"""UndoLog agent SDK: exactly-once, undoable and approval-gated tool calls."""

from undolog_sdk.errors import UndoLogError
from undolog_sdk.signature import call_signature, canonical_json
from undolog_sdk.tier import CompensationDescriptor, ToolTier

__all__ = [
    "CompensationDescriptor",
    "ToolTier",
    "UndoLogError",
    "call_signature",
    "canonical_json",
]
