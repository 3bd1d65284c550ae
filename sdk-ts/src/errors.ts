/**
 * The UndoLog error tree, mapped from the wire codes of the proxy's error answers
 * (`{"code", "message", ...fields}`): the same names and codes as the Python SDK's
 * `undolog_sdk.errors`. Every error carries the wire `code`, the HTTP `status` and the answer's
 * other `fields`; `retryable` says whether the same call may simply be sent again.
 */

export class UndoLogError extends Error {
  static readonly code: string = "internal_error";
  readonly code: string;
  readonly status: number;
  readonly fields: Record<string, unknown>;
  readonly retryable: boolean;
  constructor(message: string, status = 500, fields: Record<string, unknown> = {}, code?: string) {
    super(message);
    this.name = new.target.name;
    this.code = code ?? (new.target as typeof UndoLogError).code;
    this.status = status;
    this.fields = fields;
    this.retryable = RETRYABLE.has(this.code);
  }
  /** Seconds the proxy asks the caller to wait before sending the call again, if it says. */
  get retryAfter(): number | undefined {
    const value = this.fields.retry_after;
    return typeof value === "number" ? value : undefined;
  }
}

const RETRYABLE = new Set([
  "duplicate_signature",
  "advisory_lock_timeout",
  "database_error",
  "in_progress",
  "rate_limited",
]);

function kind(code: string) {
  return class extends UndoLogError {
    static override readonly code: string = code;
  };
}

export class ToolNotRegistered extends kind("tool_not_registered") {}
export class DuplicateSignature extends kind("duplicate_signature") {}
export class InvalidStateTransition extends kind("invalid_state_transition") {}
export class NotExecuting extends kind("not_executing") {}
export class CompensationFailed extends kind("compensation_failed") {}
export class EmptyUndoStack extends kind("empty_undo_stack") {}
export class CompensationRegisteredTooLate extends kind("compensation_registered_too_late") {}
export class ApprovalAlreadyResolved extends kind("approval_already_resolved") {}
export class ApprovalTimedOut extends kind("approval_timed_out") {}
export class AdvisoryLockTimeout extends kind("advisory_lock_timeout") {}
export class Database extends kind("database_error") {}
export class Serialization extends kind("serialization_error") {}
export class Internal extends kind("internal_error") {}
export class InvalidRequest extends kind("invalid_request") {}
export class AuthFailed extends kind("auth_failed") {}
export class Forbidden extends AuthFailed {
  static override readonly code: string = "forbidden";
}
export class PolicyDenied extends Forbidden {
  static override readonly code: string = "policy_denied";
}
export class NotFound extends kind("not_found") {}
export class MethodNotAllowed extends kind("method_not_allowed") {}
export class PayloadTooLarge extends kind("payload_too_large") {}
export class InProgress extends kind("in_progress") {}
export class ClaimNotHeld extends kind("claim_not_held") {}
export class DependentEffects extends kind("dependent_effects") {}
export class RateLimited extends kind("rate_limited") {}
export class EffectInDoubt extends kind("effect_in_doubt") {}
export class SessionClosed extends kind("session_closed") {}
export class ApprovalRejected extends kind("approval_rejected") {}
export class ApprovalArgsChanged extends kind("approval_args_changed") {}
export class InterceptFailed extends kind("intercept_failed") {}
export class ToolError extends kind("tool_error") {}
export class CommitFailed extends kind("commit_failed") {}

const CLASSES: (typeof UndoLogError)[] = [
  ToolNotRegistered, DuplicateSignature, InvalidStateTransition, NotExecuting,
  CompensationFailed, EmptyUndoStack, CompensationRegisteredTooLate, ApprovalAlreadyResolved,
  ApprovalTimedOut, AdvisoryLockTimeout, Database, Serialization, Internal, InvalidRequest,
  AuthFailed, Forbidden, PolicyDenied, NotFound, MethodNotAllowed, PayloadTooLarge, InProgress,
  ClaimNotHeld, DependentEffects, RateLimited, EffectInDoubt, SessionClosed, ApprovalRejected,
  ApprovalArgsChanged, InterceptFailed, ToolError, CommitFailed,
];

const BY_CODE = new Map<string, typeof UndoLogError>(CLASSES.map((c) => [c.code, c]));

/** The error class of a wire code (`UndoLogError` for a code this SDK does not know). */
export function errorClassForCode(code: string): typeof UndoLogError {
  return BY_CODE.get(code) ?? UndoLogError;
}

/** The error an answer of the proxy stands for. */
export function errorFromAnswer(status: number, body: unknown): UndoLogError {
  const data = (typeof body === "object" && body !== null ? body : {}) as Record<string, unknown>;
  const code = typeof data.code === "string" ? data.code : `http_${status}`;
  const message = typeof data.message === "string" ? data.message : `HTTP ${status}`;
  const { code: _code, message: _message, ...fields } = data;
  const Class = errorClassForCode(code);
  return new Class(message, status, fields, code);
}

/**
 * An IRREVERSIBLE call waits for a person to approve it; its body did not run. Send the same
 * call again (same session, same step, same arguments) once it is approved, or wait for it
 * (`UndoLogClient.waitForApproval`). Not an `UndoLogError`: "not yet", not a failure.
 */
export class AwaitingApprovalError extends Error {
  readonly approvalId: string;
  readonly toolName: string;
  readonly stepIndex: number;
  readonly effectId: string | undefined;
  readonly retryAfter: number | undefined;
  constructor(
    approvalId: string,
    toolName = "",
    stepIndex = 0,
    effectId?: string,
    retryAfter?: number,
  ) {
    super(`tool '${toolName}' (step ${stepIndex}) awaits approval ${approvalId}`);
    this.name = "AwaitingApprovalError";
    this.approvalId = approvalId;
    this.toolName = toolName;
    this.stepIndex = stepIndex;
    this.effectId = effectId;
    this.retryAfter = retryAfter;
  }
}
