// The UndoLog dashboard: approvals, sessions and rollback, live from GET /events.
// Plain ES modules, no dependencies, no build step (docs/dashboard.md):
//   state.js     shared state and the one render queue
//   api.js       the REST API with the session cookie
//   dom.js       element builder, formatting, dialogs, pagers
//   nav.js       routes in the location hash
//   live.js      recent events from history, then the live stream
//   approvals.js the approvals view (filters, pages, cards, confirmation)
//   editargs.js  approve with changes: the JSON editor of a pending card
//   sessions.js  the sessions list (search, filters, pages) and one session's page
// This file signs in and out, routes, and draws the overview.

import { api, whenUnauthorized } from "./api.js";
import { renderApprovals, updateTimes } from "./approvals.js";
import { $, frame, h, say } from "./dom.js";
import { activityList, loadHistory, startEvents, stopEvents, whenSessionGone } from "./live.js";
import { route } from "./nav.js";
import { renderSession, renderSessions } from "./sessions.js";
import { forget, render, rendered, setRenderer, state } from "./state.js";

// -- sign-in ----------------------------------------------------------------------------------

function showLogin(message = "") {
  stopEvents();
  forget();
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

async function start(who) {
  const org = who.org_id;
  state.org = org;
  state.role = who.role;
  state.actions = who.actions || {};
  $("#login").hidden = true;
  $("#nav").hidden = false;
  $("#who").hidden = false;
  $("#org-id").textContent = org;
  $("#key-name").textContent = who.key_name ? `${who.key_name} (${who.role})` : "";
  const tools = await api("/tools");
  if (tools.ok) state.tools = new Map(tools.data.map((t) => [t.name, t]));
  await loadHistory(); // the feed is not empty after a reload; the stream resumes after it
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
  await start(res.data);
}

async function onSignOut() {
  showLogin("Signing out…");
  await rendered(); // a render under way ends before the cookie goes
  await api("/ui/logout", { method: "POST" });
  $("#login-error").textContent = "Signed out.";
}

// -- rendering --------------------------------------------------------------------------------

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
  if (r.view === "overview") await renderOverview(view);
  else if (r.view === "approvals") await renderApprovals(view, r, quiet);
  else if (r.view === "sessions") await renderSessions(view, r);
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
      card("Compensating", o.sessions_compensating, "#/sessions?state=compensating", "sessions_compensating"),
      card("Need attention", o.sessions_needing_attention, "#/sessions", "sessions_needing_attention"),
      card("Calls in doubt", o.effects_in_doubt, "#/sessions", "effects_in_doubt"),
    ),
    h("h2", {}, "Recent events"),
    activityList(state.activity.slice(0, 20)),
  );
}

// -- boot -------------------------------------------------------------------------------------

setInterval(() => {
  for (const card of document.querySelectorAll("[data-approval]")) updateTimes(card);
}, 1000);

async function boot() {
  setRenderer(renderNow);
  whenUnauthorized(signedOut);
  whenSessionGone(signedOut);
  $("#login-form").addEventListener("submit", onLogin);
  $("#sign-out").addEventListener("click", onSignOut);
  window.addEventListener("hashchange", () => { say(""); render(); });
  let who = { signed_in: false };
  try {
    who = await (await fetch("/ui/session", { credentials: "same-origin" })).json();
  } catch { /* shown as signed out */ }
  if (who.signed_in) await start(who);
  else showLogin();
}

boot();
