-- Version 2: who runs a compensation, and the lease of a claimed (running) undo entry.
ALTER TABLE undo_entries ADD COLUMN runner TEXT NOT NULL DEFAULT 'proxy';
ALTER TABLE undo_entries ADD COLUMN lease_expires_us BIGINT;
