// An OpenAI Agents JS agent whose tools go through UndoLog, with a scripted model (no API key
// needed): `undolog serve --demo` in one shell, then, with the three keys it printed (the
// admin key registers the tool, which an agent key may not; the approver key plays the person):
//   UNDOLOG_API_KEY=<agent> UNDOLOG_ADMIN_KEY=<admin> UNDOLOG_APPROVER_KEY=<approver> \
//     node examples/openai-agents.mjs
import { Agent, run, setTracingDisabled, Usage } from "@openai/agents";
import { z } from "zod";

import { ToolTier, UndoLogClient, UndoLogSession } from "../dist/index.js";
import { applyUndologDecisions, undologAgentTool } from "../dist/integrations/openai-agents.js";

setTracingDisabled(true);

let turn = 0;
const model = {
  async getResponse() {
    const usage = new Usage();
    if (turn++ === 0) {
      const args = JSON.stringify({ to: "bob", cents: 500 });
      return { usage, output: [{ type: "function_call", id: "call_1", callId: "call_1", name: "wire_money", arguments: args, status: "completed" }] };
    }
    return { usage, output: [{ type: "message", role: "assistant", status: "completed", id: "m", content: [{ type: "output_text", text: "paid" }] }] };
  },
  async *getStreamedResponse() {},
};

const wireMoney = undologAgentTool({
  name: "wire_money",
  description: "Send money",
  parameters: z.object({ to: z.string(), cents: z.number() }),
  tier: ToolTier.IRREVERSIBLE,
  execute: async ({ to, cents }) => {
    console.log(`wiring ${cents} cents to ${to}`);
    return { wired: cents, to };
  },
});
await new UndoLogClient({ apiKey: process.env.UNDOLOG_ADMIN_KEY }).registerTool("wire_money", ToolTier.IRREVERSIBLE);
const agent = new Agent({ name: "payer", instructions: "pay", model, tools: [wireMoney] });
const session = new UndoLogSession();
const first = await session.run(() => run(agent, "pay bob"));
console.log("interrupted:", first.interruptions.map((i) => i.rawItem.name));

const [pending] = await applyUndologDecisions(first.state, session);
const approver = new UndoLogClient({ apiKey: process.env.UNDOLOG_APPROVER_KEY });
await approver.approve(pending.approvalId);            // a person, in the dashboard or the CLI
await applyUndologDecisions(first.state, session);
const done = await session.run(() => run(agent, first.state));
console.log("final:", done.finalOutput);
