-- Version 13: policy rules and richer approvals (docs/approvals.md).
-- `policy_rules` holds an org's ordered rule list as one JSON document: a PUT replaces the
-- list whole, so the order (the first matching rule wins) is never half written.
CREATE TABLE policy_rules (
    org_id     TEXT PRIMARY KEY,
    rules      TEXT NOT NULL,
    updated_us BIGINT NOT NULL,
    updated_by TEXT
);
-- An approval remembers the rule that asked for it (or decided it), how many distinct
-- approver keys it needs, who approved so far (a JSON list of key ids and names), the
-- arguments an approver changed the call to (the key that made the call: migration 16).
ALTER TABLE approvals ADD COLUMN rule TEXT;
ALTER TABLE approvals ADD COLUMN approvers_required INTEGER NOT NULL DEFAULT 1;
ALTER TABLE approvals ADD COLUMN approved_by TEXT NOT NULL DEFAULT '[]';
ALTER TABLE approvals ADD COLUMN approved_args TEXT;
