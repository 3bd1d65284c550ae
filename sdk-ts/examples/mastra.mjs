// A Mastra workflow whose step goes through UndoLog: `undolog serve --demo` in one shell, then,
// with the three keys it printed (the admin key registers the tool, which an agent key may not;
// the approver key plays the person):
//   UNDOLOG_API_KEY=<agent> UNDOLOG_ADMIN_KEY=<admin> UNDOLOG_APPROVER_KEY=<approver> \
//     node examples/mastra.mjs
import { Mastra } from "@mastra/core/mastra";
import { InMemoryStore } from "@mastra/core/storage";
import { createWorkflow } from "@mastra/core/workflows";
import { z } from "zod";

import { ToolTier, UndoLogClient, UndoLogSession } from "../dist/index.js";
import { undologMastraStep, undologSuspensions } from "../dist/integrations/mastra.js";

const order = z.object({ order: z.string() });
const ship = undologMastraStep({
  id: "ship_order", inputSchema: order, outputSchema: z.object({ shipped: z.string() }),
  tier: ToolTier.IRREVERSIBLE,
  execute: async ({ order: id }) => {
    console.log(`shipping ${id}`);
    return { shipped: id };
  },
});
const workflow = createWorkflow({ id: "fulfil", inputSchema: order, outputSchema: z.object({ shipped: z.string() }) })
  .then(ship).commit();
const fulfil = new Mastra({ workflows: { fulfil: workflow }, storage: new InMemoryStore(), logger: false }).getWorkflow("fulfil");
await new UndoLogClient({ apiKey: process.env.UNDOLOG_ADMIN_KEY }).registerTool("ship_order", ToolTier.IRREVERSIBLE);

const session = new UndoLogSession();
const run = await fulfil.createRunAsync();
const first = await session.run(() => run.start({ inputData: { order: "o-42" } }));
const [suspension] = undologSuspensions(first);
console.log(`${first.status}: ${suspension.tool}`);
await new UndoLogClient({ apiKey: process.env.UNDOLOG_APPROVER_KEY }).approve(suspension.approval_id);
const done = await session.run(() => run.resume({ step: "ship_order", resumeData: { approved: true } }));
console.log(`${done.status}: ${JSON.stringify(done.result)}`);
