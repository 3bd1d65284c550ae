-- Version 9: a session has an owner, the id of the API key whose call created it.
-- An `agent` key sees and acts on its own sessions only; approver and admin keys see the
-- whole org. Sessions created before this version have no owner (NULL): only approver and
-- admin keys see them.
--
-- `undolog_execute_new` (versions 4, 7) takes the owner: a session it creates is recorded as
-- `p_owner`'s, and with `p_owner_only` (an agent key's call) a session that exists and is not
-- `p_owner`'s answers 'forbidden' with nothing written, before any replay. Still one round
-- trip. The old signature is dropped so that no overload lingers.
ALTER TABLE sessions ADD COLUMN owner_key_id TEXT;
CREATE INDEX sessions_by_owner ON sessions (org_id, owner_key_id, updated_us);

DROP FUNCTION IF EXISTS undolog_execute_new(BIGINT, TEXT, TEXT, TEXT, BIGINT, TEXT, TEXT, TEXT,
    TEXT, TEXT, TEXT, TEXT, INTEGER, BIGINT, BIGINT, BIGINT, TEXT, TEXT, TEXT, TEXT, TEXT, TEXT,
    INTEGER, INTEGER, BIGINT, TEXT, TEXT, TEXT[], TEXT, TEXT);
-- `undolog_execute_new` itself is in store/functions/postgres.sql, which every migrate applies
-- after the migrations (CREATE OR REPLACE): one definition, the current one.
