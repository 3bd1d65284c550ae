// The REST API with the session cookie. Every request carries X-Requested-With so the edge
// knows it is ours; a 401 means the dashboard session ended.

import { state } from "./state.js";

let onUnauthorized = () => {};

export function whenUnauthorized(fn) {
  onUnauthorized = fn;
}

export const NEXT_CURSOR = "X-UndoLog-Next-Cursor";

export async function api(path, { method = "GET", body } = {}) {
  if (state.org === null && !path.startsWith("/ui/")) {
    return { ok: false, status: 0, data: null, next: null }; // signed out: a late render asks for nothing
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
    return { ok: false, status: 0, data: { code: "network", message: "the server cannot be reached" }, next: null };
  }
  let data = null;
  const text = await response.text();
  if (text) {
    try { data = JSON.parse(text); } catch { data = { message: text }; }
  }
  if (response.status === 401) onUnauthorized("Your session has ended: sign in again.");
  return { ok: response.ok, status: response.status, data, next: response.headers.get(NEXT_CURSOR) };
}

// A query string from an object, leaving out empty values.
export function query(params) {
  const search = new URLSearchParams();
  for (const [key, value] of Object.entries(params)) {
    if (value !== null && value !== undefined && value !== "") search.set(key, String(value));
  }
  const text = search.toString();
  return text ? `?${text}` : "";
}
