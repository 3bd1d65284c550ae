-- Version 23: a task that has ended keeps its answer (docs/mcp.md, "MCP Tasks").
--
-- A task whose call waited for a person derives its status from its effect and approval. Once
-- it has ended, the spec makes that status final, but the effect can still move: an in-doubt
-- effect is resolved later, a failed one may run again. The first read that finds the task
-- ended therefore writes its answer into `result` (only while `result` is NULL: the first
-- writer wins in every process), with when it ended and whether that answer is the effect's
-- recorded result (its delivery is marked then) or a refusal.
ALTER TABLE mcp_tasks ADD COLUMN ended_us BIGINT;
ALTER TABLE mcp_tasks ADD COLUMN answers_effect BOOLEAN;
