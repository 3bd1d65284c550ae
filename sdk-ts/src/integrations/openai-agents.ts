/**
 * UndoLog for the OpenAI Agents SDK for JavaScript (`@openai/agents`).
 *
 * `undologAgentTool({ name, description, parameters, tier, compensation, execute })` is the
 * SDK's `tool()` whose calls go through UndoLog, in the session of the run
 * (`session.run(() => run(agent, input))`, or `{ session }`):
 *
 * - each call's step is the step of the model's call id (`stepForCall`): exactly once per tool
 *   call; a repeated call, or a run resumed from a `RunState` in another process, replays its
 *   recorded result without running `execute`;
 * - an IRREVERSIBLE call is asked of UndoLog before it runs, through the tool's
 *   `needsApproval`: while its UndoLog approval is pending, the run stops with the SDK's own
 *   interruption (`result.interruptions`). Once a person has decided in UndoLog,
 *   `applyUndologDecisions(state, session)` approves (or rejects) the SDK's items to match, and
 *   `run(agent, state)` resumes: an approved call runs once.
 *
 * A failed run rolls the session back when `session.run` ends with an error.
 */
import { tool } from "@openai/agents";
import type { RunState, RunToolApprovalItem } from "@openai/agents";

import {
  approvalForCall,
  askCall,
  carryOut,
  currentSession,
  isRecorded,
  UndoLogSession,
} from "../session.js";
import type { AskedCall, ToolSpec } from "../session.js";
import { ToolTier } from "../tiers.js";
import type { CompensationDescriptor } from "../tiers.js";

export interface UndoLogAgentToolOptions<P> {
  name: string;
  description: string;
  /** The SDK's parameters (a zod object or a JSON schema). */
  parameters: P;
  tier: ToolTier;
  compensation?: CompensationDescriptor;
  /** The tool's body: runs at most once per tool call. */
  execute: (args: Record<string, unknown>) => Promise<unknown>;
  /** The session (default: the current one). */
  session?: UndoLogSession;
}

/** Answers asked in `needsApproval`, for `execute` to act on (by session and call id). */
const asked = new Map<string, AskedCall>();

function sessionOf(given?: UndoLogSession): UndoLogSession {
  const session = given ?? currentSession();
  if (!session) {
    throw new Error("an UndoLog tool runs inside session.run(...), or with { session }");
  }
  return session;
}

function parsed(input: unknown): Record<string, unknown> {
  if (typeof input === "string") return JSON.parse(input) as Record<string, unknown>;
  return (input ?? {}) as Record<string, unknown>;
}

/** The SDK's `tool()` for `options`, its calls through UndoLog. */
export function undologAgentTool<P>(options: UndoLogAgentToolOptions<P>) {
  const spec: ToolSpec = {
    name: options.name,
    tier: options.tier,
    compensation: options.compensation,
  };
  if (spec.tier === ToolTier.COMPENSABLE && !spec.compensation) {
    throw new Error("a COMPENSABLE tool needs a compensation descriptor");
  }
  return tool({
    name: options.name,
    description: options.description,
    parameters: options.parameters as never,
    // An IRREVERSIBLE call stops the run while UndoLog waits for a person.
    needsApproval: async (_context: unknown, input: unknown, callId?: string) => {
      if (spec.tier !== ToolTier.IRREVERSIBLE || !callId) return false;
      const session = sessionOf(options.session);
      const answer = await askCall(session, spec, parsed(input), callId);
      if (answer.answer.status === "pending_approval") return true;
      asked.set(`${session.sessionId}/${callId}`, answer);
      return false;
    },
    execute: async (input: unknown, _context?: unknown, details?: { toolCall?: { callId?: string } }) => {
      const session = sessionOf(options.session);
      const args = parsed(input);
      const callId = details?.toolCall?.callId;
      if (!(await isRecorded(session, spec))) return options.execute(args);
      const key = `${session.sessionId}/${callId}`;
      const known = asked.get(key);
      asked.delete(key);
      const answer = known ?? (await askCall(session, spec, args, callId));
      return carryOut(answer, options.execute);
    },
  });
}

/** The tool-call id of an interruption. */
function callIdOf(item: RunToolApprovalItem): string | undefined {
  const raw = item.rawItem as { callId?: string; id?: string };
  return raw.callId ?? raw.id;
}

function toolNameOf(item: RunToolApprovalItem): string {
  return item.toolName ?? String((item.rawItem as { name?: string }).name);
}

export interface PendingUndoLogApproval {
  approvalId: string;
  toolName: string;
  callId: string;
}

/**
 * Approve or reject the run's interruptions as people decided them in UndoLog: an approved
 * call is approved in `state` (the resumed run runs it, once); a rejected or timed-out one is
 * rejected (the model is told, the tool never runs). Returns the approvals still pending.
 */
export async function applyUndologDecisions(
  state: RunState<unknown, never>,
  session?: UndoLogSession,
): Promise<PendingUndoLogApproval[]> {
  const s = sessionOf(session);
  const pending: PendingUndoLogApproval[] = [];
  for (const item of state.getInterruptions()) {
    const callId = callIdOf(item);
    if (!callId) continue;
    const toolName = toolNameOf(item);
    const approval = await approvalForCall(s, toolName, callId);
    if (!approval) continue;
    if (approval.status === "approved") {
      state.approve(item);
    } else if (approval.status === "rejected" || approval.status === "timed_out") {
      const reason = approval.reason ? `: ${approval.reason}` : "";
      state.reject(item, {
        message:
          `UndoLog approval ${approval.approvalId} for '${toolName}' was ` +
          `${approval.status.replace("_", " ")}${reason}; the tool did not run.`,
      });
    } else {
      pending.push({ approvalId: approval.approvalId, toolName, callId });
    }
  }
  return pending;
}
