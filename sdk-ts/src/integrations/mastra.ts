/**
 * UndoLog for Mastra (`@mastra/core`): workflow steps whose call goes through UndoLog, with
 * Mastra's own suspend and resume for approvals.
 *
 * `undologMastraStep({ id, inputSchema, outputSchema, tier, compensation, execute })` is a
 * Mastra step (`createStep`) whose body runs through UndoLog, in the session of the run
 * (`session.run(() => run.start(...))`, or `{ session }`):
 *
 * - **exactly once**: the call is keyed on the workflow run's id and the step's id, which
 *   Mastra keeps in its storage: a run resumed or restarted — in this process or another one
 *   on the same storage — maps the step to its recorded effect, and `execute` does not run
 *   again;
 * - **approval**: a pending IRREVERSIBLE call suspends the step (`suspend()`) with
 *   `{ undolog: { approval_id, tool, args, step_index, session_id } }`
 *   (`undologSuspensions(result)` picks them out). A person decides in UndoLog; `run.resume({
 *   step, resumeData })` (any data) asks UndoLog again: approved, the call runs once; still
 *   pending, the step suspends again; rejected or timed out, the step fails with the reason;
 * - **rollback**: COMPENSABLE steps are undone, newest first, when `session.run` ends with an
 *   error, or by `session.rollback()`.
 *
 * `undologMastraTool(...)` is the same for a Mastra tool (`createTool`) that an agent calls:
 * keyed on the model's tool-call id; a pending approval suspends the tool call when Mastra
 * offers `suspend`, else throws `AwaitingApprovalError` (the agent sees it as the tool's error
 * and may call again once a person decided).
 */
import { createTool } from "@mastra/core/tools";
import { createStep } from "@mastra/core/workflows";

import {
  askCall,
  awaitingError,
  carryOut,
  currentSession,
  isRecorded,
  UndoLogSession,
} from "../session.js";
import type { ToolSpec } from "../session.js";
import { ToolTier } from "../tiers.js";
import type { CompensationDescriptor } from "../tiers.js";

export interface UndoLogMastraStepOptions<I, O> {
  /** The step's id, and the tool's name on the proxy (unless `toolName` says otherwise). */
  id: string;
  toolName?: string;
  description?: string;
  inputSchema: I;
  outputSchema: O;
  tier: ToolTier;
  compensation?: CompensationDescriptor;
  /** The step's body: runs at most once per workflow run. */
  execute: (input: Record<string, unknown>) => Promise<unknown>;
  /** The session (default: the current one). */
  session?: UndoLogSession;
}

/** What an UndoLog suspension carries. */
export interface UndoLogSuspension {
  approval_id: string;
  tool: string;
  args: Record<string, unknown>;
  step_index: number;
  session_id: string;
}

type StepContext = {
  inputData: unknown;
  runId: string;
  resumeData?: unknown;
  suspend: (payload: unknown) => Promise<unknown>;
};

/** A Mastra step for `options`, its call through UndoLog. */
export function undologMastraStep<I, O>(options: UndoLogMastraStepOptions<I, O>) {
  const spec: ToolSpec = {
    name: options.toolName ?? options.id,
    tier: options.tier,
    compensation: options.compensation,
  };
  if (spec.tier === ToolTier.COMPENSABLE && !spec.compensation) {
    throw new Error("a COMPENSABLE step needs a compensation descriptor");
  }
  return createStep({
    id: options.id,
    description: options.description,
    inputSchema: options.inputSchema as never,
    outputSchema: options.outputSchema as never,
    execute: (async ({ inputData, runId, resumeData, suspend }: StepContext) => {
      const session = options.session ?? currentSession();
      if (!session) {
        throw new Error("an UndoLog step runs inside session.run(...), or with { session }");
      }
      const args = (inputData ?? {}) as Record<string, unknown>;
      if (!(await isRecorded(session, spec))) return options.execute(args);
      const asked = await askCall(session, spec, args, `mastra:${runId}:${options.id}`);
      if (asked.answer.status === "pending_approval") {
        const suspension: UndoLogSuspension = {
          approval_id: String(asked.answer.approval_id),
          tool: spec.name,
          args,
          step_index: asked.step,
          session_id: session.sessionId,
        };
        void resumeData; // resumed or not, UndoLog's decision is what counts
        return suspend({ undolog: suspension });
      }
      return carryOut(asked, options.execute);
    }) as never,
  });
}

/** The UndoLog suspensions of a workflow result (its suspended steps' payloads). */
export function undologSuspensions(result: unknown): UndoLogSuspension[] {
  const steps = (result as { steps?: Record<string, { status?: string; suspendPayload?: unknown }> })?.steps ?? {};
  return Object.values(steps)
    .filter((step) => step?.status === "suspended")
    .map((step) => (step.suspendPayload as { undolog?: UndoLogSuspension } | undefined)?.undolog)
    .filter((s): s is UndoLogSuspension => s !== undefined);
}

export interface UndoLogMastraToolOptions<I, O> {
  id: string;
  description: string;
  inputSchema: I;
  outputSchema?: O;
  tier: ToolTier;
  compensation?: CompensationDescriptor;
  /** The tool's body: runs at most once per tool call. */
  execute: (input: Record<string, unknown>) => Promise<unknown>;
  /** The session (default: the current one). */
  session?: UndoLogSession;
}

type ToolContext = { context?: unknown; suspend?: (payload: unknown) => Promise<unknown> };

/** A Mastra tool (`createTool`) for `options`, its calls through UndoLog. */
export function undologMastraTool<I, O>(options: UndoLogMastraToolOptions<I, O>) {
  const spec: ToolSpec = { name: options.id, tier: options.tier, compensation: options.compensation };
  if (spec.tier === ToolTier.COMPENSABLE && !spec.compensation) {
    throw new Error("a COMPENSABLE tool needs a compensation descriptor");
  }
  return createTool({
    id: options.id,
    description: options.description,
    inputSchema: options.inputSchema as never,
    outputSchema: options.outputSchema as never,
    execute: (async (ctx: ToolContext, invocation?: { toolCallId?: string; suspend?: ToolContext["suspend"] }) => {
      const session = options.session ?? currentSession();
      if (!session) {
        throw new Error("an UndoLog tool runs inside session.run(...), or with { session }");
      }
      const args = (ctx?.context ?? {}) as Record<string, unknown>;
      if (!(await isRecorded(session, spec))) return options.execute(args);
      const callId = invocation?.toolCallId;
      if (!callId) {
        throw new Error(`UndoLog tool '${spec.name}' needs the model's tool-call id (toolCallId)`);
      }
      const asked = await askCall(session, spec, args, callId);
      if (asked.answer.status === "pending_approval") {
        const suspend = ctx?.suspend ?? invocation?.suspend;
        if (!suspend) throw awaitingError(asked);
        const suspension: UndoLogSuspension = {
          approval_id: String(asked.answer.approval_id), tool: spec.name, args,
          step_index: asked.step, session_id: session.sessionId,
        };
        return suspend({ undolog: suspension });
      }
      return carryOut(asked, options.execute);
    }) as never,
  });
}
