-- Version 25: what retention pruned, so the audit chain runs on across it (docs/audit.md,
-- "Retention").
--
-- `audit_pruned_events`: one row per event retention deleted, written in the transaction
-- that deleted it: its number in the org's sequence (migration 24) and the hash of its
-- audit record as the chain computes it. `undolog audit export|verify` take the row in
-- place of the event (a gap with no row is still "missing"), and the chain goes on from
-- its hash; an exported anchor or the stored head still finds a row whose hash was forged.
--
-- `audit_pruned_calls`: the `call` of each effect retention deleted (tool, step, tier,
-- SHA-256 of the arguments; canonical JSON), kept while events of the effect may still be
-- in the database, so their records hash as they did while the effect was there. A row
-- goes once every event older than it has been walked by a prune.
CREATE TABLE audit_pruned_events (
    org_id      TEXT NOT NULL,
    audit_seq   BIGINT NOT NULL,
    record_hash TEXT NOT NULL,
    pruned_us   BIGINT NOT NULL,
    PRIMARY KEY (org_id, audit_seq)
);

CREATE TABLE audit_pruned_calls (
    org_id    TEXT NOT NULL,
    effect_id TEXT NOT NULL,
    call_json TEXT NOT NULL,
    pruned_us BIGINT NOT NULL,
    PRIMARY KEY (org_id, effect_id)
);
