-- Version 20: a new call touches its session with a HOT update (docs/performance.md).
--
-- Every new call updated its session row's `updated_us`, which three indexes hold
-- (`sessions_by_update`, `sessions_by_owner`, `sessions_by_state`): each call was a non-HOT
-- update writing a new heap tuple and four index entries (with the primary key). Now a call
-- moves `updated_us` only when it is older than `p_touch_us` (the store passes
-- `SESSION_TOUCH_US`, one second); otherwise it changes `last_step` alone, which no index
-- holds, so PostgreSQL updates the row in place on its page (HOT) and writes no index entry.
-- `updated_us` is now a session's last change of state, or its last call to within
-- `p_touch_us`. A HOT update needs room on the row's page: the session table leaves 20% of
-- each page free for it (fillfactor; pages written from now on).
--
-- `undolog_execute_new` takes `p_touch_us`; otherwise as in version 10, still one round trip.
-- The old signature is dropped so that no overload lingers.
ALTER TABLE sessions SET (fillfactor = 80);

DROP FUNCTION IF EXISTS undolog_execute_new(BIGINT, TEXT, TEXT, TEXT, BIGINT, TEXT, TEXT, TEXT,
    TEXT, TEXT, TEXT, TEXT, INTEGER, BIGINT, BIGINT, BIGINT, TEXT, TEXT, TEXT, TEXT, TEXT, TEXT,
    INTEGER, INTEGER, BIGINT, TEXT, TEXT, TEXT[], TEXT, TEXT, TEXT, BOOLEAN, TEXT);
-- `undolog_execute_new` itself is in store/functions/postgres.sql, which every migrate applies
-- after the migrations (CREATE OR REPLACE): one definition, the current one.
