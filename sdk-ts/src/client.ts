/**
 * A client of an UndoLog proxy for the REST routes agents use (the proxy's REST reference):
 * tool calls run by the proxy (`callTool`) or by the agent (`intercept`, then `commit`/`fail`),
 * the tool registry, approvals (with a long-poll wait), sessions and their rollback, and the
 * undo entries an agent runs itself. Every error answer throws the `UndoLogError` of its code.
 */
import { errorFromAnswer, Forbidden, Internal, UndoLogError } from "./errors.js";
import type { CompensationDescriptor, ToolTier } from "./tiers.js";

export interface ClientOptions {
  /** The proxy's base URL; default `UNDOLOG_PROXY_URL`, else http://127.0.0.1:8080. */
  baseUrl?: string;
  /** The key (`X-Api-Key`); default `UNDOLOG_API_KEY`. Agents use an `agent` key. */
  apiKey?: string;
  /** Seconds a request may take (default 60; waits for approvals add their own). */
  timeoutSeconds?: number;
  /** A `fetch` to use instead of the global one. */
  fetch?: typeof fetch;
}

/** The proxy's answer to a tool call: `executed`, `replayed`, `pending_approval` or `execute`. */
export interface ToolCallAnswer {
  status: "executed" | "replayed" | "pending_approval" | "execute";
  effect_id: string;
  result?: { success: boolean; output?: unknown; error?: string | null } & Record<string, unknown>;
  approval_id?: string;
  retry_after?: number;
  tier?: string;
  registered_tier?: string;
  declared_tier?: string;
  [field: string]: unknown;
}

export interface ToolCall {
  sessionId: string;
  toolName: string;
  stepIndex: number;
  args: Record<string, unknown>;
  declaredTier?: ToolTier;
  compensation?: CompensationDescriptor;
}

export interface RollbackAnswer {
  outcome: string;
  next_entry?: Record<string, unknown>;
  [field: string]: unknown;
}

export interface Approval {
  approval_id: string;
  status: "pending" | "approved" | "rejected" | "timed_out" | string;
  [field: string]: unknown;
}

const MAX_WAIT_SECONDS = 55;

export class UndoLogClient {
  readonly baseUrl: string;
  readonly apiKey: string | undefined;
  readonly timeoutSeconds: number;
  private readonly fetchImpl: typeof fetch;
  private readonly tools = new Map<string, Record<string, unknown>>();
  private toolsListed = false;

  constructor(options: ClientOptions = {}) {
    this.baseUrl = (options.baseUrl ?? process.env.UNDOLOG_PROXY_URL ?? "http://127.0.0.1:8080")
      .replace(/\/+$/, "");
    this.apiKey = options.apiKey ?? process.env.UNDOLOG_API_KEY;
    this.timeoutSeconds = options.timeoutSeconds ?? 60;
    this.fetchImpl = options.fetch ?? fetch;
  }

  /** One request; an error answer throws its `UndoLogError`. */
  async request<T>(
    method: string,
    path: string,
    body?: unknown,
    options: { sessionId?: string; timeoutSeconds?: number; outcome?: boolean } = {},
  ): Promise<T> {
    const headers: Record<string, string> = { accept: "application/json" };
    if (this.apiKey) headers["X-Api-Key"] = this.apiKey;
    if (options.sessionId) headers["X-UndoLog-Session-Id"] = options.sessionId;
    if (body !== undefined) headers["content-type"] = "application/json";
    const response = await this.fetchImpl(this.baseUrl + path, {
      method,
      headers,
      body: body === undefined ? undefined : JSON.stringify(body),
      signal: AbortSignal.timeout(1000 * (options.timeoutSeconds ?? this.timeoutSeconds)),
    });
    const text = await response.text();
    let data: unknown = undefined;
    try {
      data = text ? JSON.parse(text) : undefined;
    } catch {
      data = undefined;
    }
    if (response.status >= 400) {
      const reports =
        options.outcome && typeof data === "object" && data !== null && "outcome" in data;
      if (!reports) throw errorFromAnswer(response.status, data);
    }
    return data as T;
  }

  private callBody(call: ToolCall, mode?: "sdk"): Record<string, unknown> {
    const body: Record<string, unknown> = {
      session_id: call.sessionId,
      tool_name: call.toolName,
      step_index: call.stepIndex,
      args: call.args,
    };
    if (mode) body.mode = mode;
    if (call.declaredTier) body.declared_tier = call.declaredTier;
    if (call.compensation) body.declared_compensation = call.compensation;
    return body;
  }

  /** A call the proxy runs on its tool server (`POST /mcp/tool_call`). */
  async callTool(call: ToolCall): Promise<ToolCallAnswer> {
    return this.request("POST", "/mcp/tool_call", this.callBody(call), {
      sessionId: call.sessionId,
    });
  }

  /** Ask what to do with a call the agent runs itself (`POST /mcp/tool_call`, `mode: sdk`):
   *  `execute` (run it, then `commit` or `fail`), `replayed`, `executed` (a SAFE tool the
   *  proxy ran) or `pending_approval`. */
  async intercept(call: ToolCall): Promise<ToolCallAnswer> {
    const answer = await this.request<ToolCallAnswer>(
      "POST",
      "/mcp/tool_call",
      this.callBody(call, "sdk"),
      { sessionId: call.sessionId },
    );
    if (!["execute", "replayed", "executed", "pending_approval"].includes(answer?.status)) {
      throw new Internal(`unexpected intercept answer: ${JSON.stringify(answer)}`);
    }
    return answer;
  }

  /** Record the result of a call the agent ran (`POST /effects/{id}/commit`). */
  async commit(effectId: string, result: Record<string, unknown>, sessionId?: string): Promise<void> {
    await this.request("POST", `/effects/${effectId}/commit`, { result }, { sessionId });
  }

  /** Record the failure of a call the agent ran (`POST /effects/{id}/fail`). */
  async fail(effectId: string, error: string, sessionId?: string): Promise<void> {
    await this.request("POST", `/effects/${effectId}/fail`, { error }, { sessionId });
  }

  /** The registry's entry for a tool, or undefined (listed once per client: `GET /tools`;
   *  `fresh` lists it again). */
  async registeredTool(
    toolName: string,
    fresh = false,
  ): Promise<Record<string, unknown> | undefined> {
    if (!this.toolsListed || fresh) {
      const listed = await this.request<Record<string, unknown>[]>("GET", "/tools");
      for (const tool of listed ?? []) {
        if (typeof tool?.name === "string") this.tools.set(tool.name, tool);
      }
      this.toolsListed = true;
    }
    return this.tools.get(toolName);
  }

  /** Register a tool the registry does not hold yet (done once per client by `undologTool`);
   *  a registered tool is left as it is: a call runs under the stricter of its code's tier
   *  and the registry's. An `agent` key may not register: then the tool must be registered
   *  already (by an admin or the config), or this throws `Forbidden`. */
  async ensureTool(
    toolName: string,
    tier: ToolTier,
    compensation?: CompensationDescriptor,
  ): Promise<Record<string, unknown> | undefined> {
    const entry = await this.registeredTool(toolName);
    if (entry !== undefined) return entry;
    try {
      await this.registerTool(toolName, tier, compensation);
    } catch (error) {
      if (!(error instanceof Forbidden)) throw error;
      const listed = await this.registeredTool(toolName, true);
      if (listed === undefined) throw error;
      return listed;
    }
    return undefined;
  }

  /** Register (or replace) a tool (`PUT /tools/{name}`); an `agent` key may not. */
  async registerTool(
    toolName: string,
    tier: ToolTier,
    compensation?: CompensationDescriptor,
    extra: Record<string, unknown> = {},
  ): Promise<void> {
    const body: Record<string, unknown> = { tier, ...extra };
    if (compensation) body.compensation = compensation;
    await this.request("PUT", `/tools/${encodeURIComponent(toolName)}`, body);
    this.tools.set(toolName, { name: toolName, ...body });
  }

  /** One approval (`GET /approvals/{id}`); with `waitSeconds`, answered once it is decided or
   *  after that long (at most 55 s per request), whichever comes first. */
  async getApproval(approvalId: string, waitSeconds = 0): Promise<Approval> {
    const wait = Math.max(0, Math.min(MAX_WAIT_SECONDS, Math.floor(waitSeconds)));
    const query = wait ? `?wait=${wait}` : "";
    return this.request("GET", `/approvals/${approvalId}${query}`, undefined, {
      timeoutSeconds: this.timeoutSeconds + wait,
    });
  }

  /** Wait until an approval is decided (or `timeoutSeconds` pass); its final state. */
  async waitForApproval(approvalId: string, timeoutSeconds = 300): Promise<Approval> {
    const deadline = Date.now() + timeoutSeconds * 1000;
    for (;;) {
      const left = Math.ceil((deadline - Date.now()) / 1000);
      const approval = await this.getApproval(approvalId, Math.max(0, left));
      if (approval.status !== "pending" || left <= 0) return approval;
    }
  }

  /** Approve a pending call (`POST /approvals/{id}/approve`): an `approver` or `admin` key,
   *  never the agent's. `argsHash` binds the approval to the arguments reviewed. */
  async approve(
    approvalId: string,
    options: { argsHash?: string; args?: Record<string, unknown>; reason?: string } = {},
  ): Promise<Record<string, unknown>> {
    const body: Record<string, unknown> = {};
    if (options.argsHash) body.args_hash = options.argsHash;
    if (options.args) body.args = options.args;
    if (options.reason) body.reason = options.reason;
    return this.request("POST", `/approvals/${approvalId}/approve`, body);
  }

  /** Reject a pending call (`POST /approvals/{id}/reject`). */
  async reject(approvalId: string, reason?: string): Promise<Record<string, unknown>> {
    return this.request("POST", `/approvals/${approvalId}/reject`, reason ? { reason } : {});
  }

  /** A session with its effects and undo stack (`GET /sessions/{id}`). */
  async getSession(sessionId: string): Promise<Record<string, unknown>> {
    return this.request("GET", `/sessions/${sessionId}`);
  }

  /** Mark a session completed (`POST /sessions/{id}/complete`). */
  async completeSession(sessionId: string): Promise<void> {
    await this.request("POST", `/sessions/${sessionId}/complete`);
  }

  /** Unwind a session (`POST /sessions/{id}/rollback`), or with `selection`
   *  (`{entries}` or `{after_step}`, and `force`) undo only those entries. The answer,
   *  whatever its `outcome`. */
  async rollbackSession(
    sessionId: string,
    selection?: { entries?: string[]; after_step?: number; force?: boolean },
  ): Promise<RollbackAnswer> {
    return this.request("POST", `/sessions/${sessionId}/rollback`, selection, { outcome: true });
  }

  /** Claim an undo entry this agent runs (`POST /undo/{entry}/claim`). */
  async claimUndo(entryId: string): Promise<Record<string, unknown>> {
    return this.request("POST", `/undo/${entryId}/claim`);
  }

  async completeUndo(entryId: string, claimToken: string): Promise<void> {
    await this.request("POST", `/undo/${entryId}/complete`, { claim_token: claimToken });
  }

  async failUndo(entryId: string, error: string, claimToken: string): Promise<void> {
    await this.request("POST", `/undo/${entryId}/fail`, { error, claim_token: claimToken });
  }
}

export { UndoLogError };
