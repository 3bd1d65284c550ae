-- Version 10: `undolog_execute_new` takes the active session state as a parameter
-- (`p_active`) instead of spelling it: the store writes no engine state into its SQL
-- (docs/architecture.md, the store contract). Otherwise as in version 9, still one round
-- trip. The old signature is dropped so that no overload lingers.
DROP FUNCTION IF EXISTS undolog_execute_new(BIGINT, TEXT, TEXT, TEXT, BIGINT, TEXT, TEXT, TEXT,
    TEXT, TEXT, TEXT, TEXT, INTEGER, BIGINT, BIGINT, BIGINT, TEXT, TEXT, TEXT, TEXT, TEXT, TEXT,
    INTEGER, INTEGER, BIGINT, TEXT, TEXT, TEXT[], TEXT, TEXT, TEXT, BOOLEAN);
-- `undolog_execute_new` itself is in store/functions/postgres.sql, which every migrate applies
-- after the migrations (CREATE OR REPLACE): one definition, the current one.
