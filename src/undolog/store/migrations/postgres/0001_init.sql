-- UndoLog schema, version 1 (PostgreSQL). Times are integer microseconds since the epoch.
CREATE TABLE orgs (
    org_id                  TEXT PRIMARY KEY,
    name                    TEXT NOT NULL,
    approval_timeout_s      INTEGER NOT NULL DEFAULT 3600,
    auto_approve_on_timeout BOOLEAN NOT NULL DEFAULT false,
    created_us              BIGINT NOT NULL
);

CREATE TABLE api_keys (
    key_hash   TEXT PRIMARY KEY,            -- SHA-256 hex of the key; the key itself is never stored
    org_id     TEXT NOT NULL REFERENCES orgs (org_id),
    label      TEXT,
    created_us BIGINT NOT NULL
);

CREATE TABLE tools (
    org_id              TEXT NOT NULL REFERENCES orgs (org_id),
    name                TEXT NOT NULL,
    tier                TEXT NOT NULL CHECK (tier IN ('safe', 'compensable', 'irreversible')),
    version             TEXT NOT NULL,
    compensation        TEXT,
    idempotent_upstream BOOLEAN NOT NULL DEFAULT false,
    upstream_url        TEXT,
    updated_us          BIGINT NOT NULL,
    PRIMARY KEY (org_id, name)
);

CREATE TABLE sessions (
    org_id     TEXT NOT NULL,
    session_id TEXT NOT NULL,
    state      TEXT NOT NULL,
    last_step  BIGINT NOT NULL DEFAULT 0,  -- step indexes are u32: INTEGER is too small
    created_us BIGINT NOT NULL,
    updated_us BIGINT NOT NULL,
    PRIMARY KEY (org_id, session_id)
);
CREATE INDEX sessions_by_update ON sessions (org_id, updated_us);

CREATE TABLE effects (
    effect_id        TEXT PRIMARY KEY,
    org_id           TEXT NOT NULL,
    session_id       TEXT NOT NULL,
    step_index       BIGINT NOT NULL,     -- u32: INTEGER is too small
    tool_name        TEXT NOT NULL,
    tool_version     TEXT,
    tier             TEXT NOT NULL,
    call_signature   TEXT NOT NULL,
    args             TEXT NOT NULL,
    state            TEXT NOT NULL,
    mode             TEXT NOT NULL,
    attempts         INTEGER NOT NULL DEFAULT 1,
    result           TEXT,
    error            TEXT,
    lease_expires_us BIGINT,
    executed_us      BIGINT,
    finished_us      BIGINT,
    created_us       BIGINT NOT NULL,
    updated_us       BIGINT NOT NULL,
    UNIQUE (org_id, call_signature)
);
CREATE INDEX effects_by_session ON effects (org_id, session_id, step_index);

CREATE TABLE undo_entries (
    seq              BIGSERIAL PRIMARY KEY,  -- push order: the stack unwinds by seq, highest first
    entry_id         TEXT NOT NULL UNIQUE,
    org_id           TEXT NOT NULL,
    session_id       TEXT NOT NULL,
    effect_id        TEXT NOT NULL REFERENCES effects (effect_id),
    fn_name          TEXT NOT NULL,
    fn_version       TEXT NOT NULL,
    args             TEXT NOT NULL,
    max_retries      INTEGER NOT NULL,
    retry_backoff_ms INTEGER NOT NULL,
    registered_us    BIGINT NOT NULL,
    state            TEXT NOT NULL,
    attempts         INTEGER NOT NULL DEFAULT 0,
    last_error       TEXT,
    updated_us       BIGINT NOT NULL
);
CREATE INDEX undo_by_effect ON undo_entries (effect_id);
CREATE INDEX undo_by_session ON undo_entries (org_id, session_id, seq);

CREATE TABLE approvals (
    approval_id TEXT PRIMARY KEY,
    org_id      TEXT NOT NULL,
    effect_id   TEXT NOT NULL UNIQUE REFERENCES effects (effect_id),
    session_id  TEXT NOT NULL,
    tool_name   TEXT NOT NULL,
    args        TEXT NOT NULL,
    status      TEXT NOT NULL,
    created_us  BIGINT NOT NULL,
    timeout_us  BIGINT NOT NULL,
    decided_us  BIGINT,
    decided_by  TEXT,
    reason      TEXT
);
CREATE INDEX approvals_by_status ON approvals (org_id, status, created_us);
CREATE INDEX approvals_by_timeout ON approvals (status, timeout_us);

CREATE TABLE events (
    event_id   BIGSERIAL PRIMARY KEY,
    org_id     TEXT NOT NULL,
    type       TEXT NOT NULL,
    session_id TEXT,
    effect_id  TEXT,
    payload    TEXT NOT NULL,
    created_us BIGINT NOT NULL
);
CREATE INDEX events_by_org ON events (org_id, event_id);
