// The OpenAI Agents SDK for JavaScript (the real `@openai/agents`), with a scripted model and a
// real proxy: an irreversible call stops the run as the SDK's interruption until a person
// approves it in UndoLog, then runs once; a run restored from its serialized state in a "new
// process" replays instead of running again; a failed session rolls back.
import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { join } from "node:path";
import { promisify } from "node:util";
import { after, before, test } from "node:test";

import { Agent, run, RunState, setTracingDisabled, Usage } from "@openai/agents";
import { z } from "zod";

import {
  compensationDescriptor, registerCompensation, ToolTier, UndoLogClient, UndoLogSession,
} from "../dist/index.js";
import { applyUndologDecisions, undologAgentTool } from "../dist/integrations/openai-agents.js";
import { repoRoot, startProxy } from "./helpers.mjs";

setTracingDisabled(true);

/** A model that asks for the given tool calls once, then answers "done". */
class ScriptedModel {
  constructor(calls) {
    this.calls = calls;
    this.turn = 0;
  }
  async getResponse() {
    const usage = new Usage();
    if (this.turn++ === 0) {
      return {
        usage,
        output: this.calls.map(([callId, name, args]) => ({
          type: "function_call", id: callId, callId, name, arguments: JSON.stringify(args),
          status: "completed",
        })),
      };
    }
    return {
      usage,
      output: [{
        type: "message", role: "assistant", status: "completed", id: "msg_done",
        content: [{ type: "output_text", text: "done" }],
      }],
    };
  }
  async *getStreamedResponse() {
    throw new Error("not used");
  }
}

let proxy;
let admin;
let agentClient;
let approver;

before(async () => {
  proxy = await startProxy();
  admin = new UndoLogClient({ baseUrl: proxy.url, apiKey: proxy.keys.admin });
  agentClient = new UndoLogClient({ baseUrl: proxy.url, apiKey: proxy.keys.agent });
  approver = new UndoLogClient({ baseUrl: proxy.url, apiKey: proxy.keys.approver });
  await admin.registerTool("wire_money", ToolTier.IRREVERSIBLE);
  await admin.registerTool("book_room", ToolTier.COMPENSABLE, compensationDescriptor("unbook_room", { retry_backoff_ms: 10 }));
});

after(() => proxy?.stop());

function wireMoney(runs) {
  return undologAgentTool({
    name: "wire_money",
    description: "Send money",
    parameters: z.object({ to: z.string(), cents: z.number() }),
    tier: ToolTier.IRREVERSIBLE,
    execute: async (args) => {
      runs.push(args);
      return { wired: args.cents, to: args.to };
    },
  });
}

test("an irreversible call interrupts the run until approved in UndoLog, then runs once", async () => {
  const runs = [];
  const tools = [wireMoney(runs)];
  const makeAgent = (model) => new Agent({ name: "payer", instructions: "pay", model, tools });
  const session = new UndoLogSession({ client: agentClient });
  const agent = makeAgent(new ScriptedModel([["call_wire_1", "wire_money", { to: "bob", cents: 500 }]]));

  const first = await session.run(() => run(agent, "pay bob"));
  assert.equal(first.interruptions.length, 1);
  assert.equal(runs.length, 0);
  const saved = first.state.toString(); // the framework's own saved state

  // Not decided yet: still pending, the run would stop again.
  const pending = await applyUndologDecisions(first.state, session);
  assert.equal(pending.length, 1);
  await approver.approve(pending[0].approvalId);

  // A new process: the state restored from its string, a new client, the same session id.
  const restarted = new UndoLogSession({
    sessionId: session.sessionId,
    client: new UndoLogClient({ baseUrl: proxy.url, apiKey: proxy.keys.agent }),
  });
  const state = await RunState.fromString(makeAgent(new ScriptedModel([])), saved);
  assert.deepEqual(await applyUndologDecisions(state, restarted), []);
  const resumed = await restarted.run(() => run(makeAgent(new ScriptedModel([])), state));
  assert.equal(resumed.finalOutput, "done");
  assert.deepEqual(runs, [{ to: "bob", cents: 500 }]);

  // The same tool call again (a replayed conversation): the recorded result, no second wire.
  const again = await restarted.run(() =>
    run(makeAgent(new ScriptedModel([["call_wire_1", "wire_money", { to: "bob", cents: 500 }]])), "pay bob"));
  assert.equal(again.interruptions.length, 0);
  assert.equal(runs.length, 1);
});

test("a rejected call is rejected in the run: the tool never runs", async () => {
  const runs = [];
  const agent = new Agent({
    name: "payer", instructions: "pay", tools: [wireMoney(runs)],
    model: new ScriptedModel([["call_wire_2", "wire_money", { to: "eve", cents: 9 }]]),
  });
  const session = new UndoLogSession({ client: agentClient });
  const first = await session.run(() => run(agent, "pay eve"));
  const [pending] = await applyUndologDecisions(first.state, session);
  await approver.reject(pending.approvalId, "not eve");
  assert.deepEqual(await applyUndologDecisions(first.state, session), []);
  agent.model = new ScriptedModel([]);
  agent.model.turn = 1;
  const resumed = await session.run(() => run(agent, first.state));
  assert.equal(resumed.finalOutput, "done");
  assert.equal(runs.length, 0);
});

test("a run that fails rolls back its compensable calls", async () => {
  const undone = [];
  registerCompensation("unbook_room", async ({ original_args }) => {
    undone.push(original_args.room);
  });
  const booked = [];
  const book = undologAgentTool({
    name: "book_room",
    description: "Book a room",
    parameters: z.object({ room: z.string() }),
    tier: ToolTier.COMPENSABLE,
    compensation: compensationDescriptor("unbook_room", { retry_backoff_ms: 10 }),
    execute: async (args) => {
      booked.push(args.room);
      return { booked: args.room };
    },
  });
  const agent = new Agent({
    name: "booker", instructions: "book", tools: [book],
    model: new ScriptedModel([["call_b1", "book_room", { room: "a" }], ["call_b2", "book_room", { room: "b" }]]),
  });
  const session = new UndoLogSession({ client: agentClient });
  await assert.rejects(
    session.run(async () => {
      await run(agent, "book two");
      throw new Error("the user cancelled the trip");
    }),
    /cancelled the trip/,
  );
  assert.deepEqual(booked.sort(), ["a", "b"]);
  assert.deepEqual(undone.sort(), ["a", "b"]);
  const view = await agentClient.getSession(session.sessionId);
  assert.deepEqual(view.effects.map((e) => e.state), ["compensated", "compensated"]);
});

test("the example runs: interrupted, approved, paid", async () => {
  const { stdout } = await promisify(execFile)("node", [join(repoRoot, "sdk-ts", "examples", "openai-agents.mjs")], {
    env: {
      ...process.env, UNDOLOG_PROXY_URL: proxy.url, UNDOLOG_API_KEY: proxy.keys.agent,
      UNDOLOG_ADMIN_KEY: proxy.keys.admin, UNDOLOG_APPROVER_KEY: proxy.keys.approver,
    },
  });
  assert.match(stdout, /interrupted: \[ 'wire_money' \]\nwiring 500 cents to bob\nfinal: paid/);
});
