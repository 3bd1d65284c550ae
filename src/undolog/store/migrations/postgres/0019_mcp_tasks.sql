-- Version 19: MCP tasks (the 2025-11-25 tasks utility) over task-augmented tools/call
-- (docs/mcp.md, "MCP Tasks").
--
-- A task is looked up by its random id within the caller's org, so any proxy process answers
-- tasks/get and tasks/result. A call that waits for a person keeps only its effect and its
-- approval: the task's state is derived from them when asked. A call that ended at once keeps
-- the answer it gave (a read-only call or a refusal records no effect). Rows past
-- expires_us may be deleted; the gateway deletes them a batch at a time as it creates tasks.
CREATE TABLE mcp_tasks (
    task_id      TEXT PRIMARY KEY,
    org_id       TEXT NOT NULL,
    owner_key_id TEXT,
    session_id   TEXT,
    effect_id    TEXT,
    approval_id  TEXT,
    tool_name    TEXT NOT NULL,
    result       TEXT,
    created_us   BIGINT NOT NULL,
    ttl_ms       BIGINT NOT NULL,
    expires_us   BIGINT NOT NULL
);
CREATE INDEX mcp_tasks_expiry ON mcp_tasks (org_id, expires_us);
