-- Version 12: retention per org (docs/retention.md).
--
-- `retention_days`: how long an org keeps a finished session with everything that hangs off
-- it (effects, undo entries, approvals, events); NULL keeps everything (the default, and what
-- every org upgraded from an older version gets). Existing rows are left as they are.
--
-- No table is partitioned. Pruning walks `sessions_by_update` (org_id, updated_us), the time
-- index, and deletes a batch of sessions' rows through the per-session indexes that exist
-- already (`effects_by_session`, `undo_by_session`, approvals by `effect_id`); events go in
-- `event_id` order through `events_by_org`. Why not partitions: the call signature is unique
-- per org across all time, and PostgreSQL only enforces a unique constraint on a partitioned
-- table when it includes the partition key; undo entries and approvals reference effects by
-- `effect_id` alone; and a dropped time partition would take open sessions and the orgs that
-- keep longer with it. Deleted rows are reused after autovacuum, which these settings start
-- sooner on the two tables that grow with every call.
ALTER TABLE orgs ADD COLUMN retention_days INTEGER CHECK (retention_days > 0);
ALTER TABLE effects SET (autovacuum_vacuum_scale_factor = 0.05);
ALTER TABLE events SET (autovacuum_vacuum_scale_factor = 0.05);
