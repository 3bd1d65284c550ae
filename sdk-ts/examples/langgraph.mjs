// A LangGraph.js graph whose tool goes through UndoLog, with a scripted model node (no API key
// needed): `undolog serve --demo` in one shell, then, with the three keys it printed (the admin
// key registers the tool, which an agent key may not; the approver key plays the person):
//   UNDOLOG_API_KEY=<agent> UNDOLOG_ADMIN_KEY=<admin> UNDOLOG_APPROVER_KEY=<approver> \
//     node examples/langgraph.mjs
import { randomUUID } from "node:crypto";

import { AIMessage, HumanMessage } from "@langchain/core/messages";
import { Command, END, MemorySaver, MessagesAnnotation, START, StateGraph } from "@langchain/langgraph";
import { ToolNode } from "@langchain/langgraph/prebuilt";
import { z } from "zod";

import { ToolTier, UndoLogClient, UndoLogSession } from "../dist/index.js";
import { approvalRequests, undologLangGraphTool } from "../dist/integrations/langgraph.js";

const deleteAccount = undologLangGraphTool(
  async ({ user }) => {
    console.log(`deleting ${user}`);
    return { deleted: user };
  },
  { name: "delete_account", description: "Delete an account", schema: z.object({ user: z.string() }), tier: ToolTier.IRREVERSIBLE },
);
await new UndoLogClient({ apiKey: process.env.UNDOLOG_ADMIN_KEY }).registerTool("delete_account", ToolTier.IRREVERSIBLE);

const model = async (state) =>
  state.messages.at(-1)._getType() === "human"
    ? { messages: [new AIMessage({ content: "", tool_calls: [{ id: "call_1", name: "delete_account", args: { user: "u42" }, type: "tool_call" }] })] }
    : { messages: [new AIMessage("deleted")] };
const graph = new StateGraph(MessagesAnnotation)
  .addNode("model", model)
  .addNode("tools", new ToolNode([deleteAccount]))
  .addEdge(START, "model")
  .addConditionalEdges("model", (s) => (s.messages.at(-1).tool_calls?.length ? "tools" : END), ["tools", END])
  .addEdge("tools", "model")
  .compile({ checkpointer: new MemorySaver() });

const config = { configurable: { thread_id: randomUUID() } };
const session = new UndoLogSession();
const first = await session.run(() => graph.invoke({ messages: [new HumanMessage("delete u42")] }, config));
const [request] = approvalRequests(first);
console.log("interrupted:", request.tool);
const approver = new UndoLogClient({ apiKey: process.env.UNDOLOG_APPROVER_KEY });
await approver.approve(request.approval_id);            // a person, in the dashboard or the CLI
const done = await session.run(() => graph.invoke(new Command({ resume: "approved" }), config));
console.log("final:", done.messages.at(-1).content);
