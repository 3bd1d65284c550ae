-- Version 16: the dashboard's searches and pages (docs/dashboard.md).
--
-- An approval records the id of the API key whose call asked for it, so a person deciding
-- sees who is asking (the key's name, joined at read time; never the secret). Approvals from
-- before this version take their session's owner, the key that created the session: an agent
-- key calls in its own sessions only, so that is who asked in all but an admin's calls.
ALTER TABLE approvals ADD COLUMN requested_by_key_id TEXT;
UPDATE approvals SET requested_by_key_id = (
    SELECT s.owner_key_id FROM sessions s
    WHERE s.org_id = approvals.org_id AND s.session_id = approvals.session_id
);

-- Keyset pages, newest first: every state at once, one tool, one session state.
CREATE INDEX approvals_by_created ON approvals (org_id, created_us, approval_id);
CREATE INDEX approvals_by_tool ON approvals (org_id, tool_name, created_us, approval_id);
CREATE INDEX sessions_by_state ON sessions (org_id, state, updated_us, session_id);
