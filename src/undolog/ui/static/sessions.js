// Sessions: the searchable, filterable, paged list, and one session's timeline, undo stack,
// approvals and activity (loaded from history), with rollback, retry and resolve.

import { api, query } from "./api.js";
import { $, ask, badge, frame, h, pager, pretty, say, shortId, table, when } from "./dom.js";
import { HISTORY, activityList } from "./live.js";
import { sessionsHash } from "./nav.js";
import { may, needsAdmin, render, state } from "./state.js";
import { laterPending, undoSome } from "./undo.js";

export const PAGE_SIZE = 20;
const STATES = ["active", "completed", "failed", "halted", "compensating", "compensated", "compensation_failed"];
const ROLLBACK_STATES = new Set(["active", "failed", "halted", "compensating", "compensation_failed"]);

export async function renderSessions(view, r) {
  const res = await api(`/sessions${query({ state: r.state, q: r.q, cursor: r.cursor, limit: PAGE_SIZE })}`);
  if (!res.ok) {
    frame(view, "Sessions", searchForm(r), h("p", { class: "error" }, res.data?.message || "Cannot load sessions."));
    return;
  }
  const typing = document.activeElement?.id === "session-search" ? document.activeElement.value : null;
  const rows = res.data.map((s) => h("tr", { dataset: { session: s.session_id, state: s.state } },
    h("td", {}, h("a", { href: `#/sessions/${s.session_id}` }, s.session_id)),
    h("td", {}, badge(s.state)), h("td", {}, String(s.last_step ?? "—")),
    h("td", { class: "created-by" }, s.created_by || "—"), h("td", {}, when(s.updated_at))));
  if (res.next) state.previousCursor.set(`s|${res.next}`, r.cursor);
  const filtered = r.state || r.q;
  frame(view, "Sessions", searchForm(r),
    res.data.length
      ? table(["Session", "State", "Last step", "Created by", "Updated"], rows, { id: "sessions-table" })
      : h("p", { class: "empty" }, filtered ? "No sessions match." : "No sessions yet."),
    pager("session-pager", {
      cursor: r.cursor, next: res.next, previous: state.previousCursor.get(`s|${r.cursor}`),
      hashFor: (c) => sessionsHash({ state: r.state, q: r.q, cursor: c }),
    }));
  if (typing !== null) { // a live refresh must not take the search box from under the typist
    const box = $("#session-search");
    box.value = typing;
    box.focus();
  }
}

function searchForm(r) {
  const submit = (event) => {
    event.preventDefault();
    const form = event.target;
    location.hash = sessionsHash({ state: form.elements.state.value, q: form.elements.q.value.trim() });
  };
  return h("form", { class: "search", role: "search", id: "session-filters", onsubmit: submit },
    h("div", { class: "field grow" }, h("label", { for: "session-search" }, "Search sessions"),
      h("input", { id: "session-search", name: "q", type: "search", value: r.q, maxlength: "200",
        placeholder: "session id, key name or tool" })),
    h("div", { class: "field" }, h("label", { for: "session-state-filter" }, "State"),
      h("select", { id: "session-state-filter", name: "state" }, h("option", { value: "" }, "Any state"),
        STATES.map((s) => h("option", { value: s, selected: s === r.state }, s.replace(/_/g, " "))))),
    h("div", { class: "field" }, h("button", { type: "submit" }, "Search")));
}

export async function renderSession(view, id, quiet) {
  const res = await api(`/sessions/${encodeURIComponent(id)}`);
  if (!res.ok) {
    frame(view, "Session", h("p", { class: "error" }, res.data?.message || "Cannot load this session."));
    return;
  }
  const history = await api(`/events/recent${query({ session_id: id, limit: HISTORY })}`);
  const s = res.data;
  const effects = s.effects.map((e) => h("tr", { dataset: { effect: e.effect_id, state: e.state, step: e.step_index } },
    h("td", {}, String(e.step_index)), h("td", {}, e.tool_name), h("td", {}, badge(e.tier)), h("td", {}, badge(e.state)),
    h("td", {}, String(e.attempts)),
    h("td", {}, e.error ? h("span", { class: "error" }, e.error) : h("pre", { class: "json" }, pretty(e.result))),
    h("td", {}, String(e.replay_count)),
    // Selective undo (docs/undo.md): the entries of the calls after this one.
    h("td", {}, may("rollback") && laterPending(s, e.step_index) ? h("button", { type: "button", class: "secondary undo-after",
      onclick: () => undoSome(s.session_id, { after_step: e.step_index }, `every call after step ${e.step_index}`) },
    "Undo after this step") : "")));
  const undo = s.undo_stack.map((u) => h("tr", { dataset: { entry: u.entry_id, state: u.state } },
    h("td", {}, String(u.seq)), h("td", {}, u.fn_name), h("td", {}, badge(u.state)),
    h("td", {}, `${u.attempts} of ${u.max_retries + 1}`), h("td", {}, u.last_error || "—"),
    h("td", {}, u.state === "failed" ? h("div", { class: "actions" },
      // An operator's repairs: shown to every role, usable by the roles that may (the reason
      // is on the button otherwise).
      h("button", { type: "button", class: "retry", ...adminOnly("undo_retry"), onclick: () => retryEntry(s.session_id, u) }, "Retry"),
      h("button", { type: "button", class: "secondary resolve", ...adminOnly("undo_resolve"), onclick: () => resolveEntry(u) }, "Resolve"),
      may("undo_retry") ? null : h("span", { class: "hint" }, "Retry and Resolve need an admin key."))
      : u.state === "pending" && may("rollback") ? h("button", { type: "button", class: "secondary undo-entry",
        onclick: () => undoSome(s.session_id, { entries: [u.entry_id] }, `${u.fn_name} (entry ${u.seq})`) }, "Undo this") : "")));
  const approvals = s.approvals.map((a) => h("tr", { dataset: { approval: a.id, status: a.status } },
    h("td", {}, a.tool_name), h("td", {}, badge(a.status)), h("td", {}, a.decided_by || "—"), h("td", {}, a.reason || "—")));
  const canRollback = ROLLBACK_STATES.has(s.state) && may("rollback");
  const sessionActivity = history.ok ? history.data : state.activity.filter((e) => e.session_id === s.session_id);
  const keepFlash = quiet && $("#flash")?.textContent;
  frame(view, `Session ${shortId(s.session_id)}`,
    h("p", { class: "meta" }, h("code", {}, s.session_id), " ", h("span", { id: "session-state" }, badge(s.state)),
      ` · last step ${s.last_step ?? "—"} · updated ${when(s.updated_at)}`),
    canRollback ? h("div", { class: "actions" }, h("button", { type: "button", class: "danger", id: "rollback",
      disabled: state.busy, onclick: () => confirmRollback(s.session_id) },
    state.busy ? "Rolling back…" : (s.state === "compensation_failed" || s.state === "compensating") ? "Continue rollback" : "Roll back")) : null,
    h("h2", {}, "Timeline"),
    s.effects.length ? table(["Step", "Tool", "Tier", "State", "Attempts", "Result or error", "Replays", "Undo"], effects, { id: "effects-table" })
      : h("p", { class: "empty" }, "No effects."),
    h("h2", {}, "Undo stack"),
    s.undo_stack.length ? table(["Seq", "Compensation", "State", "Attempts", "Last error", "Actions"], undo, { id: "undo-table" })
      : h("p", { class: "empty" }, "Nothing to undo."),
    h("h2", {}, "Approvals"),
    s.approvals.length ? table(["Tool", "Status", "Decided by", "Reason"], approvals, { id: "session-approvals" })
      : h("p", { class: "empty" }, "No approvals."),
    h("h2", {}, "Activity"),
    activityList(sessionActivity.slice(0, HISTORY)));
  if (!keepFlash && !quiet) say("");
}

// A button the role may not use: disabled, with the reason as its title.
function adminOnly(action) {
  return may(action) ? {} : { disabled: true, title: needsAdmin() };
}

async function confirmRollback(sessionId) {
  if (!(await ask($("#confirm-dialog")))) return;
  await rollback(sessionId);
}

async function rollback(sessionId) {
  state.busy = true;
  say("Rolling back…");
  await render({ quiet: true });
  const res = await api(`/sessions/${encodeURIComponent(sessionId)}/rollback`, { method: "POST" });
  state.busy = false;
  if (res.ok) {
    say(res.data.outcome === "compensated" ? "Rolled back: every undoable effect is compensated."
      : res.data.outcome === "empty_undo_stack" ? "Nothing to undo." : `Rollback: ${res.data.outcome}.`, "ok");
  } else {
    say(`Rollback stopped: ${res.data?.message || res.status}`, "error");
  }
  await render({ quiet: true });
}

async function retryEntry(sessionId, entry) {
  say(`Retrying ${entry.fn_name}…`); // at once: the last outcome must not stay on show meanwhile
  const res = await api(`/undo/${encodeURIComponent(entry.entry_id)}/retry`, { method: "POST" });
  if (!res.ok) { say(res.data?.message || "Retry failed.", "error"); return; }
  await rollback(sessionId);
}

async function resolveEntry(entry) {
  const dialog = $("#resolve-dialog");
  $("#resolve-note").value = "";
  if (!(await ask(dialog))) return;
  const note = $("#resolve-note").value.trim();
  const res = await api(`/undo/${encodeURIComponent(entry.entry_id)}/resolve`, { method: "POST", body: { note } });
  say(res.ok ? `Resolved ${entry.fn_name} by hand. Continue the rollback to unwind the rest.` : (res.data?.message || "Resolve failed."),
    res.ok ? "ok" : "error");
  await render({ quiet: true });
}
