// LangGraph.js (the real `@langchain/langgraph`) with a scripted model node, a checkpointer and
// a real proxy: an irreversible call interrupts the graph until a person approves it in
// UndoLog, `Command({ resume })` in a "new process" runs it once; a replayed thread does not run
// it again; a rejection reaches the model as an error; a failed run rolls back.
import assert from "node:assert/strict";
import { after, before, test } from "node:test";

import { AIMessage, HumanMessage } from "@langchain/core/messages";
import { Command, END, MemorySaver, MessagesAnnotation, START, StateGraph } from "@langchain/langgraph";
import { ToolNode } from "@langchain/langgraph/prebuilt";
import { z } from "zod";

import {
  compensationDescriptor, registerCompensation, ToolTier, UndoLogClient, UndoLogSession,
} from "../dist/index.js";
import { approvalRequests, undologLangGraphTool } from "../dist/integrations/langgraph.js";
import { startProxy } from "./helpers.mjs";

let proxy;
let admin;
let approver;
const agentClient = () => new UndoLogClient({ baseUrl: proxy.url, apiKey: proxy.keys.agent });

before(async () => {
  proxy = await startProxy();
  admin = new UndoLogClient({ baseUrl: proxy.url, apiKey: proxy.keys.admin });
  approver = new UndoLogClient({ baseUrl: proxy.url, apiKey: proxy.keys.approver });
  await admin.registerTool("delete_account", ToolTier.IRREVERSIBLE);
  await admin.registerTool("book_room", ToolTier.COMPENSABLE, compensationDescriptor("lg_unbook", { retry_backoff_ms: 10 }));
});

after(() => proxy?.stop());

/** A graph whose model node asks for `calls` once, then answers "done". */
function graph(tools, calls, checkpointer) {
  const model = async (state) => {
    const last = state.messages.at(-1);
    if (last instanceof HumanMessage || last?._getType?.() === "human") {
      return { messages: [new AIMessage({ content: "", tool_calls: calls.map(([id, name, args]) => ({ id, name, args, type: "tool_call" })) })] };
    }
    return { messages: [new AIMessage("done")] };
  };
  const route = (state) => (state.messages.at(-1).tool_calls?.length ? "tools" : END);
  return new StateGraph(MessagesAnnotation)
    .addNode("model", model)
    .addNode("tools", new ToolNode(tools))
    .addEdge(START, "model")
    .addConditionalEdges("model", route, ["tools", END])
    .addEdge("tools", "model")
    .compile({ checkpointer });
}

function deleteAccount(runs) {
  return undologLangGraphTool(async (args) => {
    runs.push(args);
    return { deleted: args.user };
  }, {
    name: "delete_account", description: "Delete a user's account",
    schema: z.object({ user: z.string() }), tier: ToolTier.IRREVERSIBLE,
  });
}

test("an interrupt until approved in UndoLog; the resumed graph runs the call once", async () => {
  const runs = [];
  const checkpointer = new MemorySaver(); // the thread's store, which outlives the process
  const calls = [["call_del_1", "delete_account", { user: "u42" }]];
  const config = { configurable: { thread_id: "thread-1" } };
  const session = new UndoLogSession({ client: agentClient() });
  const first = await session.run(() =>
    graph([deleteAccount(runs)], calls, checkpointer).invoke({ messages: [new HumanMessage("delete u42")] }, config));
  const [request] = approvalRequests(first);
  assert.equal(request.tool, "delete_account");
  assert.deepEqual(request.args, { user: "u42" });
  assert.equal(runs.length, 0);

  // Resumed before anyone decided: interrupts again, with the same approval.
  const again = await session.run(() =>
    graph([deleteAccount(runs)], calls, checkpointer).invoke(new Command({ resume: "asked" }), config));
  assert.equal(approvalRequests(again)[0].approval_id, request.approval_id);

  await approver.approve(request.approval_id);
  // A new process: new tools, graph, client and session object; the same checkpointer and ids.
  const restarted = new UndoLogSession({ sessionId: session.sessionId, client: agentClient() });
  const done = await restarted.run(() =>
    graph([deleteAccount(runs)], calls, checkpointer).invoke(new Command({ resume: "approved" }), config));
  assert.equal(done.messages.at(-1).content, "done");
  assert.deepEqual(runs, [{ user: "u42" }]);
  const toolMessage = done.messages.find((m) => m.tool_call_id === "call_del_1");
  assert.deepEqual(JSON.parse(toolMessage.content), { deleted: "u42" });

  // The same call on a fresh thread of the same session: replayed, not run again.
  const replay = await restarted.run(() =>
    graph([deleteAccount(runs)], calls, new MemorySaver()).invoke(
      { messages: [new HumanMessage("delete u42")] }, { configurable: { thread_id: "t2" } }));
  assert.equal(approvalRequests(replay).length, 0);
  assert.equal(runs.length, 1);
});

test("a rejected call reaches the model as an error; the tool never runs", async () => {
  const runs = [];
  const checkpointer = new MemorySaver();
  const calls = [["call_del_2", "delete_account", { user: "u7" }]];
  const config = { configurable: { thread_id: "thread-3" } };
  const session = new UndoLogSession({ client: agentClient() });
  const first = await session.run(() =>
    graph([deleteAccount(runs)], calls, checkpointer).invoke({ messages: [new HumanMessage("go")] }, config));
  await approver.reject(approvalRequests(first)[0].approval_id, "keep u7");
  const done = await session.run(() =>
    graph([deleteAccount(runs)], calls, checkpointer).invoke(new Command({ resume: "rejected" }), config));
  const toolMessage = done.messages.find((m) => m.tool_call_id === "call_del_2");
  assert.match(String(toolMessage.content), /reject/i);
  assert.equal(runs.length, 0);
});

test("a run that fails rolls back its compensable calls", async () => {
  const undone = [];
  registerCompensation("lg_unbook", async ({ original_args }) => {
    undone.push(original_args.room);
  });
  const book = undologLangGraphTool(async (args) => ({ booked: args.room }), {
    name: "book_room", description: "Book a room", schema: z.object({ room: z.string() }),
    tier: ToolTier.COMPENSABLE, compensation: compensationDescriptor("lg_unbook", { retry_backoff_ms: 10 }),
  });
  const calls = [["call_r1", "book_room", { room: "a" }], ["call_r2", "book_room", { room: "b" }]];
  const session = new UndoLogSession({ client: agentClient() });
  await assert.rejects(session.run(async () => {
    await graph([book], calls, new MemorySaver()).invoke(
      { messages: [new HumanMessage("book")] }, { configurable: { thread_id: "thread-4" } });
    throw new Error("the trip was cancelled");
  }), /trip was cancelled/);
  assert.deepEqual(undone.sort(), ["a", "b"]);
});

test("the example runs: interrupted, approved, deleted once", async () => {
  const { execFile } = await import("node:child_process");
  const { promisify } = await import("node:util");
  const { join } = await import("node:path");
  const { repoRoot } = await import("./helpers.mjs");
  const { stdout } = await promisify(execFile)("node", [join(repoRoot, "sdk-ts", "examples", "langgraph.mjs")], {
    env: {
      ...process.env, UNDOLOG_PROXY_URL: proxy.url, UNDOLOG_API_KEY: proxy.keys.agent,
      UNDOLOG_ADMIN_KEY: proxy.keys.admin, UNDOLOG_APPROVER_KEY: proxy.keys.approver,
    },
  });
  assert.equal(stdout, "interrupted: delete_account\ndeleting u42\nfinal: deleted\n");
});
