-- Version 22: nothing for SQLite. PostgreSQL adds `undolog_finish_effect`, so that concurrent
-- commits can share a statement; SQLite's writers already share a transaction (group commit
-- in store/sqlite.py).
SELECT 1;
