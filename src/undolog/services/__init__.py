"""The service layer: the life of a call and of a rollback, apart from any front end.

`runtime` builds the services once; `calls` runs a call (intercept, execute, commit or fail
with retries, held results, approved runs) and says how it ended (`CallOutcome`); `rollback`
drives a session's compensations; `sweeps` are the background approval and lease sweeps. The
REST proxy (`undolog.proxy`), the MCP gateway (`undolog.mcp`) and the approval routes are
adapters over these: they parse input, call one service function and render its result.
Nothing in this package imports a front end.
"""
