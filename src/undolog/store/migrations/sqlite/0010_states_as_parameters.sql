-- Version 10: nothing to change on SQLite. On PostgreSQL `undolog_execute_new` takes the
-- active session state as a parameter; SQLite has no stored function. Kept so that both
-- dialects share version numbers.
SELECT 1;
