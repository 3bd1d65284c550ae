// Approve with changes (docs/dashboard.md, "Approve with changes"): on a pending card of a
// proxy-executed call, "Edit arguments" opens a JSON editor prefilled with the arguments that
// would run (another approver's edit, else the requested ones). What it holds is checked before anything is sent: a JSON object, with numbers
// the browser holds exactly. An SDK-executed call runs the agent's own arguments, so the API
// refuses changes to it (docs/approvals.md) and its card offers no editor.

import { h, pretty } from "./dom.js";

// Beyond this a JSON number is rounded by the browser, so the edit would not be what was typed.
const EXACT = Number.MAX_SAFE_INTEGER;

export function argsEditor(a) {
  if (a.mode !== "proxy") {
    return h("p", { class: "no-edit" },
      "The arguments cannot be changed here: the agent runs this call itself (SDK-executed), so it runs the agent's own arguments.");
  }
  const id = `edit-args-${a.id}`;
  const errorId = `${id}-error`;
  const text = h("textarea", { id, class: "args-editor json", rows: "8", spellcheck: "false",
    autocomplete: "off", "aria-describedby": errorId });
  const error = h("p", { id: errorId, class: "args-error error", role: "alert" });
  const box = h("div", { class: "args-edit", hidden: true },
    h("label", { for: id }, "Arguments to approve (JSON)"), text, error,
    h("button", { type: "button", class: "secondary discard-args", onclick: () => close() }, "Discard changes"));
  const toggle = h("button", { type: "button", class: "secondary edit-args", "aria-expanded": "false",
    "aria-controls": id, onclick: () => (box.hidden ? open() : close()) }, "Edit arguments");
  function open() {
    text.value = pretty(runArgs(a));
    box.hidden = false;
    toggle.setAttribute("aria-expanded", "true");
    text.focus();
  }
  function close() {
    box.hidden = true;
    toggle.setAttribute("aria-expanded", "false");
    clearError(text, error);
  }
  text.addEventListener("input", () => clearError(text, error));
  return h("div", { class: "args-editing" }, toggle, box);
}

function original(a) {
  return a.arguments ?? a.args;
}

// What runs if approved now: an approver's edit, else the requested arguments.
export function runArgs(a) {
  return a.approved_args ?? original(a);
}

function clearError(text, error) {
  error.textContent = "";
  text.removeAttribute("aria-invalid");
}

// What the approval sends: {ok: false} after showing why (nothing must be sent); else
// {ok: true, args} with `args` undefined when the editor is closed or nothing was changed.
export function editedArgs(card, a) {
  const text = card.querySelector(".args-editor");
  if (!text || text.closest(".args-edit").hidden) return { ok: true, args: undefined };
  const error = card.querySelector(".args-error");
  const problem = (message) => {
    error.textContent = message;
    text.setAttribute("aria-invalid", "true");
    text.focus();
    return { ok: false };
  };
  let value;
  try {
    value = JSON.parse(text.value);
  } catch (err) {
    return problem(`The arguments are not valid JSON: ${err.message}. Nothing was sent.`);
  }
  if (value === null || typeof value !== "object" || Array.isArray(value)) {
    return problem("The arguments must be a JSON object ({\"name\": value, ...}). Nothing was sent.");
  }
  if (!exact(value)) {
    return problem(`A number is too large to edit here exactly (beyond ±${EXACT}); use the CLI: ` +
      `undolog approvals approve ${a.id} --args '...'. Nothing was sent.`);
  }
  return { ok: true, args: canonical(value) === canonical(runArgs(a)) ? undefined : value };
}

// The top-level keys an approver added, removed or changed: the shape of the API's `args_diff`
// (engine/changes.py `args_diff`), for the card shown right after approving with changes.
export function argsDiff(requested, approved) {
  const diff = { added: {}, removed: {}, changed: {} };
  if (!isObject(requested) || !isObject(approved)) return diff;
  for (const [k, v] of Object.entries(approved)) if (!(k in requested)) diff.added[k] = v;
  for (const [k, v] of Object.entries(requested)) {
    if (!(k in approved)) diff.removed[k] = v;
    else if (canonical(approved[k]) !== canonical(v)) diff.changed[k] = { from: v, to: approved[k] };
  }
  return diff;
}

export function requestedArgs(a) {
  return original(a);
}

function isObject(value) {
  return value !== null && typeof value === "object" && !Array.isArray(value);
}

function exact(value) {
  if (typeof value === "number") return Number.isFinite(value) && (!Number.isInteger(value) || Math.abs(value) <= EXACT);
  if (value && typeof value === "object") return Object.values(value).every(exact);
  return true;
}

// Keys sorted at every level, so key order alone is no change.
function canonical(value) {
  if (Array.isArray(value)) return `[${value.map(canonical).join(",")}]`;
  if (value && typeof value === "object") {
    return `{${Object.keys(value).sort().map((k) => `${JSON.stringify(k)}:${canonical(value[k])}`).join(",")}}`;
  }
  return JSON.stringify(value);
}
