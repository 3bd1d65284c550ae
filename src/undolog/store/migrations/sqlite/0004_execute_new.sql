-- Version 4: nothing for SQLite. PostgreSQL adds a function that intercepts a new call in one
-- round trip; SQLite has no round trips to save (it serialises writers with BEGIN IMMEDIATE).
SELECT 1;
