"""The UndoLog error tree, shared by the SDK and the server.

Every error has a wire `code` and an HTTP status, so the proxy can answer with the error the
engine raised and the SDK can raise it again on the agent side. The first group mirrors the
error-codes reference variant by variant (names, fields, messages, retryable flag); the second
group is what the proxy's REST API adds.

    UndoLogError
     ├── ToolNotRegistered              404 tool_not_registered
     ├── DuplicateSignature             409 duplicate_signature          (retryable)
     ├── InvalidStateTransition         409 invalid_state_transition
     ├── NotExecuting                   409 not_executing
     ├── CompensationFailed             502 compensation_failed
     ├── EmptyUndoStack                 409 empty_undo_stack             (informational)
     ├── CompensationRegisteredTooLate  500 compensation_registered_too_late
     ├── ApprovalAlreadyResolved        409 approval_already_resolved
     ├── ApprovalTimedOut               409 approval_timed_out
     ├── AdvisoryLockTimeout            503 advisory_lock_timeout        (retryable)
     ├── Database                       503 database_error               (retryable)
     ├── Serialization                  500 serialization_error
     ├── Internal                       500 internal_error
     │
     ├── InvalidRequest                 400 invalid_request
     ├── AuthFailed                     403 auth_failed
     │    ├── AuthMissing               401 auth_failed
     │    ├── InvalidUpstreamSignature  401 auth_failed  (a tool server refusing a call)
     │    └── Forbidden                 403 forbidden
     │         └── PolicyDenied         403 policy_denied
     ├── NotFound                       404 not_found
     ├── MethodNotAllowed               405 method_not_allowed
     ├── PayloadTooLarge                413 payload_too_large
     ├── InProgress                     409 in_progress                  (retryable, retry_after)
     ├── ClaimNotHeld                   409 claim_not_held
     ├── DependentEffects               409 dependent_effects
     ├── RateLimited                    429 rate_limited                 (retryable, retry_after)
     ├── EffectInDoubt                  409 effect_in_doubt
     ├── SessionClosed                  409 session_closed
     ├── ApprovalRejected               409 approval_rejected
     ├── ApprovalArgsChanged            409 approval_args_changed
     ├── InterceptFailed                502 intercept_failed
     ├── ToolError                      502 tool_error
     └── CommitFailed                   502 commit_failed

    AwaitingApprovalError (a RuntimeError, not an UndoLogError: "not yet", not a failure)
"""

from __future__ import annotations

from typing import Any, ClassVar

__all__ = [
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
]


class UndoLogError(Exception):
    """Root of every UndoLog error.

    Attributes:
        code: the machine-readable code used on the wire (`{"code": ...}` in error bodies).
        http_status: the HTTP status the proxy answers with.
        retryable: whether retrying the same call may succeed (error-codes quick reference).
        message: the human-readable message.
    """

    code: ClassVar[str] = "internal_error"
    http_status: ClassVar[int] = 500
    retryable: ClassVar[bool] = False

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def fields(self) -> dict[str, Any]:
        """Structured fields of this error (for logs and error bodies)."""
        return {}


class ToolNotRegistered(UndoLogError):
    code = "tool_not_registered"
    http_status = 404

    def __init__(self, tool_name: str, org_id: str) -> None:
        self.tool_name = tool_name
        self.org_id = org_id
        super().__init__(f"Tool '{tool_name}' is not registered for org '{org_id}'")

    def fields(self) -> dict[str, Any]:
        return {"tool_name": self.tool_name}


class DuplicateSignature(UndoLogError):
    code = "duplicate_signature"
    http_status = 409
    retryable = True

    def __init__(self, signature: str) -> None:
        self.signature = signature
        super().__init__(
            f"Call signature conflict: effect with signature '{signature}' already exists"
        )

    def fields(self) -> dict[str, Any]:
        return {"signature": self.signature}


class InvalidStateTransition(UndoLogError):
    code = "invalid_state_transition"
    http_status = 409

    def __init__(self, effect_id: str, current_state: str, target_state: str) -> None:
        self.effect_id = effect_id
        self.current_state = current_state
        self.target_state = target_state
        super().__init__(
            f"Effect '{effect_id}' is in state '{current_state}', "
            f"cannot transition to '{target_state}'"
        )

    def fields(self) -> dict[str, Any]:
        return {
            "effect_id": self.effect_id,
            "current_state": self.current_state,
            "target_state": self.target_state,
        }


class NotExecuting(UndoLogError):
    code = "not_executing"
    http_status = 409

    def __init__(self, effect_id: str) -> None:
        self.effect_id = effect_id
        super().__init__(f"Cannot commit effect '{effect_id}': not in 'executing' state")

    def fields(self) -> dict[str, Any]:
        return {"effect_id": self.effect_id}


class CompensationFailed(UndoLogError):
    code = "compensation_failed"
    http_status = 502

    def __init__(self, fn_name: str, retries: int, reason: str) -> None:
        self.fn_name = fn_name
        self.retries = retries
        self.reason = reason
        super().__init__(f"Compensation '{fn_name}' failed after {retries} retries: {reason}")

    def fields(self) -> dict[str, Any]:
        return {"fn_name": self.fn_name, "retries": self.retries, "reason": self.reason}


class EmptyUndoStack(UndoLogError):
    code = "empty_undo_stack"
    http_status = 409

    def __init__(self, session_id: str) -> None:
        self.session_id = session_id
        super().__init__(f"Undo stack for session '{session_id}' is empty")

    def fields(self) -> dict[str, Any]:
        return {"session_id": self.session_id}


class CompensationRegisteredTooLate(UndoLogError):
    code = "compensation_registered_too_late"
    http_status = 500

    def __init__(self, effect_id: str) -> None:
        self.effect_id = effect_id
        super().__init__(
            f"Compensation registered after action executed for effect '{effect_id}', "
            "invariant violated"
        )

    def fields(self) -> dict[str, Any]:
        return {"effect_id": self.effect_id}


class ApprovalAlreadyResolved(UndoLogError):
    code = "approval_already_resolved"
    http_status = 409

    def __init__(self, approval_id: str) -> None:
        self.approval_id = approval_id
        super().__init__(f"Approval request '{approval_id}' has already been resolved")

    def fields(self) -> dict[str, Any]:
        return {"approval_id": self.approval_id}


class ApprovalTimedOut(UndoLogError):
    code = "approval_timed_out"
    http_status = 409

    def __init__(self, approval_id: str) -> None:
        self.approval_id = approval_id
        super().__init__(f"Approval request '{approval_id}' timed out")

    def fields(self) -> dict[str, Any]:
        return {"approval_id": self.approval_id}


class AdvisoryLockTimeout(UndoLogError):
    code = "advisory_lock_timeout"
    http_status = 503
    retryable = True

    def __init__(self, signature: str, attempts: int) -> None:
        self.signature = signature
        self.attempts = attempts
        super().__init__(
            f"Could not acquire advisory lock for signature '{signature}' after {attempts} attempts"
        )

    def fields(self) -> dict[str, Any]:
        return {"signature": self.signature, "attempts": self.attempts}


class Database(UndoLogError):
    """A store-level failure: connection lost, constraint violated, deadlock, ..."""

    code = "database_error"
    http_status = 503
    retryable = True

    def __init__(self, detail: str) -> None:
        self.detail = detail
        super().__init__(f"Database error: {detail}")


class Serialization(UndoLogError):
    code = "serialization_error"
    http_status = 500

    def __init__(self, detail: str) -> None:
        self.detail = detail
        super().__init__(f"Serialization error: {detail}")


class Internal(UndoLogError):
    code = "internal_error"
    http_status = 500

    def __init__(self, detail: str) -> None:
        self.detail = detail
        super().__init__(f"Internal error: {detail}")


# --- errors of the proxy's REST API --------------------------------------------------------


class InvalidRequest(UndoLogError):
    code = "invalid_request"
    http_status = 400


class AuthFailed(UndoLogError):
    """The API key is not recognised, or a client-sent org id disagrees with the key's org."""

    code = "auth_failed"
    http_status = 403


class AuthMissing(AuthFailed):
    """No API key was sent."""

    http_status = 401


class InvalidUpstreamSignature(AuthFailed):
    """A tool server could not verify that a request came from UndoLog, for this org, tool,
    body and time (`undolog_sdk.upstream.verify_request`): it must not run the call."""

    http_status = 401


class Forbidden(AuthFailed):
    """The key is valid but its role may not do this (an agent key approving, say)."""

    code = "forbidden"
    http_status = 403


class PolicyDenied(Forbidden):
    """An org's policy rule refused the call before it was recorded (its `deny` action)."""

    code = "policy_denied"
    http_status = 403

    def __init__(self, rule: str, tool_name: str) -> None:
        self.rule = rule
        self.tool_name = tool_name
        super().__init__(f"Tool '{tool_name}' call refused by policy rule '{rule}'")

    def fields(self) -> dict[str, Any]:
        return {"rule": self.rule, "tool_name": self.tool_name}


class NotFound(UndoLogError):
    code = "not_found"
    http_status = 404


class MethodNotAllowed(UndoLogError):
    code = "method_not_allowed"
    http_status = 405


class PayloadTooLarge(UndoLogError):
    code = "payload_too_large"
    http_status = 413


class InProgress(UndoLogError):
    """A concurrent duplicate: the same call is executing under a live lease."""

    code = "in_progress"
    http_status = 409
    retryable = True

    def __init__(self, effect_id: str, retry_after: int) -> None:
        self.effect_id = effect_id
        self.retry_after = retry_after
        super().__init__(f"Effect '{effect_id}' is already executing; retry after {retry_after}s")

    def fields(self) -> dict[str, Any]:
        return {"effect_id": self.effect_id, "retry_after": self.retry_after}


class ClaimNotHeld(UndoLogError):
    """A report on an undo entry (`/complete`, `/fail`) whose claim token is not the entry's
    current one: another runner holds it, or it was claimed again after this claim lapsed."""

    code = "claim_not_held"
    http_status = 409

    def __init__(self, entry_id: str) -> None:
        self.entry_id = entry_id
        super().__init__(
            f"Undo entry '{entry_id}' is not held by this claim token: another runner "
            "claimed it, or it was claimed again after this claim's lease lapsed"
        )

    def fields(self) -> dict[str, Any]:
        return {"entry_id": self.entry_id}


class DependentEffects(UndoLogError):
    """A selective undo would leave later calls that may rely on it (docs/undo.md)."""

    code, http_status = "dependent_effects", 409

    def __init__(self, session_id: str, dependents: list[str]) -> None:
        self.session_id, self.dependents = session_id, dependents
        super().__init__(f"later calls of '{session_id}' may depend on this; undo with force")

    def fields(self) -> dict[str, Any]:
        return {"session_id": self.session_id, "dependents": self.dependents}


class RateLimited(UndoLogError):
    """Too many failed key checks or sign-ins from one client address, or a valid key over
    one of its quotas (tool calls, new sessions, event streams: the body's `quota`)."""

    code = "rate_limited"
    http_status = 429
    retryable = True

    def __init__(self, retry_after: int) -> None:
        self.retry_after = retry_after
        super().__init__(
            f"too many failed authentication attempts from this address; retry after {retry_after}s"
        )

    def fields(self) -> dict[str, Any]:
        return {"retry_after": self.retry_after}


class EffectInDoubt(UndoLogError):
    """The executing lease expired: whether the tool ran is unknown until an operator says."""

    code = "effect_in_doubt"
    http_status = 409

    def __init__(self, effect_id: str, reason: str | None = None) -> None:
        self.effect_id = effect_id
        super().__init__(
            f"Effect '{effect_id}' is in doubt: {reason}"
            if reason
            else f"Effect '{effect_id}' is in doubt: its execution lease expired before it was "
            "committed or failed; an operator must resolve it"
        )

    def fields(self) -> dict[str, Any]:
        return {"effect_id": self.effect_id}


class SessionClosed(UndoLogError):
    code = "session_closed"
    http_status = 409

    def __init__(self, session_id: str, state: str) -> None:
        self.session_id = session_id
        self.state = state
        super().__init__(f"Session '{session_id}' is {state}; it accepts no more calls")

    def fields(self) -> dict[str, Any]:
        return {"session_id": self.session_id, "state": self.state}


class ApprovalRejected(UndoLogError):
    code = "approval_rejected"
    http_status = 409

    def __init__(self, approval_id: str, reason: str | None = None) -> None:
        self.approval_id = approval_id
        self.reason = reason
        suffix = f": {reason}" if reason else ""
        super().__init__(f"Approval request '{approval_id}' was rejected{suffix}")

    def fields(self) -> dict[str, Any]:
        return {"approval_id": self.approval_id, "reason": self.reason}


class ApprovalArgsChanged(UndoLogError):
    """An approval for arguments other than the ones the call would run with: the
    approver's `args_hash` names others, or it names none while another approver's edit is
    on the table (docs/approvals.md). `args_hash` is the hash of the arguments on the table:
    look at them, then approve them by that hash (or send your own `args`)."""

    code, http_status = "approval_args_changed", 409

    def __init__(self, approval_id: str, args_hash: str) -> None:
        self.approval_id, self.args_hash = approval_id, args_hash
        super().__init__(
            f"The arguments of approval request '{approval_id}' are not the ones you approve: "
            "an approver changed them. Review them (GET /approvals/{id}) and approve them by "
            "their args_hash, or send your own args"
        )

    def fields(self) -> dict[str, Any]:
        return {"approval_id": self.approval_id, "args_hash": self.args_hash}


class InterceptFailed(UndoLogError):
    code = "intercept_failed"
    http_status = 502


class ToolError(UndoLogError):
    code = "tool_error"
    http_status = 502


class CommitFailed(UndoLogError):
    code = "commit_failed"
    http_status = 502


_BY_CODE: dict[str, type[UndoLogError]] = {}
for _cls in list(globals().values()):
    if (
        isinstance(_cls, type)
        and issubclass(_cls, UndoLogError)
        and _cls not in (UndoLogError, AuthMissing)
    ):
        _BY_CODE.setdefault(_cls.code, _cls)


def error_class_for_code(code: str) -> type[UndoLogError]:
    """The error class for a wire code (`UndoLogError` for an unknown one)."""
    return _BY_CODE.get(code, UndoLogError)


class AwaitingApprovalError(RuntimeError):
    """An IRREVERSIBLE call waits for a person to approve it; its body did not run.

    Retry the same call (same session, same arguments) once it is approved. Besides the
    reference's fields, `retry_after` carries the proxy's hint (seconds) for when to ask again
    (None when the error was not raised by `@undolog_tool`).
    """

    retry_after: int | None = None

    def __init__(self, approval_id: str, tool_name: str = "", step_index: int = 0) -> None:
        super().__init__(f"tool '{tool_name}' (step {step_index}) awaits approval {approval_id}")
        self.approval_id = approval_id
        self.tool_name = tool_name
        self.step_index = step_index

    def __reduce__(self) -> tuple[Any, ...]:
        # Rebuilt from its fields: `args` holds the message, which __init__ does not take.
        return (type(self), (self.approval_id, self.tool_name, self.step_index), self.__dict__)


# The reference places it in `undolog_sdk.decorators` (python-sdk reference, "Module paths"):
# its repr and pickles name that module, which re-exports it.
AwaitingApprovalError.__module__ = "undolog_sdk.decorators"
