/** UndoLog for TypeScript agents: the client of an UndoLog proxy (see README.md). */
export {
  asFloat,
  CanonicalJsonError,
  callSignature,
  canonicalJson,
  compareCodePoints,
  Float64,
  formatFloat,
  signatureOfCanonical,
} from "./canonical.js";
export { UndoLogClient } from "./client.js";
export type { Approval, ClientOptions, RollbackAnswer, ToolCall, ToolCallAnswer } from "./client.js";
export * from "./errors.js";
export {
  approvalForCall,
  askCall,
  awaitingError,
  carryOut,
  currentSession,
  isRecorded,
  KEYED_STEP_BASE,
  registerCompensation,
  undologTool,
  UndoLogSession,
  unwind,
} from "./session.js";
export type { AskedCall, CallOptions, Compensation, SessionOptions, ToolOptions, ToolSpec } from "./session.js";
export { compensationDescriptor, stricterTier, ToolTier } from "./tiers.js";
export type { CompensationDescriptor } from "./tiers.js";
