// The page's shared state and its one render queue (docs/dashboard.md).
// Views register with `setRenderer`; anything may ask for a render or a debounced refresh.

export const state = {
  org: null,
  role: null,
  actions: {}, // what the key's role may do (GET /ui/session): an action it may not is not offered
  events: null,
  lastEventId: null,
  reconnectTimer: null,
  refreshTimer: null,
  tools: new Map(),
  decided: new Map(), // approval id -> what happened when it was decided on this page
  activity: [], // recent events, newest first (loaded from history, then live)
  previousCursor: new Map(), // a page's cursor -> the cursor of the page before it
  busy: false,
};

let renderer = async () => {};
let rendering = Promise.resolve();

export function setRenderer(fn) {
  renderer = fn;
}

export function render(options = {}) {
  // One render at a time: a burst of events must not interleave two.
  rendering = rendering.then(() => renderer(options)).catch((err) => console.warn(err));
  return rendering;
}

export function rendered() {
  return rendering;
}

export function scheduleRefresh() {
  if (state.refreshTimer) return;
  state.refreshTimer = setTimeout(async () => {
    state.refreshTimer = null;
    await render({ quiet: true });
  }, 120);
}

export function forget() {
  // Nothing of the last org stays on the page (another key may sign in next).
  clearTimeout(state.refreshTimer);
  state.refreshTimer = null;
  state.org = null;
  state.role = null;
  state.actions = {};
  state.decided.clear();
  state.previousCursor.clear();
  state.activity = [];
  state.lastEventId = null;
}

// Whether the signed-in key's role may use one of the page's actions (docs/dashboard.md).
export function may(action) {
  return state.actions[action] === true;
}

export function needsAdmin() {
  return `Needs an admin key (you are signed in with ${state.role === "approver" ? "an approver" : "a"} key).`;
}
