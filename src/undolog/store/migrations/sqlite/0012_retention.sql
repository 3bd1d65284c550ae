-- Version 12: retention per org (docs/retention.md).
--
-- `retention_days`: how long an org keeps a finished session with everything that hangs off
-- it (effects, undo entries, approvals, events); NULL keeps everything (the default, and what
-- every org upgraded from an older version gets). Existing rows are left as they are.
-- Pruning uses the indexes that exist: `sessions_by_update` (org_id, updated_us) to find old
-- sessions, then the per-session ones; events in `event_id` order (`events_by_org`).
ALTER TABLE orgs ADD COLUMN retention_days INTEGER CHECK (retention_days > 0);
