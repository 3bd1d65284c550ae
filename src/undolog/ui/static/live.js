// Live events: the latest ones loaded from history (GET /events/recent) when the page loads,
// then GET /events resumed from the newest of them, so the feed is never empty after a
// reload and nothing is missed or shown twice between the two.

import { api } from "./api.js";
import { $, badge, h, shortId } from "./dom.js";
import { route } from "./nav.js";
import { scheduleRefresh, state } from "./state.js";

const EVENT_TYPES = [
  "effect_intercepted", "effect_committed", "effect_replayed", "effect_failed",
  "approval_required", "approval_approved", "approval_rejected", "approval_timed_out",
  "approval_auto_approved", "session_compensating", "session_compensated",
  "session_completed", "session_closed", "session_halted", "compensation_started",
  "compensation_completed", "compensation_failed", "compensation_retrying",
  "compensation_skipped", "compensation_retried", "compensation_resolved",
  "compensation_running", "compensation_compensated", "call_denied",
  "approval_partially_approved",
];
export const HISTORY = 50;
const KEPT = 200;

let onSessionGone = () => {};

export function whenSessionGone(fn) {
  onSessionGone = fn;
}

function setLive(kind, text) {
  const live = $("#live");
  live.dataset.state = kind;
  live.textContent = text;
}

// The latest events from history, newest first; the stream then resumes after the newest.
export async function loadHistory() {
  const res = await api(`/events/recent?limit=${HISTORY}`);
  if (!res.ok) return;
  state.activity = res.data;
  if (res.data.length) state.lastEventId = res.data[0].id;
}

export function stopEvents() {
  clearTimeout(state.reconnectTimer);
  if (state.events) state.events.close();
  state.events = null;
}

export function startEvents() {
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
    onSessionGone("Your session has ended: sign in again.");
    return;
  }
  startEvents();
}

function onEvent(message) {
  const id = message.lastEventId;
  if (id && state.lastEventId && BigInt(id) <= BigInt(state.lastEventId)) return; // seen
  if (id) state.lastEventId = id;
  let data;
  try { data = JSON.parse(message.data); } catch { return; }
  const event = { ...data, id, type: message.type };
  state.activity.unshift(event);
  state.activity.length = Math.min(state.activity.length, KEPT);
  appendActivity(event);
  scheduleRefresh();
}

export function activityList(items) {
  return h("ol", { class: "activity", id: "activity" },
    items.map((e) => activityItem(e, e.type)));
}

function activityItem(e, type) {
  const p = e.payload || {};
  const what = p.fn_name || p.tool_name || p.stage || "";
  return h("li", { dataset: { type, id: e.id || "" } },
    h("time", {}, e.timestamp ? new Date(e.timestamp).toLocaleTimeString() : ""), " ",
    badge(type), " ", what,
    p.by ? [" · by ", h("span", { class: "by" }, p.by)] : "", // who asked for a rollback or undo
    e.session_id ? [" · session ", h("a", { href: `#/sessions/${e.session_id}` }, shortId(e.session_id))] : "");
}

function appendActivity(event) {
  const list = $("#activity");
  if (!list) return;
  const r = route();
  if (r.view === "session" && event.session_id !== r.id) return;
  if (event.id && list.querySelector(`[data-id="${CSS.escape(event.id)}"]`)) return; // drawn
  list.prepend(activityItem(event, event.type));
  while (list.children.length > HISTORY) list.lastChild.remove();
}
