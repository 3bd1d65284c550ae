"""The public names of `undolog_sdk` and its modules are pinned: adding one is a decision.

The module paths and names are those of the python-sdk reference; the extras (`ProxyError`,
`UndoLogError`, `current_effect_id`, the error tree) are DESIGN.md's additions.
"""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

import undolog_sdk

EXPORTS: dict[str, list[str]] = {
    "undolog_sdk": [
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
    ],
    "undolog_sdk.client": ["InterceptResponse", "ProxyError", "UndoLogClient"],
    "undolog_sdk.compensation": ["compensation", "registered_compensation", "unwind"],
    "undolog_sdk.session": [
        "UndoLogSession",
        "get_current_session",
        "require_current_session",
        "run_with_session",
    ],
    "undolog_sdk.decorators": [
        "AwaitingApprovalError",
        "current_effect_id",
        "undolog_tool",
        "wrap_tools",
    ],
    "undolog_sdk.testing": [
        "CompensationNotIdempotent",
        "RecordedCall",
        "RollbackReport",
        "RollbackStep",
        "check_idempotent",
        "rollback",
    ],
    "undolog_sdk.tier": ["CompensationDescriptor", "TierMismatchWarning", "ToolTier"],
    "undolog_sdk.signature": ["call_signature", "canonical_json", "signature_of_canonical"],
    "undolog_sdk.upstream": [
        "EFFECT_HEADER",
        "MAX_FUTURE_SECONDS",
        "MAX_PAST_SECONDS",
        "ORG_HEADER",
        "SIGNATURE_HEADER",
        "SIGNATURE_VERSION",
        "TIMESTAMP_HEADER",
        "TOOL_HEADER",
        "VerifiedRequest",
        "sign_request",
        "signed_headers",
        "verify_request",
    ],
    "undolog_sdk.wire": [
        "ApprovalStatus",
        "CallStatus",
        "EffectState",
        "EventType",
        "ExecutionMode",
        "Outcome",
        "RollbackOutcome",
        "SessionState",
        "UndoState",
        "scrub",
        "unstorable",
    ],
    "undolog_sdk.errors": [
        "AdvisoryLockTimeout",
        "ApprovalAlreadyResolved",
        "ApprovalArgsChanged",
        "ApprovalRejected",
        "ApprovalTimedOut",
        "AuthFailed",
        "AuthMissing",
        "ClaimNotHeld",
        "CommitFailed",
        "CompensationFailed",
        "CompensationRegisteredTooLate",
        "Database",
        "DependentEffects",
        "DuplicateSignature",
        "EffectInDoubt",
        "EmptyUndoStack",
        "Forbidden",
        "InProgress",
        "InterceptFailed",
        "Internal",
        "InvalidRequest",
        "InvalidStateTransition",
        "InvalidUpstreamSignature",
        "MethodNotAllowed",
        "NotExecuting",
        "NotFound",
        "PayloadTooLarge",
        "PolicyDenied",
        "RateLimited",
        "Serialization",
        "SessionClosed",
        "ToolError",
        "ToolNotRegistered",
        "UndoLogError",
        "error_class_for_code",
    ],
}

# Where the reference says each name lives.
REFERENCE_PATHS = {
    "UndoLogClient": "undolog_sdk.client",
    "InterceptResponse": "undolog_sdk.client",
    "UndoLogSession": "undolog_sdk.session",
    "undolog_tool": "undolog_sdk.decorators",
    "AwaitingApprovalError": "undolog_sdk.decorators",
    "ToolTier": "undolog_sdk.tier",
    "CompensationDescriptor": "undolog_sdk.tier",
    "call_signature": "undolog_sdk.signature",
    "canonical_json": "undolog_sdk.signature",
}


@pytest.mark.parametrize("module_name", sorted(EXPORTS))
def test_each_module_exports_exactly_the_pinned_names(module_name: str) -> None:
    module = importlib.import_module(module_name)
    assert module.__all__ == EXPORTS[module_name]


@pytest.mark.parametrize("module_name", sorted(EXPORTS))
def test_every_exported_name_exists_and_all_is_sorted(module_name: str) -> None:
    module = importlib.import_module(module_name)
    assert module.__all__ == sorted(module.__all__)
    for name in module.__all__:
        assert hasattr(module, name), f"{module_name}.{name}"


@pytest.mark.parametrize(("name", "module_name"), sorted(REFERENCE_PATHS.items()))
def test_reference_names_live_at_their_reference_module_paths(name: str, module_name: str) -> None:
    module = importlib.import_module(module_name)
    obj = getattr(module, name)
    assert obj.__module__ == module_name
    assert getattr(undolog_sdk, name) is obj


def test_awaiting_approval_error_is_a_runtime_error() -> None:
    assert issubclass(undolog_sdk.AwaitingApprovalError, RuntimeError)


def test_proxy_error_is_an_httpx_status_error() -> None:
    import httpx

    assert issubclass(undolog_sdk.ProxyError, httpx.HTTPStatusError)


def test_importing_the_sdk_never_imports_the_server() -> None:
    code = (
        "import sys, undolog_sdk, undolog_sdk.errors;"
        "bad = sorted(m for m in sys.modules if m == 'undolog' or m.startswith('undolog.'));"
        "print(bad); sys.exit(1 if bad else 0)"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_compensation_decorator_is_imported_from_its_module_not_the_package() -> None:
    """Re-exporting `compensation` from `undolog_sdk` would shadow the submodule of the same
    name: `import undolog_sdk.compensation as m` would then bind the function."""
    import undolog_sdk.compensation as module

    assert module is importlib.import_module("undolog_sdk.compensation")
    assert callable(module.compensation)
    assert "compensation" not in undolog_sdk.__all__
