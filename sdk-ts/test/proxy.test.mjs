// Against a real proxy (`undolog serve`, SQLite, the demo tools): exactly once across a
// restart keyed on the model's tool-call id, rollback of a compensable call, an irreversible
// call waiting for an approver, calls the proxy runs, and errors mapped from wire codes.
import assert from "node:assert/strict";
import { randomUUID } from "node:crypto";
import { after, before, test } from "node:test";

import {
  AuthFailed, AwaitingApprovalError, Forbidden, NotFound, ToolTier, UndoLogClient, UndoLogSession,
  compensationDescriptor, registerCompensation, undologTool,
} from "../dist/index.js";
import { startProxy } from "./helpers.mjs";

let proxy;
let admin;
let agent;
let approver;

before(async () => {
  proxy = await startProxy();
  admin = new UndoLogClient({ baseUrl: proxy.url, apiKey: proxy.keys.admin });
  agent = new UndoLogClient({ baseUrl: proxy.url, apiKey: proxy.keys.agent });
  approver = new UndoLogClient({ baseUrl: proxy.url, apiKey: proxy.keys.approver });
});

after(() => proxy?.stop());

function counted(name) {
  const runs = [];
  const fn = async (args) => {
    runs.push(args);
    return { ...args, n: runs.length };
  };
  Object.defineProperty(fn, "name", { value: name });
  return { fn, runs };
}

test("a call keyed on the model's tool-call id runs once, also after a restart", async () => {
  const send = counted("send_note");
  await admin.registerTool("send_note", ToolTier.IRREVERSIBLE);
  const tool = undologTool({ tier: ToolTier.COMPENSABLE, compensation: compensationDescriptor("unsend") }, send.fn);
  const sessionId = randomUUID();
  const first = new UndoLogSession({ sessionId, client: agent });
  // Registered IRREVERSIBLE, declared COMPENSABLE in code: the stricter tier wins (approval).
  const waiting = await tool({ to: "ada" }, { session: first, callId: "call_abc123" }).catch((e) => e);
  assert.ok(waiting instanceof AwaitingApprovalError, String(waiting));
  await approver.approve(waiting.approvalId);
  const out = await tool({ to: "ada" }, { session: first, callId: "call_abc123" });
  assert.deepEqual(out, { to: "ada", n: 1 });
  // A new process: a new client and session object, the same session id and tool-call id.
  const restarted = new UndoLogSession({
    sessionId, client: new UndoLogClient({ baseUrl: proxy.url, apiKey: proxy.keys.agent }),
  });
  const again = await tool({ to: "ada" }, { session: restarted, callId: "call_abc123" });
  assert.deepEqual(again, { to: "ada", n: 1 });
  assert.equal(send.runs.length, 1);
  assert.equal(first.stepForCall("call_abc123"), restarted.stepForCall("call_abc123"));
});

test("a failed session rolls back its compensable calls, newest first, once each", async () => {
  const undone = [];
  registerCompensation("ts_unbook", async ({ original_args, original_result }) => {
    undone.push([original_args.room, original_result.n]);
  });
  const book = counted("ts_book");
  const compensation = compensationDescriptor("ts_unbook", { retry_backoff_ms: 10 });
  await admin.registerTool("ts_book", ToolTier.COMPENSABLE, compensation);
  const tool = undologTool({ tier: ToolTier.COMPENSABLE, compensation }, book.fn);
  const session = new UndoLogSession({ client: agent });
  await assert.rejects(
    session.run(async () => {
      await tool({ room: "a" });
      await tool({ room: "b" });
      throw new Error("the agent gave up");
    }),
    /the agent gave up/,
  );
  assert.deepEqual(undone, [["b", 2], ["a", 1]]);
  const view = await agent.getSession(session.sessionId);
  assert.deepEqual(view.effects.map((e) => e.state), ["compensated", "compensated"]);
  // Rolling back again answers the same outcome and runs nothing again.
  assert.equal(await session.rollback(), "compensated");
  assert.equal(undone.length, 2);
});

test("an irreversible call waits for an approver, then runs once", async () => {
  const pay = counted("ts_pay");
  await admin.registerTool("ts_pay", ToolTier.IRREVERSIBLE);
  const tool = undologTool({ tier: ToolTier.IRREVERSIBLE }, pay.fn);
  const session = new UndoLogSession({ client: agent });
  const waiting = await tool({ to: "bob" }, { session, callId: "call_pay" }).catch((e) => e);
  assert.ok(waiting instanceof AwaitingApprovalError, String(waiting));
  assert.equal(pay.runs.length, 0);
  // The agent's key cannot approve its own call.
  await assert.rejects(agent.approve(waiting.approvalId), Forbidden);
  const decided = await approver.approve(waiting.approvalId);
  assert.equal(decided.status, "approved");
  assert.equal((await agent.waitForApproval(waiting.approvalId, 5)).status, "approved");
  const out = await tool({ to: "bob" }, { session, callId: "call_pay" });
  assert.deepEqual(out, { to: "bob", n: 1 });
  assert.deepEqual(await tool({ to: "bob" }, { session, callId: "call_pay" }), out);
  assert.equal(pay.runs.length, 1);
});

test("a call the proxy runs on its tool server replays its recorded result", async () => {
  await admin.registerTool("echo", ToolTier.COMPENSABLE, compensationDescriptor("echo"));
  const call = { sessionId: randomUUID(), toolName: "echo", stepIndex: 1, args: { text: "hi" } };
  const first = await agent.callTool(call);
  assert.equal(first.status, "executed");
  const again = await agent.callTool(call);
  assert.equal(again.status, "replayed");
  assert.deepEqual(again.result, first.result);
  assert.equal(again.effect_id, first.effect_id);
});

test("error answers raise the error class of their wire code", async () => {
  const stranger = new UndoLogClient({ baseUrl: proxy.url, apiKey: "ul_not_a_key" });
  const refused = await stranger.getSession(randomUUID()).catch((e) => e);
  assert.ok(refused instanceof AuthFailed, String(refused));
  assert.equal(refused.code, "auth_failed");
  const missing = await agent.getSession(randomUUID()).catch((e) => e);
  assert.ok(missing instanceof NotFound, String(missing));
  assert.equal(missing.status, 404);
  const tool = undologTool({ name: "never_registered", tier: ToolTier.IRREVERSIBLE }, async () => ({}));
  const session = new UndoLogSession({ client: agent });
  await assert.rejects(tool({}, { session }), Forbidden); // an agent key may not register
});
