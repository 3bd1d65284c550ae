// The UndoLog dashboard: approvals, sessions and rollback, live from GET /events.
// Plain ES module, no dependencies. Data comes from the REST API with the session cookie;
// every state-changing request carries X-Requested-With so the edge knows it is ours.

const EVENT_TYPES = [
  "effect_intercepted", "effect_committed", "effect_replayed", "effect_failed",
  "approval_required", "approval_approved", "approval_rejected", "approval_timed_out",
  "approval_auto_approved", "session_compensating", "session_compensated",
  "session_completed", "session_closed", "session_halted", "compensation_started",
  "compensation_completed", "compensation_failed", "compensation_retrying",
  "compensation_skipped", "compensation_retried", "compensation_resolved",
  "compensation_running", "compensation_compensated",
];
const APPROVAL_FILTERS = [
  ["pending", "Pending"], ["approved", "Approved"], ["rejected", "Rejected"],
  ["timed_out", "Timed out"], ["auto_approved", "Auto-approved"],
];
const ROLLBACK_STATES = new Set(["active", "failed", "halted", "compensating", "compensation_failed"]);

const state = {
  org: null,
  events: null,
  lastEventId: null,
  reconnectTimer: null,
  refreshTimer: null,
  tools: new Map(),
  decided: new Map(), // approval id -> what happened when it was decided on this page
  activity: [], // recent events, newest first
  busy: false,
};

// -- small helpers ----------------------------------------------------------------------------

const $ = (selector, root = document) => root.querySelector(selector);

function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs)) {
    if (value === null || value === undefined || value === false) continue;
    if (key === "class") el.className = value;
    else if (key.startsWith("on")) el.addEventListener(key.slice(2), value);
    else if (key === "dataset") Object.assign(el.dataset, value);
    else el.setAttribute(key, value === true ? "" : value);
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined || child === false) continue;
    el.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return el;
}

function pretty(value) {
  return JSON.stringify(value, null, 2);
}

function duration(ms) {
  const s = Math.max(0, Math.round(ms / 1000));
  if (s < 60) return `${s}s`;
  const m = Math.floor(s / 60);
  if (m < 60) return `${m}m ${s % 60}s`;
  const hours = Math.floor(m / 60);
  if (hours < 48) return `${hours}h ${m % 60}m`;
  return `${Math.floor(hours / 24)}d ${hours % 24}h`;
}

function when(iso) {
  return iso ? new Date(iso).toLocaleString() : "—";
}

function badge(value) {
  return h("span", { class: `state state-${value}` }, String(value).replace(/_/g, " "));
}

function shortId(id) {
  return id ? id.slice(0, 8) : "—";
}

function say(message, kind = "info") {
  const box = $("#flash");
  if (!box) return;
  box.textContent = message;
  box.dataset.kind = kind;
}

async function api(path, { method = "GET", body } = {}) {
  if (state.org === null && !path.startsWith("/ui/")) {
    return { ok: false, status: 0, data: null }; // signed out: a late render asks for nothing
  }
  const init = { method, credentials: "same-origin", headers: { "X-Requested-With": "undolog-ui" } };
  if (body !== undefined) {
    init.headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  let response;
  try {
    response = await fetch(path, init);
  } catch (err) {
    return { ok: false, status: 0, data: { code: "network", message: "the server cannot be reached" } };
  }
  let data = null;
  const text = await response.text();
  if (text) {
    try { data = JSON.parse(text); } catch { data = { message: text }; }
  }
  if (response.status === 401) signedOut("Your session has ended: sign in again.");
  return { ok: response.ok, status: response.status, data };
}

// -- sign-in ----------------------------------------------------------------------------------

function showLogin(message = "") {
  state.org = null;
  stopEvents();
  clearTimeout(state.refreshTimer);
  state.refreshTimer = null;
  // Nothing of the last org stays on the page (another key may sign in next).
  state.decided.clear();
  state.activity = [];
  state.lastEventId = null;
  $("#nav").hidden = true;
  $("#who").hidden = true;
  $("#view").replaceChildren();
  $("#login").hidden = false;
  $("#login-error").textContent = message;
  $("#api-key").value = "";
  $("#api-key").focus();
}

function signedOut(message) {
  if (state.org !== null) showLogin(message);
}

async function start(org) {
  state.org = org;
  $("#login").hidden = true;
  $("#nav").hidden = false;
  $("#who").hidden = false;
  $("#org-id").textContent = org;
  const tools = await api("/tools");
  if (tools.ok) state.tools = new Map(tools.data.map((t) => [t.name, t]));
  startEvents();
  await render();
}

async function onLogin(event) {
  event.preventDefault();
  const key = $("#api-key").value.trim();
  if (!key) return;
  const button = $("#login-form button");
  button.disabled = true;
  const res = await api("/ui/login", { method: "POST", body: { api_key: key } });
  button.disabled = false;
  $("#api-key").value = "";
  if (!res.ok) {
    $("#login-error").textContent = res.data?.message || "Sign-in failed.";
    return;
  }
  await start(res.data.org_id);
}

async function onSignOut() {
  showLogin("Signing out…");
  await rendering; // a render under way ends before the cookie goes
  await api("/ui/logout", { method: "POST" });
  $("#login-error").textContent = "Signed out.";
}

// -- live events ------------------------------------------------------------------------------

function setLive(kind, text) {
  const live = $("#live");
  live.dataset.state = kind;
  live.textContent = text;
}

function stopEvents() {
  clearTimeout(state.reconnectTimer);
  if (state.events) state.events.close();
  state.events = null;
}

function startEvents() {
  stopEvents();
  const query = state.lastEventId ? `?last_event_id=${encodeURIComponent(state.lastEventId)}` : "";
  const source = new EventSource(`/events${query}`);
  state.events = source;
  source.onopen = () => {
    setLive("live", "live");
    // Whatever happened between the last fetch and this (re)connection is read again.
    scheduleRefresh();
  };
  source.onerror = () => {
    setLive("down", "reconnecting…");
    if (source.readyState === EventSource.CLOSED) {
      // The browser gave up (the server answered with an error, e.g. after a restart):
      // check the session, then resume from the last event seen.
      state.reconnectTimer = setTimeout(reconnect, 1000);
    }
  };
  const handle = (message) => onEvent(message);
  for (const type of EVENT_TYPES) source.addEventListener(type, handle);
  source.onmessage = handle;
}

async function reconnect() {
  if (state.org === null) return;
  let who;
  try {
    who = await (await fetch("/ui/session", { credentials: "same-origin" })).json();
  } catch {
    state.reconnectTimer = setTimeout(reconnect, 1000);
    return;
  }
  if (!who.signed_in) {
    signedOut("Your session has ended: sign in again.");
    return;
  }
  startEvents();
}

function onEvent(message) {
  if (message.lastEventId) state.lastEventId = message.lastEventId;
  let data;
  try { data = JSON.parse(message.data); } catch { return; }
  state.activity.unshift({ id: message.lastEventId, type: message.type, ...data });
  state.activity.length = Math.min(state.activity.length, 200);
  appendActivity(data, message.type);
  scheduleRefresh();
}

function scheduleRefresh() {
  if (state.refreshTimer) return;
  state.refreshTimer = setTimeout(async () => {
    state.refreshTimer = null;
    await render({ quiet: true });
  }, 120);
}

// -- routing ----------------------------------------------------------------------------------

function route() {
  const parts = (location.hash.replace(/^#\/?/, "") || "").split("/").filter(Boolean);
  if (parts[0] === "approvals") return { view: "approvals", filter: parts[1] || "pending" };
  if (parts[0] === "sessions" && parts[1]) return { view: "session", id: decodeURIComponent(parts[1]) };
  if (parts[0] === "sessions") return { view: "sessions" };
  return { view: "overview" };
}

let rendering = Promise.resolve();

function render(options = {}) {
  // One render at a time: a burst of events must not interleave two.
  rendering = rendering.then(() => renderNow(options)).catch((err) => console.warn(err));
  return rendering;
}

async function renderNow({ quiet = false } = {}) {
  if (state.org === null) return;
  const r = route();
  for (const link of document.querySelectorAll("[data-nav]")) {
    const current = link.dataset.nav === (r.view === "session" ? "sessions" : r.view);
    if (current) link.setAttribute("aria-current", "page");
    else link.removeAttribute("aria-current");
  }
  const view = $("#view");
  if (view.dataset.route !== location.hash || !quiet) {
    view.dataset.route = location.hash;
    view.dataset.kind = r.view;
  }
  await refreshBadge();
  if (r.view === "overview") await renderOverview(view, quiet);
  else if (r.view === "approvals") await renderApprovals(view, r.filter, quiet);
  else if (r.view === "sessions") await renderSessions(view);
  else await renderSession(view, r.id, quiet);
}

async function refreshBadge() {
  const res = await api("/approvals?state=pending&limit=500");
  if (!res.ok) return;
  const count = res.data.length;
  const el = $("#pending-badge");
  el.textContent = count ? String(count) : "";
  el.hidden = !count;
}

function frame(view, title, ...children) {
  const flash = $("#flash");
  const shown = children.flat().filter((c) => c !== null && c !== undefined && c !== false);
  view.replaceChildren(h("h1", {}, title), flash || h("p", { id: "flash", role: "status" }), ...shown);
}

// -- overview ---------------------------------------------------------------------------------

async function renderOverview(view) {
  const res = await api("/overview");
  if (!res.ok) return;
  const o = res.data;
  const card = (label, value, href, name) =>
    h("a", { class: "count", href, dataset: { count: name } },
      h("span", { class: "value" }, String(value)), h("span", { class: "label" }, label));
  frame(view, "Overview",
    h("div", { class: "counts" },
      card("Calls", o.calls, "#/sessions", "calls"),
      card("Replays", o.replays, "#/sessions", "replays"),
      card("Pending approvals", o.pending_approvals, "#/approvals", "pending_approvals"),
      card("Sessions", o.sessions, "#/sessions", "sessions"),
      card("Compensating", o.sessions_compensating, "#/sessions", "sessions_compensating"),
      card("Need attention", o.sessions_needing_attention, "#/sessions", "sessions_needing_attention"),
      card("Calls in doubt", o.effects_in_doubt, "#/sessions", "effects_in_doubt"),
    ),
    h("h2", {}, "Recent events"),
    activityList(state.activity.slice(0, 20)),
  );
}

function activityList(items) {
  return h("ol", { class: "activity", id: "activity" },
    items.map((e) => activityItem(e, e.type)));
}

function activityItem(e, type) {
  const p = e.payload || {};
  const what = p.fn_name || p.tool_name || p.stage || "";
  return h("li", { dataset: { type } },
    h("time", {}, e.timestamp ? new Date(e.timestamp).toLocaleTimeString() : ""), " ",
    badge(type), " ", what,
    e.session_id ? [" · session ", h("a", { href: `#/sessions/${e.session_id}` }, shortId(e.session_id))] : "");
}

function appendActivity(data, type) {
  const list = $("#activity");
  if (!list) return;
  const r = route();
  if (r.view === "session" && data.session_id !== r.id) return;
  list.prepend(activityItem(data, type));
  while (list.children.length > 50) list.lastChild.remove();
}

// -- approvals --------------------------------------------------------------------------------

function undoText(toolName) {
  const tool = state.tools.get(toolName);
  const tier = tool ? tool.tier : "irreversible";
  if (tier === "irreversible") return "cannot be undone";
  if (tier === "compensable" && tool.compensation) return `undone by ${tool.compensation.fn_name}`;
  return "nothing to undo";
}

async function renderApprovals(view, filter, quiet) {
  const res = await api(`/approvals?state=${encodeURIComponent(filter)}&limit=200`);
  if (!res.ok) {
    frame(view, "Approvals", h("p", { class: "error" }, res.data?.message || "Cannot load approvals."));
    return;
  }
  let list = $("#approval-list");
  if (!quiet || !list || list.dataset.filter !== filter) {
    list = h("div", { id: "approval-list", class: "cards", dataset: { filter } });
    const tabs = h("div", { class: "filters", role: "group", "aria-label": "Show approvals" },
      APPROVAL_FILTERS.map(([value, label]) =>
        h("a", { href: `#/approvals/${value}`, class: "filter", "aria-current": value === filter ? "page" : null }, label)));
    frame(view, "Approvals", tabs, h("div", { id: "decided", class: "cards" }), list);
  }
  // Keep existing cards (a reason being typed must survive a live refresh).
  const seen = new Set();
  let previous = null;
  for (const approval of res.data) {
    seen.add(approval.id);
    let card = list.querySelector(`[data-approval="${CSS.escape(approval.id)}"]`);
    if (!card) card = approvalCard(approval, filter === "pending");
    else updateTimes(card);
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
  renderDecided();
}

function approvalCard(a, pending) {
  const reasonId = `reason-${a.id}`;
  const card = h("article", { class: "card approval", dataset: { approval: a.id, status: a.status, created: a.created_at, timeout: a.timeout_at || "" } },
    h("header", {}, h("h2", {}, a.tool_name), " ", badge(state.tools.get(a.tool_name)?.tier || "irreversible"), " ", badge(a.status)),
    h("dl", {},
      h("dt", {}, "Session"), h("dd", {}, h("a", { href: `#/sessions/${a.session_id}` }, a.session_id)),
      h("dt", {}, "Requested"), h("dd", { class: "age" }, ""),
      pending ? [h("dt", {}, "Time left"), h("dd", { class: "left" }, "")] : [
        h("dt", {}, "Decided"), h("dd", {}, `${when(a.decided_at)}${a.decided_by ? ` by ${a.decided_by}` : ""}`),
        h("dt", {}, "Reason"), h("dd", { class: "reason" }, a.reason || "—")],
      h("dt", {}, "Undo"), h("dd", { class: "undo" }, undoText(a.tool_name)),
    ),
    h("details", { open: true }, h("summary", {}, "Arguments"), h("pre", { class: "json" }, pretty(a.arguments ?? a.args))),
    pending ? h("div", { class: "decide" },
      h("label", { for: reasonId }, "Reason (optional)"),
      h("input", { id: reasonId, class: "reason-input", type: "text", maxlength: "2000" }),
      h("div", { class: "actions" },
        h("button", { type: "button", class: "approve", onclick: () => decide(a, "approve", card) }, "Approve"),
        h("button", { type: "button", class: "danger reject", onclick: () => decide(a, "reject", card) }, "Reject"))) : null,
  );
  updateTimes(card);
  return card;
}

function updateTimes(card) {
  const created = Date.parse(card.dataset.created);
  const age = card.querySelector(".age");
  if (age && created) age.textContent = `${duration(Date.now() - created)} ago`;
  const left = card.querySelector(".left");
  const timeout = Date.parse(card.dataset.timeout);
  if (left) left.textContent = timeout ? (timeout > Date.now() ? duration(timeout - Date.now()) : "timing out…") : "no timeout";
}

async function decide(a, verdict, card) {
  const reason = card.querySelector(".reason-input").value.trim();
  for (const b of card.querySelectorAll("button")) b.disabled = true;
  const body = {};  // who decides is the signed-in key, recorded by the proxy
  if (reason) body.reason = reason;
  const res = await api(`/approvals/${encodeURIComponent(a.id)}/${verdict}`, { method: "POST", body });
  state.decided.set(a.id, { approval: a, verdict, reason, res });
  card.remove();
  renderDecided();
  scheduleRefresh();
}

function renderDecided() {
  const box = $("#decided");
  if (!box) return;
  box.replaceChildren(...[...state.decided.values()].reverse().map(decidedCard));
}

function decidedCard({ approval: a, verdict, reason, res }) {
  let outcome;
  if (!res.ok) {
    outcome = h("p", { class: "error" }, res.data?.code === "approval_already_resolved"
      ? "Already decided elsewhere." : (res.data?.message || "The decision failed."));
  } else if (verdict === "reject") {
    outcome = h("p", {}, "Rejected", reason ? ` — ${reason}` : "", ". The session is halted.");
  } else if (res.data.execution === "committed") {
    const logical = res.data.result && res.data.result.success === false;
    outcome = [h("p", {}, "Approved and ", badge("committed"),
      logical ? h("span", { class: "error" }, ` — the tool reported a failure: ${res.data.result.error ?? ""}`) : ""),
    h("pre", { class: "json result" }, pretty(res.data.result))];
  } else if (res.data.execution === "failed") {
    outcome = h("p", { class: "error" }, "Approved, but the call failed: ", res.data.error);
  } else {
    outcome = h("p", {}, "Approved: the agent runs it on its next retry.");
  }
  return h("article", { class: "card decided", dataset: { decided: a.id, verdict } },
    h("header", {}, h("h2", {}, a.tool_name), " ", badge(verdict === "approve" ? "approved" : "rejected"),
      h("button", { type: "button", class: "secondary dismiss", "aria-label": `Dismiss ${a.tool_name}`,
        onclick: () => { state.decided.delete(a.id); renderDecided(); } }, "Dismiss")),
    outcome);
}

setInterval(() => {
  for (const card of document.querySelectorAll("[data-approval]")) updateTimes(card);
}, 1000);

// -- sessions ---------------------------------------------------------------------------------

function table(headers, rows, attrs = {}) {
  return h("div", { class: "scroll" }, h("table", attrs,
    h("thead", {}, h("tr", {}, headers.map((x) => h("th", { scope: "col" }, x)))),
    h("tbody", {}, rows)));
}

async function renderSessions(view) {
  const res = await api("/sessions?limit=200");
  if (!res.ok) return;
  const rows = res.data.map((s) => h("tr", { dataset: { session: s.session_id, state: s.state } },
    h("td", {}, h("a", { href: `#/sessions/${s.session_id}` }, s.session_id)),
    h("td", {}, badge(s.state)), h("td", {}, String(s.last_step ?? "—")), h("td", {}, when(s.updated_at))));
  frame(view, "Sessions", res.data.length
    ? table(["Session", "State", "Last step", "Updated"], rows, { id: "sessions-table" })
    : h("p", { class: "empty" }, "No sessions yet."));
}

async function renderSession(view, id, quiet) {
  const res = await api(`/sessions/${encodeURIComponent(id)}`);
  if (!res.ok) {
    frame(view, "Session", h("p", { class: "error" }, res.data?.message || "Cannot load this session."));
    return;
  }
  const s = res.data;
  const effects = s.effects.map((e) => h("tr", { dataset: { effect: e.effect_id, state: e.state, step: e.step_index } },
    h("td", {}, String(e.step_index)), h("td", {}, e.tool_name), h("td", {}, badge(e.tier)), h("td", {}, badge(e.state)),
    h("td", {}, String(e.attempts)),
    h("td", {}, e.error ? h("span", { class: "error" }, e.error) : h("pre", { class: "json" }, pretty(e.result))),
    h("td", {}, String(e.replay_count)),
    // Selective undo (docs/undo.md): the entries of the calls after this one.
    h("td", {}, laterPending(s, e.step_index) ? h("button", { type: "button", class: "secondary undo-after",
      onclick: () => undoSome(s.session_id, { after_step: e.step_index }, `every call after step ${e.step_index}`) },
    "Undo after this step") : "")));
  const undo = s.undo_stack.map((u) => h("tr", { dataset: { entry: u.entry_id, state: u.state } },
    h("td", {}, String(u.seq)), h("td", {}, u.fn_name), h("td", {}, badge(u.state)),
    h("td", {}, `${u.attempts} of ${u.max_retries + 1}`), h("td", {}, u.last_error || "—"),
    h("td", {}, u.state === "failed" ? h("div", { class: "actions" },
      h("button", { type: "button", class: "retry", onclick: () => retryEntry(s.session_id, u) }, "Retry"),
      h("button", { type: "button", class: "secondary resolve", onclick: () => resolveEntry(u) }, "Resolve"))
      : u.state === "pending" ? h("button", { type: "button", class: "secondary undo-entry",
        onclick: () => undoSome(s.session_id, { entries: [u.entry_id] }, `${u.fn_name} (entry ${u.seq})`) }, "Undo this") : "")));
  const approvals = s.approvals.map((a) => h("tr", { dataset: { approval: a.id, status: a.status } },
    h("td", {}, a.tool_name), h("td", {}, badge(a.status)), h("td", {}, a.decided_by || "—"), h("td", {}, a.reason || "—")));
  const canRollback = ROLLBACK_STATES.has(s.state);
  const sessionActivity = state.activity.filter((e) => e.session_id === s.session_id);
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
    h("h2", {}, "Live activity"),
    activityList(sessionActivity.slice(0, 50)));
  if (!keepFlash && !quiet) say("");
}

function ask(dialog) {
  return new Promise((resolve) => {
    dialog.returnValue = "";
    dialog.addEventListener("close", () => resolve(dialog.returnValue === "ok"), { once: true });
    dialog.showModal();
  });
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

function laterPending(s, step) {
  const steps = new Map(s.effects.map((e) => [e.effect_id, e.step_index]));
  return s.undo_stack.some((u) => u.state === "pending" && steps.get(u.effect_id) > step);
}

// A selective undo: confirm, then (if later calls may depend on it) confirm again with force.
async function undoSome(sessionId, selection, what) {
  if (!window.confirm(`Undo ${what}? Their compensations run now; the session stays open.`)) return;
  const path = `/sessions/${encodeURIComponent(sessionId)}/rollback`;
  let res = await api(path, { method: "POST", body: selection });
  if (!res.ok && res.data?.code === "dependent_effects") {
    const count = res.data.dependents.length;
    if (!window.confirm(`${count} later call(s) stay in place and may depend on this. Undo anyway?`)) {
      say("Nothing was undone.");
      return;
    }
    res = await api(path, { method: "POST", body: { ...selection, force: true } });
  }
  say(res.ok ? (res.data.outcome === "compensated" ? `Undone: ${what}.` : "Nothing to undo.")
    : `Undo stopped: ${res.data?.message || res.status}`, res.ok ? "ok" : "error");
  await render({ quiet: true });
}

async function retryEntry(sessionId, entry) {
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

// -- boot -------------------------------------------------------------------------------------

async function boot() {
  $("#login-form").addEventListener("submit", onLogin);
  $("#sign-out").addEventListener("click", onSignOut);
  window.addEventListener("hashchange", () => { say(""); render(); });
  let who = { signed_in: false };
  try {
    who = await (await fetch("/ui/session", { credentials: "same-origin" })).json();
  } catch { /* shown as signed out */ }
  if (who.signed_in) await start(who.org_id);
  else showLogin();
}

boot();
