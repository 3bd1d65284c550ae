/**
 * UndoLog for LangGraph.js (`@langchain/langgraph`, tools from `@langchain/core`).
 *
 * `undologLangGraphTool(fn, { name, description, schema, tier, compensation })` is a LangChain
 * tool (for a `ToolNode` or a prebuilt agent) whose calls go through UndoLog, in the session
 * of the run (`session.run(() => graph.invoke(...))`, or `{ session }`):
 *
 * - **replay**: a call's step is the step of the model's tool-call id (`stepForCall`), which
 *   the checkpointer keeps in the thread's messages: the node LangGraph re-runs on a resume —
 *   in this process or another one that loaded the checkpoint — maps each call to its recorded
 *   effect, and its body does not run again;
 * - **approval**: a pending IRREVERSIBLE call becomes a LangGraph `interrupt()` whose value is
 *   `{ undolog: { approval_id, tool, args, step_index, session_id } }`
 *   (`approvalRequests(result)` picks them out of `result.__interrupt__`). A person decides in
 *   UndoLog; `new Command({ resume: ... })` (any value) asks UndoLog again: approved, the call
 *   runs once; still pending, the graph interrupts again; rejected or timed out, the tool
 *   fails with the reason (the `ToolNode` hands it to the model as an error message);
 * - **rollback**: COMPENSABLE calls are undone, newest first, when `session.run` ends with an
 *   error, or by `session.rollback()`.
 */
import { tool } from "@langchain/core/tools";
import { interrupt } from "@langchain/langgraph";

import { askCall, carryOut, currentSession, isRecorded, UndoLogSession } from "../session.js";
import type { ToolSpec } from "../session.js";
import { ToolTier } from "../tiers.js";
import type { CompensationDescriptor } from "../tiers.js";

export interface UndoLogLangGraphToolOptions<S> {
  name: string;
  description: string;
  /** The tool's argument schema (a zod object or a JSON schema). */
  schema: S;
  tier: ToolTier;
  compensation?: CompensationDescriptor;
  /** The session (default: the current one). */
  session?: UndoLogSession;
}

/** What an UndoLog interrupt carries. */
export interface UndoLogApprovalRequest {
  approval_id: string;
  tool: string;
  args: Record<string, unknown>;
  step_index: number;
  session_id: string;
  retry_after?: number;
}

type ToolConfig = { toolCall?: { id?: string }; toolCallId?: string } | undefined;

/** A LangChain tool for `fn`, its calls through UndoLog. */
export function undologLangGraphTool<S>(
  fn: (args: Record<string, unknown>) => Promise<unknown>,
  options: UndoLogLangGraphToolOptions<S>,
) {
  const spec: ToolSpec = {
    name: options.name,
    tier: options.tier,
    compensation: options.compensation,
  };
  if (spec.tier === ToolTier.COMPENSABLE && !spec.compensation) {
    throw new Error("a COMPENSABLE tool needs a compensation descriptor");
  }
  const run = async (input: unknown, config?: unknown): Promise<string> => {
    const session = options.session ?? currentSession();
    if (!session) {
      throw new Error("an UndoLog tool runs inside session.run(...), or with { session }");
    }
    const args = (input ?? {}) as Record<string, unknown>;
    const given = config as ToolConfig;
    const callId = given?.toolCall?.id ?? given?.toolCallId;
    if (!(await isRecorded(session, spec))) return JSON.stringify(await fn(args));
    let asked = await askCall(session, spec, args, callId);
    while (asked.answer.status === "pending_approval") {
      const request: UndoLogApprovalRequest = {
        approval_id: String(asked.answer.approval_id),
        tool: spec.name,
        args,
        step_index: asked.step,
        session_id: session.sessionId,
        retry_after: asked.answer.retry_after,
      };
      interrupt({ undolog: request }); // the first time, the graph stops here
      if (!asked.keyed) session.giveBackStep(asked.step);
      asked = await askCall(session, spec, args, callId); // resumed: ask UndoLog again
    }
    return JSON.stringify(await carryOut(asked, fn));
  };
  return tool(run as never, {
    name: options.name,
    description: options.description,
    schema: options.schema as never,
  });
}

/** The UndoLog approval requests among a run's interrupts (`result.__interrupt__`). */
export function approvalRequests(result: unknown): UndoLogApprovalRequest[] {
  const interrupts = (result as { __interrupt__?: { value?: unknown }[] })?.__interrupt__ ?? [];
  return interrupts
    .map((i) => (i.value as { undolog?: UndoLogApprovalRequest } | undefined)?.undolog)
    .filter((r): r is UndoLogApprovalRequest => r !== undefined);
}
