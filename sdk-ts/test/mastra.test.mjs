// Mastra (the real `@mastra/core`) workflows with a real proxy: an irreversible step suspends
// until a person approves it in UndoLog; resumed by new workflow objects on the same storage
// (a restart), it runs once; the run started again replays; a rejection fails the step; a
// failed session rolls back.
import assert from "node:assert/strict";
import { after, before, test } from "node:test";

import { Mastra } from "@mastra/core/mastra";
import { InMemoryStore } from "@mastra/core/storage";
import { createWorkflow } from "@mastra/core/workflows";
import { z } from "zod";

import {
  compensationDescriptor, registerCompensation, ToolTier, UndoLogClient, UndoLogSession,
} from "../dist/index.js";
import { undologMastraStep, undologSuspensions } from "../dist/integrations/mastra.js";
import { startProxy } from "./helpers.mjs";

let proxy;
let approver;
const agentClient = () => new UndoLogClient({ baseUrl: proxy.url, apiKey: proxy.keys.agent });

before(async () => {
  proxy = await startProxy();
  const admin = new UndoLogClient({ baseUrl: proxy.url, apiKey: proxy.keys.admin });
  approver = new UndoLogClient({ baseUrl: proxy.url, apiKey: proxy.keys.approver });
  await admin.registerTool("ship_order", ToolTier.IRREVERSIBLE);
  await admin.registerTool("hold_stock", ToolTier.COMPENSABLE, compensationDescriptor("release_stock", { retry_backoff_ms: 10 }));
});

after(() => proxy?.stop());

const order = z.object({ order: z.string() });

/** "A process": the workflow and Mastra objects, on the given storage. */
function mastraOn(storage, runs) {
  const ship = undologMastraStep({
    id: "ship_order", inputSchema: order, outputSchema: z.object({ shipped: z.string() }),
    tier: ToolTier.IRREVERSIBLE,
    execute: async ({ order: id }) => {
      runs.push(id);
      return { shipped: id };
    },
  });
  const workflow = createWorkflow({ id: "fulfil", inputSchema: order, outputSchema: z.object({ shipped: z.string() }) })
    .then(ship).commit();
  return new Mastra({ workflows: { fulfil: workflow }, storage, logger: false }).getWorkflow("fulfil");
}

test("a step suspends until approved in UndoLog; resumed after a restart, it runs once", async () => {
  const runs = [];
  const storage = new InMemoryStore(); // Mastra's storage, which outlives the process
  const session = new UndoLogSession({ client: agentClient() });
  const run = await mastraOn(storage, runs).createRunAsync();
  const first = await session.run(() => run.start({ inputData: { order: "o-1" } }));
  assert.equal(first.status, "suspended");
  const [suspension] = undologSuspensions(first);
  assert.equal(suspension.tool, "ship_order");
  assert.equal(runs.length, 0);

  const early = await session.run(() => run.resume({ step: "ship_order", resumeData: { asked: true } }));
  assert.equal(early.status, "suspended"); // nobody decided yet
  assert.equal(undologSuspensions(early)[0].approval_id, suspension.approval_id);

  await approver.approve(suspension.approval_id);
  const restarted = new UndoLogSession({ sessionId: session.sessionId, client: agentClient() });
  const resumedRun = await mastraOn(storage, runs).createRunAsync({ runId: run.runId });
  const done = await restarted.run(() => resumedRun.resume({ step: "ship_order", resumeData: { decided: true } }));
  assert.equal(done.status, "success");
  assert.deepEqual(done.result, { shipped: "o-1" });
  assert.deepEqual(runs, ["o-1"]);

  // The same run started again from the beginning: the step's call replays, nothing ships.
  const again = await restarted.run(async () =>
    (await mastraOn(new InMemoryStore(), runs).createRunAsync({ runId: run.runId })).start({ inputData: { order: "o-1" } }));
  assert.equal(again.status, "success");
  assert.deepEqual(runs, ["o-1"]);
});

test("a rejection in UndoLog fails the step: nothing ships", async () => {
  const runs = [];
  const storage = new InMemoryStore();
  const session = new UndoLogSession({ client: agentClient() });
  const run = await mastraOn(storage, runs).createRunAsync();
  const first = await session.run(() => run.start({ inputData: { order: "o-2" } }));
  await approver.reject(undologSuspensions(first)[0].approval_id, "address unknown");
  const done = await session.run(() => run.resume({ step: "ship_order", resumeData: {} }));
  assert.equal(done.status, "failed");
  assert.match(String(done.error?.message ?? done.error), /rejected/);
  assert.equal(runs.length, 0);
});

test("a session that fails rolls back its compensable steps", async () => {
  const released = [];
  registerCompensation("release_stock", async ({ original_args }) => {
    released.push(original_args.order);
  });
  const hold = undologMastraStep({
    id: "hold_stock", inputSchema: order, outputSchema: order, tier: ToolTier.COMPENSABLE,
    compensation: compensationDescriptor("release_stock", { retry_backoff_ms: 10 }),
    execute: async (input) => input,
  });
  const workflow = createWorkflow({ id: "reserve", inputSchema: order, outputSchema: order }).then(hold).commit();
  const reserve = new Mastra({ workflows: { reserve: workflow }, storage: new InMemoryStore(), logger: false }).getWorkflow("reserve");
  const session = new UndoLogSession({ client: agentClient() });
  await assert.rejects(session.run(async () => {
    const result = await (await reserve.createRunAsync()).start({ inputData: { order: "o-3" } });
    assert.equal(result.status, "success");
    throw new Error("payment failed");
  }), /payment failed/);
  assert.deepEqual(released, ["o-3"]);
});

test("the example runs: suspended, approved, shipped once", async () => {
  const { execFile } = await import("node:child_process");
  const { promisify } = await import("node:util");
  const { join } = await import("node:path");
  const { repoRoot } = await import("./helpers.mjs");
  const { stdout } = await promisify(execFile)("node", [join(repoRoot, "sdk-ts", "examples", "mastra.mjs")], {
    env: {
      ...process.env, UNDOLOG_PROXY_URL: proxy.url, UNDOLOG_API_KEY: proxy.keys.agent,
      UNDOLOG_ADMIN_KEY: proxy.keys.admin, UNDOLOG_APPROVER_KEY: proxy.keys.approver,
    },
  });
  assert.equal(stdout, 'suspended: ship_order\nshipping o-42\nsuccess: {"shipped":"o-42"}\n');
});

test("a Mastra tool, as an agent calls it: keyed on the tool-call id, gated, run once", async () => {
  const { RuntimeContext } = await import("@mastra/core/runtime-context");
  const { AwaitingApprovalError } = await import("../dist/index.js");
  const { undologMastraTool } = await import("../dist/integrations/mastra.js");
  const runs = [];
  const makeTool = () => undologMastraTool({
    id: "ship_order", description: "Ship an order", inputSchema: order,
    outputSchema: z.object({ shipped: z.string() }), tier: ToolTier.IRREVERSIBLE,
    execute: async ({ order: id }) => {
      runs.push(id);
      return { shipped: id };
    },
  });
  // How a Mastra agent invokes a tool: the context, and the model's tool-call id.
  const call = (tool, session) => session.run(() => tool.execute(
    { context: { order: "o-9" }, runtimeContext: new RuntimeContext() },
    { toolCallId: "call_ship_9", messages: [] },
  ));
  const session = new UndoLogSession({ client: agentClient() });
  const waiting = await call(makeTool(), session).catch((e) => e);
  assert.ok(waiting instanceof AwaitingApprovalError, String(waiting));
  await approver.approve(waiting.approvalId);
  assert.deepEqual(await call(makeTool(), session), { shipped: "o-9" });
  const restarted = new UndoLogSession({ sessionId: session.sessionId, client: agentClient() });
  assert.deepEqual(await call(makeTool(), restarted), { shipped: "o-9" }); // replayed
  assert.deepEqual(runs, ["o-9"]);
});
