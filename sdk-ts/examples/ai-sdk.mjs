// An AI SDK (`ai` 6) agent whose tool goes through UndoLog, with the AI SDK's mock model (no
// API key needed): `undolog serve --demo` in one shell, then, with the three keys it printed
// (the admin key registers the tool, which an agent key may not; the approver key plays the
// person):
//   UNDOLOG_API_KEY=<agent> UNDOLOG_ADMIN_KEY=<admin> UNDOLOG_APPROVER_KEY=<approver> \
//     node examples/ai-sdk.mjs
import { generateText, stepCountIs } from "ai";
import { MockLanguageModelV3 } from "ai/test";
import { z } from "zod";

import { ToolTier, UndoLogClient, UndoLogSession } from "../dist/index.js";
import { undologAiTool, undologApprovalResponses } from "../dist/integrations/ai-sdk.js";

const usage = { inputTokens: { total: 1, noCache: 1, cacheRead: 0, cacheWrite: 0 }, outputTokens: { total: 1, text: 1, reasoning: 0 } };
const model = new MockLanguageModelV3({
  doGenerate: async ({ prompt }) =>
    prompt.at(-1).role === "user"
      ? { content: [{ type: "tool-call", toolCallId: "call_1", toolName: "send_invoice", input: JSON.stringify({ to: "acme" }) }], finishReason: { unified: "tool-calls", raw: "tool_calls" }, usage, warnings: [] }
      : { content: [{ type: "text", text: "invoiced" }], finishReason: { unified: "stop", raw: "stop" }, usage, warnings: [] },
});
const tools = {
  send_invoice: undologAiTool({
    name: "send_invoice", description: "Send an invoice", inputSchema: z.object({ to: z.string() }),
    tier: ToolTier.IRREVERSIBLE,
    execute: async ({ to }) => {
      console.log(`invoicing ${to}`);
      return { sent: to };
    },
  }),
};
await new UndoLogClient({ apiKey: process.env.UNDOLOG_ADMIN_KEY }).registerTool("send_invoice", ToolTier.IRREVERSIBLE);

const session = new UndoLogSession();
const messages = [{ role: "user", content: "invoice acme" }];
const first = await session.run(() => generateText({ model, tools, messages, stopWhen: stepCountIs(3) }));
messages.push(...first.response.messages);
const { pending } = await undologApprovalResponses(messages, session);
console.log("waiting for approval:", pending.map((p) => p.toolName));
await new UndoLogClient({ apiKey: process.env.UNDOLOG_APPROVER_KEY }).approve(pending[0].approvalId);
const { message } = await undologApprovalResponses(messages, session);
messages.push(message);
const done = await session.run(() => generateText({ model, tools, messages, stopWhen: stepCountIs(3) }));
console.log("final:", done.text);
