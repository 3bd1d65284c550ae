// Selective undo from the session view (docs/undo.md): one undo entry, or every call after a
// step. The session stays open; later calls that may depend on the undone ones need a second
// confirmation (the API answers 409 dependent_effects until `force` is set).
import { api } from "./api.js";
import { say } from "./dom.js";
import { render } from "./state.js";

// Whether some pending undo entry belongs to a call after `step`.
export function laterPending(s, step) {
  const steps = new Map(s.effects.map((e) => [e.effect_id, e.step_index]));
  return s.undo_stack.some((u) => u.state === "pending" && steps.get(u.effect_id) > step);
}

// A selective undo: confirm, then (if later calls may depend on it) confirm again with force.
export async function undoSome(sessionId, selection, what) {
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
