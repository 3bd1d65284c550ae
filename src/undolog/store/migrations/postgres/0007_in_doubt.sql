-- Version 7: replays never need a write, and the lease sweeper has an index.
--
-- `undolog_execute_new` (version 4) wrote a replay's event in the same statement, so a store
-- that could not write (disk full, `default_transaction_read_only`) failed every replay. The
-- event is now written best effort: if the insert fails, the replay is served all the same and
-- reported as 'replayed_unlogged'. Everything else is as in version 4.
CREATE INDEX IF NOT EXISTS effects_executing_lease ON effects (lease_expires_us)
    WHERE state = 'executing';
-- `undolog_execute_new` itself is in store/functions/postgres.sql, which every migrate applies
-- after the migrations (CREATE OR REPLACE): one definition, the current one.
