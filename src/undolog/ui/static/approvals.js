// Approvals: filters by state and tool, pages, and a card per approval with who asked, the
// session's recent calls, and Approve / Reject. Approving an IRREVERSIBLE call asks first, in
// a dialog showing the tool, the arguments and what cannot be undone (docs/dashboard.md). A
// proxy-executed call's arguments can be edited before approving (editargs.js). An approval
// is for the arguments the card shows (their `args_hash` is sent with it): when another
// approver changed them, the card is rebuilt with the new ones (docs/approvals.md).

import { api, query } from "./api.js";
import { $, ask, badge, duration, frame, h, pager, pretty, say, shortId, when } from "./dom.js";
import { argsDiff, argsEditor, editedArgs, requestedArgs, runArgs } from "./editargs.js";
import { approvalsHash } from "./nav.js";
import { scheduleRefresh, state } from "./state.js";

const FILTERS = [
  ["pending", "Pending"], ["approved", "Approved"], ["rejected", "Rejected"],
  ["timed_out", "Timed out"], ["auto_approved", "Auto-approved"], ["all", "All"],
];
export const PAGE_SIZE = 20;
const RECENT_CALLS = 5;

function tierOf(toolName) {
  return state.tools.get(toolName)?.tier || "irreversible"; // unknown: assume the worst
}

function undoText(toolName) {
  const tool = state.tools.get(toolName);
  const tier = tierOf(toolName);
  if (tier === "irreversible") return "cannot be undone";
  if (tier === "compensable" && tool?.compensation) return `undone by ${tool.compensation.fn_name}`;
  return "nothing to undo";
}

export async function renderApprovals(view, r, quiet) {
  const { filter, tool, cursor } = r;
  const res = await api(`/approvals${query({ state: filter, tool, cursor, limit: PAGE_SIZE, recent_calls: RECENT_CALLS })}`);
  if (!res.ok) {
    frame(view, "Approvals", h("p", { class: "error" }, res.data?.message || "Cannot load approvals."));
    return;
  }
  const key = `${filter}|${tool}|${cursor}`;
  let list = $("#approval-list");
  if (!quiet || !list || list.dataset.key !== key) {
    list = h("div", { id: "approval-list", class: "cards", dataset: { filter, key } });
    frame(view, "Approvals", filters(filter, tool), h("div", { id: "decided", class: "cards" }), list,
      h("div", { id: "approval-pages" }));
  }
  // Keep existing cards (a reason being typed must survive a live refresh).
  const seen = new Set();
  let previous = null;
  for (const approval of res.data) {
    seen.add(approval.id);
    let card = list.querySelector(`[data-approval="${CSS.escape(approval.id)}"]`);
    if (card && card.dataset.argsHash !== (approval.args_hash || "")) {
      card.remove(); // the arguments that would run changed: never approve what is not shown
      card = null;
    }
    if (!card) card = approvalCard(approval, approval.status === "pending");
    else updateCard(card, approval);
    card.querySelector(".recent").replaceChildren(...recentCalls(approval));
    if (previous) previous.after(card); else list.prepend(card);
    previous = card;
  }
  for (const card of [...list.children]) {
    if (!seen.has(card.dataset.approval)) card.remove();
  }
  if (!res.data.length) {
    list.append(h("p", { class: "empty" }, filter === "pending" ? "No pending approvals." : "None."));
  } else {
    for (const empty of list.querySelectorAll(".empty")) empty.remove();
  }
  if (res.next) state.previousCursor.set(`a|${res.next}`, cursor);
  $("#approval-pages").replaceChildren(pager("approval-pager", {
    cursor, next: res.next, previous: state.previousCursor.get(`a|${cursor}`),
    hashFor: (c) => approvalsHash(filter, { tool, cursor: c }),
  }) || "");
  renderDecided();
}

function filters(filter, tool) {
  const tabs = h("div", { class: "filters", role: "group", "aria-label": "Show approvals" },
    FILTERS.map(([value, label]) =>
      h("a", { href: approvalsHash(value, { tool }), class: "filter", "aria-current": value === filter ? "page" : null }, label)));
  const names = [...state.tools.keys()].sort();
  if (tool && !names.includes(tool)) names.push(tool);
  const select = h("select", { id: "approval-tool", onchange: (e) => { location.hash = approvalsHash(filter, { tool: e.target.value }); } },
    h("option", { value: "" }, "All tools"),
    names.map((name) => h("option", { value: name, selected: name === tool }, name)));
  return h("div", { class: "search" }, tabs, h("div", { class: "field" }, h("label", { for: "approval-tool" }, "Tool"), select));
}

function recentCalls(a) {
  const calls = a.recent_calls || [];
  if (!calls.length) return [h("p", { class: "empty" }, "No calls yet.")];
  return [h("ol", { class: "calls" }, calls.map((c) =>
    h("li", { dataset: { effect: c.effect_id, step: c.step_index } },
      `step ${c.step_index} · `, h("strong", {}, c.tool_name), " ", badge(c.state),
      c.effect_id === a.effect_id ? h("span", { class: "this" }, " (this call)") : "")))];
}

function approvalCard(a, pending) {
  const reasonId = `reason-${a.id}`;
  const card = h("article", { class: "card approval", dataset: { approval: a.id, status: a.status, created: a.created_at, timeout: a.timeout_at || "", argsHash: a.args_hash || "" } },
    h("header", {}, h("h2", {}, a.tool_name), " ", badge(tierOf(a.tool_name)), " ", badge(a.status)),
    h("dl", {},
      h("dt", {}, "Session"), h("dd", {}, h("a", { href: `#/sessions/${a.session_id}` }, a.session_id)),
      h("dt", {}, "Requested by"), h("dd", { class: "requested-by" }, a.requested_by || "unknown key"),
      h("dt", {}, "Requested"), h("dd", { class: "age" }, ""),
      pending ? [h("dt", {}, "Time left"), h("dd", { class: "left" }, "")] : [
        h("dt", {}, "Decided"), h("dd", {}, `${when(a.decided_at)}${a.decided_by ? ` by ${a.decided_by}` : ""}`),
        h("dt", {}, "Reason"), h("dd", { class: "reason" }, a.reason || "—")],
      h("dt", {}, "Undo"), h("dd", { class: "undo" }, undoText(a.tool_name)),
      ruleRows(a),
    ),
    argsView(a),
    diffView(a),
    h("details", { class: "recent-calls", open: true },
      h("summary", {}, `Session ${shortId(a.session_id)}: recent calls`), h("div", { class: "recent" })),
    pending ? h("div", { class: "decide" },
      argsEditor(a),
      h("label", { for: reasonId }, "Reason (optional)"),
      h("input", { id: reasonId, class: "reason-input", type: "text", maxlength: "2000" }),
      h("div", { class: "actions" },
        h("button", { type: "button", class: "approve", onclick: () => approve(a, card) }, "Approve"),
        h("button", { type: "button", class: "danger reject", onclick: () => decide(a, "reject", card) }, "Reject"))) : null,
  );
  updateTimes(card);
  return card;
}

// The policy rule behind an approval and its approvers so far (docs/approvals.md).
function ruleRows(a) {
  const rows = [];
  if (a.rule) rows.push(h("dt", {}, "Rule"), h("dd", { class: "rule" }, a.rule));
  if ((a.approvers_required || 1) > 1) {
    rows.push(h("dt", {}, "Approvers"), h("dd", { class: "approvers" }, approversText(a)));
  }
  return rows;
}

function approversText(a) {
  const by = (a.approved_by || []).join(", ");
  return `${(a.approved_by || []).length} of ${a.approvers_required}${by ? ` (${by})` : ""}`;
}

// A card already on the page, refreshed in place (a reason being typed survives): its times,
// and its approvers so far (another approver's partial approval, docs/approvals.md).
function updateCard(card, a) {
  updateTimes(card);
  const approvers = card.querySelector(".approvers");
  if (approvers) approvers.textContent = approversText(a);
}

// The arguments: once an approver changed them, what runs and what the agent asked for.
function argsView(a) {
  if (a.approved_args == null) {
    return h("details", { open: true }, h("summary", {}, "Arguments"), h("pre", { class: "json args" }, pretty(a.arguments ?? a.args)));
  }
  return [
    h("details", { open: true }, h("summary", {}, "Runs with (changed by an approver)"), h("pre", { class: "json args runs-with" }, pretty(a.approved_args))),
    h("details", { open: true }, h("summary", {}, "Asked for"), h("pre", { class: "json asked-for" }, pretty(a.arguments ?? a.args))),
  ];
}

// What an approver changed in the arguments: added, removed and changed keys.
function diffView(a) {
  const d = a.args_diff;
  if (!d) return null;
  const items = [
    ...Object.entries(d.added || {}).map(([k, v]) => h("li", { class: "added" }, `+ ${k}: ${JSON.stringify(v)}`)),
    ...Object.entries(d.removed || {}).map(([k, v]) => h("li", { class: "removed" }, `− ${k}: ${JSON.stringify(v)}`)),
    ...Object.entries(d.changed || {}).map(([k, v]) => h("li", { class: "changed" }, `~ ${k}: ${JSON.stringify(v.from)} → ${JSON.stringify(v.to)}`)),
  ];
  return h("details", { open: true, class: "args-diff" }, h("summary", {}, "Changed by the approver"), h("ul", {}, items));
}

export function updateTimes(card) {
  const created = Date.parse(card.dataset.created);
  const age = card.querySelector(".age");
  if (age && created) age.textContent = `${duration(Date.now() - created)} ago`;
  const left = card.querySelector(".left");
  const timeout = Date.parse(card.dataset.timeout);
  if (left) left.textContent = timeout ? (timeout > Date.now() ? duration(timeout - Date.now()) : "timing out…") : "no timeout";
}

// An IRREVERSIBLE call is approved only after the person confirms what it does: Cancel
// leaves the approval pending, untouched.
// Edited arguments are checked first: if they are wrong nothing is asked nor sent.
async function approve(a, card) {
  const edit = editedArgs(card, a);
  if (!edit.ok) return;
  if (tierOf(a.tool_name) === "irreversible" && !(await confirmIrreversible(a, edit.args))) {
    say(`${a.tool_name} is still pending.`);
    return;
  }
  await decide(a, "approve", card, edit.args);
}

function confirmIrreversible(a, edited) {
  const dialog = $("#approve-dialog");
  $("#approve-tool").textContent = a.tool_name;
  const runs = edited ?? runArgs(a);
  $("#approve-args").textContent = pretty(runs);
  const changed = $("#approve-changed");
  const differs = edited !== undefined || a.approved_args != null;
  changed.hidden = !differs;
  changed.replaceChildren(...(!differs ? [] : [
    h("p", { class: "warning" }, `${edited !== undefined ? "You" : "An approver"} changed the arguments: it runs with the ones above, not with what the agent asked for:`),
    h("pre", { class: "json" }, pretty(a.arguments ?? a.args))]));
  $("#approve-undo").textContent =
    `UndoLog cannot undo ${a.tool_name}: it is irreversible, so rolling back session ` +
    `${shortId(a.session_id)} will not reverse it. It runs once, as soon as you approve.`;
  return ask(dialog);
}

async function decide(a, verdict, card, args) {
  const reason = card.querySelector(".reason-input").value.trim();
  for (const b of card.querySelectorAll("button")) b.disabled = true;
  const body = {}; // who decides is the signed-in key, recorded by the proxy
  if (reason) body.reason = reason;
  if (args !== undefined) body.args = args; // approve with changes (docs/approvals.md)
  // The arguments this card showed: if they are no longer what would run, 409, nothing runs.
  if (verdict === "approve" && a.args_hash) body.args_hash = a.args_hash;
  const res = await api(`/approvals/${encodeURIComponent(a.id)}/${verdict}`, { method: "POST", body });
  state.decided.set(a.id, { approval: a, verdict, reason, res, edited: args !== undefined, args });
  card.remove();
  renderDecided();
  scheduleRefresh();
}

function renderDecided() {
  const box = $("#decided");
  if (!box) return;
  box.replaceChildren(...[...state.decided.values()].reverse().map(decidedCard));
}

function decidedCard({ approval: a, verdict, reason, res, edited, args }) {
  let outcome;
  if (!res.ok) {
    outcome = h("p", { class: "error" }, res.data?.code === "approval_already_resolved"
      ? "Already decided elsewhere."
      : res.data?.code === "approval_args_changed"
        ? "Not approved: another approver changed the arguments. Review them on the refreshed card."
        : (res.data?.message || "The decision failed."));
  } else if (verdict === "reject") {
    outcome = h("p", {}, "Rejected", reason ? ` — ${reason}` : "", ". The session is halted.");
  } else if (res.data.execution === "committed") {
    const logical = res.data.result && res.data.result.success === false;
    outcome = [h("p", {}, edited ? "Approved with your changed arguments and " : "Approved and ", badge("committed"),
      logical ? h("span", { class: "error" }, ` — the tool reported a failure: ${res.data.result.error ?? ""}`) : ""),
    h("pre", { class: "json result" }, pretty(res.data.result))];
  } else if (res.data.execution === "failed") {
    outcome = h("p", { class: "error" }, "Approved, but the call failed: ", res.data.error);
  } else if (res.data.execution === "awaiting_approvers") {
    outcome = h("p", {}, `Approved: ${res.data.approvals} of ${res.data.approvers_required} approvers so far; it runs once the others approve.`);
  } else {
    outcome = h("p", {}, "Approved: the agent runs it on its next retry.");
  }
  return h("article", { class: "card decided", dataset: { decided: a.id, verdict } },
    h("header", {}, h("h2", {}, a.tool_name), " ", badge(verdict === "approve" ? "approved" : "rejected"),
      h("button", { type: "button", class: "secondary dismiss", "aria-label": `Dismiss ${a.tool_name}`,
        onclick: () => { state.decided.delete(a.id); renderDecided(); } }, "Dismiss")),
    outcome,
    // Approved with changes: requested → approved, as the history view shows it (diffView).
    res.ok && verdict === "approve" && edited ? diffView({ args_diff: argsDiff(requestedArgs(a), args) }) : null);
}
