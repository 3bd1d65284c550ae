-- Version 21: when a rollback hands an undo entry to its runner (the SDK), and until when.
--
-- `POST /undo/{entry}/claim` is only good for an entry that a rollback (full or selective)
-- answered `waiting_for_runner` with, so an agent cannot claim an entry of its session and run
-- its compensation outside a rollback (past a selective undo's `dependent_effects`, say). The
-- rollback sets `handed_until_us` (now + one lease); the claim clears it; NULL: not handed.
ALTER TABLE undo_entries ADD COLUMN handed_until_us BIGINT;
