/**
 * UndoLog for Vercel's AI SDK (`ai`, version 6: tools with `needsApproval`).
 *
 * `undologAiTool({ description, inputSchema, tier, compensation, execute })` is the AI SDK's
 * `tool()` whose calls go through UndoLog, in the session of the run
 * (`session.run(() => generateText(...))`, or `{ session }`):
 *
 * - each call's step is the step of the model's tool-call id (`stepForCall`): exactly once per
 *   tool call; messages replayed (a conversation kept by the app and sent again, in this process
 *   or another) map each call to its recorded result, and `execute` does not run again;
 * - an IRREVERSIBLE call is asked of UndoLog in the tool's `needsApproval`: while its UndoLog
 *   approval is pending, the AI SDK ends the step with its own `tool-approval-request`. Once a
 *   person has decided in UndoLog, `undologApprovalResponses(messages, tools)` answers those
 *   requests as decided (a `tool` message of `tool-approval-response` parts to append); the
 *   next `generateText` runs an approved call once, and tells the model of a refusal.
 */
import { tool } from "ai";
import type { ModelMessage } from "ai";

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

export interface UndoLogAiToolOptions<S> {
  /** The tool's name on the proxy: the key it has in the `tools` object given to the model. */
  name: string;
  description: string;
  /** The AI SDK's input schema (zod, or `jsonSchema(...)`). */
  inputSchema: S;
  tier: ToolTier;
  compensation?: CompensationDescriptor;
  /** The tool's body: runs at most once per tool call. */
  execute: (input: Record<string, unknown>) => Promise<unknown>;
  /** The session (default: the current one). */
  session?: UndoLogSession;
}

const asked = new Map<string, AskedCall>();

function sessionOf(given?: UndoLogSession): UndoLogSession {
  const session = given ?? currentSession();
  if (!session) {
    throw new Error("an UndoLog tool runs inside session.run(...), or with { session }");
  }
  return session;
}

/** The AI SDK's `tool()` for `options`, its calls through UndoLog. */
export function undologAiTool<S>(options: UndoLogAiToolOptions<S>) {
  const spec: ToolSpec = {
    name: options.name,
    tier: options.tier,
    compensation: options.compensation,
  };
  if (spec.tier === ToolTier.COMPENSABLE && !spec.compensation) {
    throw new Error("a COMPENSABLE tool needs a compensation descriptor");
  }
  return tool({
    description: options.description,
    inputSchema: options.inputSchema as never,
    needsApproval: async (
      input: unknown,
      { toolCallId, messages }: { toolCallId: string; messages?: ModelMessage[] },
    ) => {
      if (spec.tier !== ToolTier.IRREVERSIBLE) return false;
      // A call whose approval was asked already: its answer (from UndoLog's decision, by
      // `undologApprovalResponses`) is in the messages, and the AI SDK applies it.
      if (approvalRequested(messages ?? [], toolCallId)) return true;
      const session = sessionOf(options.session);
      const answer = await askCall(session, spec, (input ?? {}) as Record<string, unknown>, toolCallId);
      if (answer.answer.status === "pending_approval") return true;
      asked.set(`${session.sessionId}/${toolCallId}`, answer);
      return false;
    },
    execute: async (input: unknown, { toolCallId }: { toolCallId: string }) => {
      const session = sessionOf(options.session);
      const args = (input ?? {}) as Record<string, unknown>;
      if (!(await isRecorded(session, spec))) return options.execute(args);
      const key = `${session.sessionId}/${toolCallId}`;
      const known = asked.get(key);
      asked.delete(key);
      return carryOut(known ?? (await askCall(session, spec, args, toolCallId)), options.execute);
    },
  } as never);
}

function approvalRequested(messages: ModelMessage[], toolCallId: string): boolean {
  return messages.some(
    (message) =>
      Array.isArray(message.content) &&
      (message.content as { type: string; toolCallId?: string }[]).some(
        (part) => part.type === "tool-approval-request" && part.toolCallId === toolCallId,
      ),
  );
}

export interface PendingAiApproval {
  approvalId: string;
  toolName: string;
  toolCallId: string;
}

/**
 * Answer the AI SDK's open `tool-approval-request`s in `messages` as people decided them in
 * UndoLog (read from the proxy, so a conversation stored and reloaded elsewhere works): the
 * `tool` message to append (undefined when nothing was decided yet) and the calls still
 * pending.
 */
export async function undologApprovalResponses(
  messages: ModelMessage[],
  session?: UndoLogSession,
): Promise<{ message: ModelMessage | undefined; pending: PendingAiApproval[] }> {
  const s = sessionOf(session);
  const calls = new Map<string, string>(); // toolCallId -> toolName
  const requests: { approvalId: string; toolCallId: string }[] = [];
  const answered = new Set<string>();
  for (const message of messages) {
    if (!Array.isArray(message.content)) continue;
    for (const part of message.content as { type: string; [k: string]: unknown }[]) {
      if (part.type === "tool-call") calls.set(String(part.toolCallId), String(part.toolName));
      if (part.type === "tool-approval-request") {
        requests.push({ approvalId: String(part.approvalId), toolCallId: String(part.toolCallId) });
      }
      if (part.type === "tool-approval-response") answered.add(String(part.approvalId));
    }
  }
  const responses: Record<string, unknown>[] = [];
  const pending: PendingAiApproval[] = [];
  for (const request of requests) {
    if (answered.has(request.approvalId)) continue;
    const toolName = calls.get(request.toolCallId);
    if (!toolName) continue;
    const approval = await approvalForCall(s, toolName, request.toolCallId);
    if (!approval) continue;
    if (approval.status === "approved") {
      responses.push({ type: "tool-approval-response", approvalId: request.approvalId, approved: true });
    } else if (approval.status === "rejected" || approval.status === "timed_out") {
      const reason = approval.reason ? `: ${approval.reason}` : "";
      responses.push({
        type: "tool-approval-response",
        approvalId: request.approvalId,
        approved: false,
        reason: `UndoLog approval ${approval.approvalId} was ${approval.status.replace("_", " ")}${reason}`,
      });
    } else {
      pending.push({ approvalId: approval.approvalId, toolName, toolCallId: request.toolCallId });
    }
  }
  const message = responses.length
    ? ({ role: "tool", content: responses } as unknown as ModelMessage)
    : undefined;
  return { message, pending };
}
