-- Version 15: the head of each org's audit chain (docs/audit.md). `undolog audit export`
-- writes hash-chained JSON Lines and keeps here the hash of the last record it wrote, the
-- event that record came from and how many records the chain holds, so the next export
-- chains on and a verifier can compare a file's last hash with the stored one.
CREATE TABLE audit_heads (
    org_id        TEXT PRIMARY KEY REFERENCES orgs (org_id),
    head_hash     TEXT NOT NULL,
    last_event_id INTEGER NOT NULL,
    record_count  INTEGER NOT NULL,
    exported_us   INTEGER NOT NULL
);
