// Small DOM helpers shared by the views: element builder, formatting, dialogs, pagers.

export const $ = (selector, root = document) => root.querySelector(selector);

export function h(tag, attrs = {}, ...children) {
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

export function pretty(value) {
  return JSON.stringify(value, null, 2);
}

export function duration(ms) {
  const s = Math.max(0, Math.round(ms / 1000));
  if (s < 60) return `${s}s`;
  const m = Math.floor(s / 60);
  if (m < 60) return `${m}m ${s % 60}s`;
  const hours = Math.floor(m / 60);
  if (hours < 48) return `${hours}h ${m % 60}m`;
  return `${Math.floor(hours / 24)}d ${hours % 24}h`;
}

export function when(iso) {
  return iso ? new Date(iso).toLocaleString() : "—";
}

export function badge(value) {
  return h("span", { class: `state state-${value}` }, String(value).replace(/_/g, " "));
}

export function shortId(id) {
  return id ? id.slice(0, 8) : "—";
}

export function say(message, kind = "info") {
  const box = $("#flash");
  if (!box) return;
  box.textContent = message;
  box.dataset.kind = kind;
}

export function frame(view, title, ...children) {
  const flash = $("#flash");
  const shown = children.flat().filter((c) => c !== null && c !== undefined && c !== false);
  view.replaceChildren(h("h1", {}, title), flash || h("p", { id: "flash", role: "status" }), ...shown);
}

export function table(headers, rows, attrs = {}) {
  return h("div", { class: "scroll" }, h("table", attrs,
    h("thead", {}, h("tr", {}, headers.map((x) => h("th", { scope: "col" }, x)))),
    h("tbody", {}, rows)));
}

// Open a <dialog> modally; resolves true when it closes with the "ok" button.
export function ask(dialog) {
  return new Promise((resolve) => {
    dialog.returnValue = "";
    dialog.addEventListener("close", () => resolve(dialog.returnValue === "ok"), { once: true });
    dialog.showModal();
  });
}

// "Previous page" / "Next page" links for a keyset-paged list. `hashFor(cursor)` builds the
// link of a page; `previous` is the cursor before this page ("" = the first page; undefined:
// unknown after a reload, so the link goes back to the first page).
export function pager(id, { cursor, next, previous, hashFor }) {
  if (!cursor && !next) return null;
  const back = cursor ? h("a", { class: "filter", rel: "prev", href: hashFor(previous ?? "") },
    previous === undefined ? "First page" : "Previous page") : null;
  const forward = next ? h("a", { class: "filter", rel: "next", href: hashFor(next) }, "Next page") : null;
  return h("nav", { class: "pager filters", id, "aria-label": "Pages" }, back, forward);
}
