// The page's routes live in the location hash: `#/approvals/<state>?tool=&cursor=`,
// `#/sessions?state=&q=&cursor=`, `#/sessions/<id>`, `#/` (overview).

import { query } from "./api.js";

export function route() {
  const [path, search = ""] = location.hash.replace(/^#\/?/, "").split("?");
  const parts = (path || "").split("/").filter(Boolean);
  const params = new URLSearchParams(search);
  const get = (name) => params.get(name) || "";
  if (parts[0] === "approvals") {
    return { view: "approvals", filter: parts[1] || "pending", tool: get("tool"), cursor: get("cursor") };
  }
  if (parts[0] === "sessions" && parts[1]) return { view: "session", id: decodeURIComponent(parts[1]) };
  if (parts[0] === "sessions") return { view: "sessions", state: get("state"), q: get("q"), cursor: get("cursor") };
  return { view: "overview" };
}

export function approvalsHash(filter, { tool = "", cursor = "" } = {}) {
  return `#/approvals/${encodeURIComponent(filter)}${query({ tool, cursor })}`;
}

export function sessionsHash({ state = "", q = "", cursor = "" } = {}) {
  return `#/sessions${query({ state, q, cursor })}`;
}
