-- Version 8: the claim token of a claimed (running) undo entry, as its SHA-256 hex digest.
-- Only the runner that claimed the entry holds the token; complete and fail require it, so
-- another caller cannot report on an entry someone else is running. A new claim (after the
-- lease lapsed) replaces it, which invalidates the old holder's token.
ALTER TABLE undo_entries ADD COLUMN claim_token_hash TEXT;
