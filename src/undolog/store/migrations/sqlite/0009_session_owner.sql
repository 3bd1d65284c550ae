-- Version 9: a session has an owner, the id of the API key whose call created it.
-- An `agent` key sees and acts on its own sessions only; approver and admin keys see the
-- whole org. Sessions created before this version have no owner (NULL): only approver and
-- admin keys see them.
ALTER TABLE sessions ADD COLUMN owner_key_id TEXT;
CREATE INDEX sessions_by_owner ON sessions (org_id, owner_key_id, updated_us);
