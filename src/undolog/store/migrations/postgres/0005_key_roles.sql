-- Version 5: API keys with an id, a name, a role, a source and a life (created, last used,
-- revoked); dashboard sessions kept server-side, tied to the key that signed in.
--
-- Keys already stored came from a config file or from `serve --demo`; they become
-- config-sourced `agent` keys with generated names, so the next start revokes those the
-- config no longer lists (a config key keeps working, as an agent key unless the config
-- now gives it a role).
ALTER TABLE api_keys ADD COLUMN key_id TEXT;
ALTER TABLE api_keys ADD COLUMN name TEXT;
ALTER TABLE api_keys ADD COLUMN role TEXT NOT NULL DEFAULT 'agent'
    CHECK (role IN ('agent', 'approver', 'admin'));
ALTER TABLE api_keys ADD COLUMN source TEXT NOT NULL DEFAULT 'config'
    CHECK (source IN ('config', 'cli', 'demo'));
ALTER TABLE api_keys ADD COLUMN last_used_us BIGINT;
ALTER TABLE api_keys ADD COLUMN revoked_us BIGINT;
UPDATE api_keys SET key_id = 'key_' || substr(md5(key_hash || random()::text), 1, 12),
    name = org_id || '-legacy-' || substr(key_hash, 1, 8);
CREATE UNIQUE INDEX api_keys_by_id ON api_keys (key_id);

CREATE TABLE ui_sessions (
    session_hash TEXT PRIMARY KEY,          -- SHA-256 hex of the session id the cookie carries
    key_id       TEXT NOT NULL,
    org_id       TEXT NOT NULL,
    created_us   BIGINT NOT NULL,
    expires_us   BIGINT NOT NULL,
    ended_us     BIGINT                     -- signed out (or the key was revoked)
);
CREATE INDEX ui_sessions_by_key ON ui_sessions (key_id);
