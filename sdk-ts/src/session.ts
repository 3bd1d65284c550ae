/**
 * Sessions, the tool wrapper and the agent's part in a rollback (the Python SDK's
 * `UndoLogSession`, `@undolog_tool` and `@compensation`).
 *
 * A session orders its calls by step: a counter (1, 2, 3...) for an agent that repeats its
 * calls in the same order, or — for a framework that names each tool call — a step derived
 * from the model's tool-call id (`stepForCall`), the same in every process, so a run resumed
 * from the framework's saved state or restarted elsewhere signs the call as before.
 */
import { AsyncLocalStorage } from "node:async_hooks";
import { randomUUID } from "node:crypto";

import { blake3Bytes, callSignature, canonicalJson } from "./canonical.js";
import { UndoLogClient } from "./client.js";
import type { ToolCallAnswer } from "./client.js";
import {
  AwaitingApprovalError,
  ClaimNotHeld,
  CompensationFailed,
  EffectInDoubt,
  InProgress,
  InvalidStateTransition,
  UndoLogError,
} from "./errors.js";
import { ToolTier } from "./tiers.js";
import type { CompensationDescriptor } from "./tiers.js";

/** Steps from tool-call ids: 2**31 plus 31 bits of a BLAKE3 hash (docs: "Steps from a
 *  framework's call ids"), never meeting the counter's steps. */
export const KEYED_STEP_BASE = 0x8000_0000;
const KEYED_STEP_DOMAIN = new TextEncoder().encode("undolog-tool-call-id\0");

const current = new AsyncLocalStorage<UndoLogSession>();

/** The session of the running `session.run(...)`, if any. */
export function currentSession(): UndoLogSession | undefined {
  return current.getStore();
}

export interface SessionOptions {
  sessionId?: string;
  client?: UndoLogClient;
}

export class UndoLogSession {
  readonly sessionId: string;
  readonly client: UndoLogClient;
  private step = 0;
  private used = false;
  /** Calls that wait for approval: signature -> approval id. */
  readonly awaiting = new Map<string, string>();

  constructor(options: SessionOptions = {}) {
    this.sessionId = options.sessionId ?? randomUUID();
    this.client = options.client ?? new UndoLogClient();
  }

  /** Advance and return the next step: 1, then 2, 3... */
  nextStep(): number {
    this.step += 1;
    return this.step;
  }

  /** Give `step` back if it is still the latest (a call that did not complete keeps its step
   *  for the retry). */
  giveBackStep(step: number): void {
    if (this.step === step) this.step = step - 1;
  }

  /** The step of the tool call a framework names `callId` (the model's tool-call id). */
  stepForCall(callId: string): number {
    if (!callId) throw new Error("a tool-call id must not be empty");
    const id = new TextEncoder().encode(callId);
    const input = new Uint8Array(KEYED_STEP_DOMAIN.length + id.length);
    input.set(KEYED_STEP_DOMAIN);
    input.set(id, KEYED_STEP_DOMAIN.length);
    const digest = blake3Bytes(input, 4);
    const low = new DataView(digest.buffer, digest.byteOffset, 4).getUint32(0, true);
    return KEYED_STEP_BASE + (low & 0x7fff_ffff);
  }

  markUsed(): void {
    this.used = true;
  }

  /**
   * Run `fn` with this session current (for tools called without one). When `fn` ends, the
   * session is completed; when it throws, the session is rolled back and the error rethrown —
   * except for "not now" errors (awaiting approval, in progress, in doubt), which leave it
   * open to be resumed with the same session id, as does a call still awaiting approval.
   */
  async run<T>(fn: () => Promise<T>): Promise<T> {
    let value: T;
    try {
      value = await current.run(this, fn);
    } catch (error) {
      const notNow =
        error instanceof AwaitingApprovalError ||
        error instanceof InProgress ||
        error instanceof EffectInDoubt;
      if (this.used && !notNow) {
        try {
          await this.rollback();
        } catch (rollbackError) {
          if (error instanceof Error) {
            error.message += ` (UndoLog rollback did not finish: ${String(rollbackError)})`;
          }
        }
      }
      throw error;
    }
    if (this.used && this.awaiting.size === 0) {
      await this.client.completeSession(this.sessionId);
    }
    return value;
  }

  /** Undo what this session did, newest first: "compensated" or "empty_undo_stack". */
  async rollback(): Promise<string> {
    return unwind(this.client, this.sessionId);
  }

  /** Undo chosen calls and keep the session open. */
  async undo(selection: { entries?: string[]; afterStep?: number; force?: boolean }): Promise<string> {
    return unwind(this.client, this.sessionId, {
      entries: selection.entries,
      after_step: selection.afterStep,
      force: selection.force ?? false,
    });
  }
}

// --- compensations the agent runs --------------------------------------------------------------

export type Compensation = (payload: {
  original_args: Record<string, unknown>;
  original_result: unknown;
  [arg: string]: unknown;
}) => Promise<unknown>;

const compensations = new Map<string, Compensation>();

/** Register the compensation named `fnName` (called with the descriptor's captured args plus
 *  `original_args` and `original_result`). */
export function registerCompensation(fnName: string, fn: Compensation): void {
  if (!fnName) throw new Error("a compensation needs a name");
  compensations.set(fnName, fn);
}

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

async function runEntry(client: UndoLogClient, entryId: string): Promise<boolean> {
  let claim: Record<string, unknown>;
  try {
    claim = await client.claimUndo(entryId);
  } catch (error) {
    if (error instanceof InvalidStateTransition) return false;
    throw error;
  }
  const fn = compensations.get(String(claim.fn_name));
  const token = String(claim.claim_token);
  const attempts = Math.max(1, Number(claim.attempts_left ?? 1));
  try {
    for (let attempt = 0; attempt < attempts; attempt++) {
      if (attempt) await sleep(Number(claim.retry_backoff_ms ?? 1000));
      let problem: string;
      if (!fn) {
        problem = `no compensation named '${String(claim.fn_name)}' is registered in this agent`;
      } else {
        try {
          await fn(claim.payload as Parameters<Compensation>[0]);
          await client.completeUndo(entryId, token);
          return true;
        } catch (error) {
          if (error instanceof UndoLogError) throw error;
          problem = `${(error as Error)?.name ?? "Error"}: ${(error as Error)?.message ?? error}`;
        }
      }
      await client.failUndo(entryId, problem, token); // throws CompensationFailed at the last
    }
  } catch (error) {
    if (error instanceof ClaimNotHeld) return false;
    throw error;
  }
  return true;
}

/** Roll the session back (or undo `selection`), running the agent's own entries here. */
export async function unwind(
  client: UndoLogClient,
  sessionId: string,
  selection?: { entries?: string[]; after_step?: number; force?: boolean },
): Promise<string> {
  const deadline = Date.now() + 120_000;
  for (;;) {
    const answer = await client.rollbackSession(sessionId, selection);
    const outcome = String(answer.outcome);
    if (outcome === "compensated" || outcome === "empty_undo_stack") return outcome;
    const entry = (answer.next_entry ?? {}) as Record<string, unknown>;
    if (outcome === "waiting_for_runner" && (await runEntry(client, String(entry.entry_id)))) {
      continue;
    }
    if (outcome === "compensation_failed") {
      throw new CompensationFailed(String(answer.message ?? answer.reason ?? "compensation failed"), 502, answer);
    }
    if (outcome === "effect_in_doubt" || outcome === "blocked") {
      throw new EffectInDoubt(String(answer.message ?? `effect ${String(entry.effect_id)} is in doubt`), 409, answer);
    }
    if (Date.now() > deadline) {
      throw new InProgress(`rollback of ${sessionId} still waits for another runner`, 409, answer);
    }
    await sleep(Math.min(1000, 1000 * Number(answer.retry_after ?? 1)));
  }
}

// --- the tool wrapper --------------------------------------------------------------------------

export interface ToolOptions {
  /** The tool's name on the proxy (default: the function's name). */
  name?: string;
  tier: ToolTier;
  /** How to undo it; required for a COMPENSABLE tool. */
  compensation?: CompensationDescriptor;
}

export interface CallOptions {
  /** The session (default: the current one, `session.run`). */
  session?: UndoLogSession;
  /** The model's tool-call id: the step is derived from it (see `stepForCall`). */
  callId?: string;
  /** Wait this many seconds for an approval instead of throwing `AwaitingApprovalError`. */
  waitForApprovalSeconds?: number;
}

/** What a tool is, for the proxy: its name, tier and compensation. */
export interface ToolSpec {
  name: string;
  tier: ToolTier;
  compensation?: CompensationDescriptor;
}

/** A call the proxy was asked about: its step, signature and the proxy's answer. */
export interface AskedCall {
  session: UndoLogSession;
  spec: ToolSpec;
  step: number;
  keyed: boolean;
  signature: string;
  args: Record<string, unknown>;
  answer: ToolCallAnswer;
}

const registered = new WeakMap<UndoLogClient, Set<string>>();

function checkedSpec(options: ToolOptions, fallbackName: string): ToolSpec {
  const name = options.name ?? fallbackName;
  if (!name) throw new Error("a tool needs a name (options.name, or a named function)");
  if (!Object.values(ToolTier).includes(options.tier)) {
    throw new Error(`tier must be one of ${Object.values(ToolTier).join(", ")}, got ${options.tier}`);
  }
  if (options.tier === ToolTier.COMPENSABLE && !options.compensation) {
    throw new Error("a COMPENSABLE tool needs a compensation descriptor");
  }
  return { name, tier: options.tier, compensation: options.compensation };
}

/** Whether a call of `spec` goes through the proxy (a SAFE tool runs directly, unless the
 *  registry holds it at a stricter tier). */
export async function isRecorded(session: UndoLogSession, spec: ToolSpec): Promise<boolean> {
  if (spec.tier !== ToolTier.SAFE) return true;
  const entry = await session.client.registeredTool(spec.name);
  return !(entry === undefined || entry.tier === undefined || entry.tier === ToolTier.SAFE);
}

/**
 * Ask the proxy what to do with one call (registering the tool once per client): the step is
 * the one of `callId` when given, else the session's next. A call refused here gives its
 * counter step back.
 */
export async function askCall(
  session: UndoLogSession,
  spec: ToolSpec,
  args: Record<string, unknown>,
  callId?: string,
): Promise<AskedCall> {
  const client = session.client;
  const keyed = callId !== undefined;
  const step = keyed ? session.stepForCall(callId as string) : session.nextStep();
  try {
    const signature = callSignature(session.sessionId, step, spec.name, args);
    let names = registered.get(client);
    if (!names) registered.set(client, (names = new Set()));
    if (!names.has(spec.name)) {
      await client.ensureTool(spec.name, spec.tier, spec.compensation);
      names.add(spec.name);
    }
    const answer = await client.intercept({
      sessionId: session.sessionId,
      toolName: spec.name,
      stepIndex: step,
      args,
      declaredTier: spec.tier,
      compensation: spec.compensation,
    });
    session.markUsed();
    if (answer.status === "pending_approval") {
      // Noted on the session: leaving `session.run` then keeps it open (completing it would
      // withdraw the approval).
      session.awaiting.set(signature, String(answer.approval_id));
    }
    return { session, spec, step, keyed, signature, args, answer };
  } catch (error) {
    if (!keyed) session.giveBackStep(step);
    throw error;
  }
}

/** The error of a call that waits for approval (noted on the session: it stays open). */
export function awaitingError(asked: AskedCall): AwaitingApprovalError {
  if (!asked.keyed) asked.session.giveBackStep(asked.step);
  asked.session.awaiting.set(asked.signature, String(asked.answer.approval_id));
  return new AwaitingApprovalError(
    String(asked.answer.approval_id), asked.spec.name, asked.step, asked.answer.effect_id,
    asked.answer.retry_after,
  );
}

/** Act on the proxy's answer: the recorded result, `AwaitingApprovalError`, or run `fn` and
 *  record its result (or its failure). */
export async function carryOut<R>(
  asked: AskedCall,
  fn: (args: Record<string, unknown>) => Promise<R>,
): Promise<R> {
  const { session, answer } = asked;
  if (answer.status === "replayed" || answer.status === "executed") {
    session.awaiting.delete(asked.signature);
    return answer.result as R; // what the first run returned (recorded by the proxy)
  }
  if (answer.status === "pending_approval") throw awaitingError(asked);
  session.awaiting.delete(asked.signature);
  let output: R;
  try {
    output = await fn(asked.args);
    canonicalJson(output); // a result that is not JSON fails the call, as any failure
  } catch (error) {
    if (!asked.keyed) session.giveBackStep(asked.step); // a retry is the same call
    const text = `${(error as Error)?.name ?? "Error"}: ${(error as Error)?.message ?? error}`;
    await session.client.fail(answer.effect_id, text, session.sessionId);
    throw error;
  }
  await session.client.commit(answer.effect_id, output as Record<string, unknown>, session.sessionId);
  return output;
}

/**
 * The UndoLog approval of a call named by its tool-call id, read from the proxy's view of the
 * session (so a framework state restored in another process finds it): the newest approval of
 * the call's effect, or undefined.
 */
export async function approvalForCall(
  session: UndoLogSession,
  toolName: string,
  callId: string,
): Promise<{ approvalId: string; status: string; reason?: string } | undefined> {
  let view: Record<string, unknown>;
  try {
    view = await session.client.getSession(session.sessionId);
  } catch (error) {
    if (error instanceof UndoLogError && error.code === "not_found") return undefined;
    throw error;
  }
  const step = session.stepForCall(callId);
  const effects = new Set(
    ((view.effects ?? []) as Record<string, unknown>[])
      .filter((e) => e.step_index === step && e.tool_name === toolName)
      .map((e) => e.effect_id),
  );
  const found = ((view.approvals ?? []) as Record<string, unknown>[])
    .filter((a) => effects.has(a.effect_id))
    .sort((a, b) => String(a.created_at ?? "").localeCompare(String(b.created_at ?? "")));
  const newest = found.at(-1);
  if (!newest) return undefined;
  const approval = await session.client.getApproval(String(newest.id ?? newest.approval_id));
  return {
    approvalId: String(approval.approval_id ?? newest.id),
    status: String(approval.status),
    reason: typeof approval.reason === "string" ? approval.reason : undefined,
  };
}

/**
 * Wrap an async function `fn(args)` so that each call goes through UndoLog: run once per
 * (session, step, tool, args) — a repeat returns the recorded output —, undoable when
 * COMPENSABLE, and gated when IRREVERSIBLE (throws `AwaitingApprovalError`, or waits).
 * The agent runs the function itself (SDK mode); the proxy records it.
 */
export function undologTool<A extends Record<string, unknown>, R>(
  options: ToolOptions,
  fn: (args: A) => Promise<R>,
): ((args: A, call?: CallOptions) => Promise<R>) & { spec: ToolSpec } {
  const spec = checkedSpec(options, fn.name);
  const wrapped = async (args: A, call: CallOptions = {}): Promise<R> => {
    const session = call.session ?? currentSession();
    if (!session) {
      throw new Error(`tool '${spec.name}' was called outside a session (session.run, or { session })`);
    }
    if (!(await isRecorded(session, spec))) return fn(args);
    let asked = await askCall(session, spec, args, call.callId);
    if (asked.answer.status === "pending_approval" && call.waitForApprovalSeconds) {
      const approval = await session.client.waitForApproval(
        String(asked.answer.approval_id),
        call.waitForApprovalSeconds,
      );
      if (approval.status === "approved") {
        if (!asked.keyed) session.giveBackStep(asked.step);
        asked = await askCall(session, spec, args, call.callId);
      }
    }
    return carryOut(asked, fn as (args: Record<string, unknown>) => Promise<R>);
  };
  return Object.assign(wrapped, { spec });
}
