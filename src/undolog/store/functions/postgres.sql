-- The stored functions of the PostgreSQL store, as they are now: applied by every `migrate`
-- (after the numbered migrations, in their transaction and under their lock) with CREATE OR
-- REPLACE, so a release that changes a function changes it here, once. A migration that
-- changes a function's parameters drops the old signature (DROP FUNCTION IF EXISTS), so that
-- no overload lingers; the history of each function is in the migrations' comments.

-- undolog_execute_new: as of migration 0020.
CREATE OR REPLACE FUNCTION undolog_execute_new(
    p_lock_key         BIGINT,
    p_effect_id        TEXT,
    p_org_id           TEXT,
    p_session_id       TEXT,
    p_step_index       BIGINT,
    p_tool_name        TEXT,
    p_tool_version     TEXT,
    p_tier             TEXT,
    p_call_signature   TEXT,
    p_args             TEXT,
    p_state            TEXT,
    p_mode             TEXT,
    p_attempts         INTEGER,
    p_lease_expires_us BIGINT,
    p_executed_us      BIGINT,
    p_now_us           BIGINT,
    p_event_type       TEXT,
    p_event_payload    TEXT,
    p_undo_entry_id    TEXT,     -- NULL: no undo entry
    p_undo_fn_name     TEXT,
    p_undo_fn_version  TEXT,
    p_undo_args        TEXT,
    p_undo_max_retries INTEGER,
    p_undo_backoff_ms  INTEGER,
    p_undo_registered  BIGINT,
    p_undo_state       TEXT,
    p_undo_runner      TEXT,
    p_replay_states    TEXT[],
    p_replay_type      TEXT,
    p_replay_payload   TEXT,
    p_owner            TEXT,     -- the key id a new session is recorded under
    p_owner_only       BOOLEAN,  -- true: only a session of p_owner (or a new one) may be used
    p_active           TEXT,     -- the state of a session that takes new calls
    p_touch_us         BIGINT    -- a call moves the session's updated_us when older than this
) RETURNS TABLE (
    outcome          TEXT,
    effect_id        TEXT,
    org_id           TEXT,
    session_id       TEXT,
    step_index       BIGINT,
    tool_name        TEXT,
    tool_version     TEXT,
    tier             TEXT,
    call_signature   TEXT,
    args             TEXT,
    state            TEXT,
    mode             TEXT,
    attempts         INTEGER,
    result           TEXT,
    error            TEXT,
    lease_expires_us BIGINT,
    executed_us      BIGINT,
    finished_us      BIGINT,
    created_us       BIGINT,
    updated_us       BIGINT
) LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_seen          effects%ROWTYPE;
    v_outcome       TEXT;
    v_session_state TEXT;
    v_owner         TEXT;
BEGIN
    -- Another key's session (or one without an owner) is refused before anything is read
    -- or written: not even a replay of its calls.
    IF p_owner_only THEN
        SELECT s.owner_key_id INTO v_owner FROM sessions s
            WHERE s.org_id = p_org_id AND s.session_id = p_session_id;
        IF FOUND AND v_owner IS DISTINCT FROM p_owner THEN
            outcome := 'forbidden';
            RETURN NEXT;
            RETURN;
        END IF;
    END IF;

    -- A replay or a duplicate: the row, without the lock (as the engine's pre-check read).
    SELECT * INTO v_seen FROM effects e
        WHERE e.org_id = p_org_id AND e.call_signature = p_call_signature;
    IF FOUND THEN
        IF v_seen.state = ANY (p_replay_states) THEN
            v_outcome := 'replayed';
            -- Best effort: a store that cannot write (read-only, disk full) still replays.
            BEGIN
                INSERT INTO events (org_id, type, session_id, effect_id, payload, created_us)
                VALUES (p_org_id, p_replay_type, v_seen.session_id, v_seen.effect_id,
                    p_replay_payload, p_now_us);
            EXCEPTION WHEN OTHERS THEN
                v_outcome := 'replayed_unlogged';
            END;
        ELSE
            v_outcome := 'exists';
        END IF;
        RETURN QUERY SELECT v_outcome, v_seen.effect_id, v_seen.org_id, v_seen.session_id,
            v_seen.step_index, v_seen.tool_name, v_seen.tool_version, v_seen.tier,
            v_seen.call_signature, v_seen.args, v_seen.state, v_seen.mode, v_seen.attempts,
            v_seen.result, v_seen.error, v_seen.lease_expires_us, v_seen.executed_us,
            v_seen.finished_us, v_seen.created_us, v_seen.updated_us;
        RETURN;
    END IF;

    IF NOT pg_try_advisory_xact_lock(p_lock_key) THEN
        outcome := 'busy';
        RETURN NEXT;
        RETURN;
    END IF;

    -- The owner is written on insert only. A session another key created meanwhile is not
    -- touched (the WHERE of DO UPDATE): no row comes back, and the call is refused. The update
    -- also locks the row until commit, so a state change (a close, a rollback) waits for
    -- this call's effect and undo entry. Within `p_touch_us` of the last touch it changes no
    -- indexed column: a HOT update.
    INSERT INTO sessions AS s (org_id, session_id, state, last_step, created_us, updated_us,
        owner_key_id)
    VALUES (p_org_id, p_session_id, p_active, p_step_index, p_now_us, p_now_us, p_owner)
    ON CONFLICT (org_id, session_id) DO UPDATE SET
        last_step = GREATEST(s.last_step, excluded.last_step),
        updated_us = CASE WHEN s.updated_us < excluded.updated_us - p_touch_us
            THEN excluded.updated_us ELSE s.updated_us END
        WHERE NOT p_owner_only OR s.owner_key_id IS NOT DISTINCT FROM p_owner
    RETURNING s.state INTO v_session_state;
    IF NOT FOUND THEN
        outcome := 'forbidden';
        RETURN NEXT;
        RETURN;
    END IF;
    IF v_session_state <> p_active THEN
        outcome := 'closed';
        RETURN NEXT;
        RETURN;
    END IF;

    INSERT INTO effects (effect_id, org_id, session_id, step_index, tool_name, tool_version,
        tier, call_signature, args, state, mode, attempts, lease_expires_us, executed_us,
        created_us, updated_us)
    VALUES (p_effect_id, p_org_id, p_session_id, p_step_index, p_tool_name, p_tool_version,
        p_tier, p_call_signature, p_args, p_state, p_mode, p_attempts, p_lease_expires_us,
        p_executed_us, p_now_us, p_now_us)
    ON CONFLICT (org_id, call_signature) DO NOTHING;
    IF NOT FOUND THEN
        -- Inserted meanwhile by a call that did not take this lock (a step-less one).
        outcome := 'busy';
        RETURN NEXT;
        RETURN;
    END IF;

    IF p_undo_entry_id IS NOT NULL THEN
        INSERT INTO undo_entries (entry_id, org_id, session_id, effect_id, fn_name, fn_version,
            args, max_retries, retry_backoff_ms, registered_us, state, attempts, updated_us,
            runner)
        VALUES (p_undo_entry_id, p_org_id, p_session_id, p_effect_id, p_undo_fn_name,
            p_undo_fn_version, p_undo_args, p_undo_max_retries, p_undo_backoff_ms,
            p_undo_registered, p_undo_state, 0, p_undo_registered, p_undo_runner);
    END IF;

    INSERT INTO events (org_id, type, session_id, effect_id, payload, created_us)
    VALUES (p_org_id, p_event_type, p_session_id, p_effect_id, p_event_payload, p_now_us);

    outcome := 'inserted';
    RETURN NEXT;
END
$$;

-- undolog_finish_effect: as of migration 0022.
CREATE OR REPLACE FUNCTION undolog_finish_effect(
    p_org_id      TEXT,
    p_effect_id   TEXT,
    p_target      TEXT,
    p_result      TEXT,
    p_error       TEXT,
    p_now_us      BIGINT,
    p_event_type  TEXT,
    p_extra       TEXT,    -- a JSON object merged into the event's payload
    p_from_states TEXT[],  -- the states an effect may be finished from
    p_self_mode   TEXT     -- an effect of this mode (its runner reports it) counts as delivered
) RETURNS SETOF effects LANGUAGE plpgsql AS $$
DECLARE
    v effects%ROWTYPE;
BEGIN
    UPDATE effects AS e SET state = p_target, result = p_result, error = p_error,
        lease_expires_us = NULL, finished_us = p_now_us, updated_us = p_now_us,
        delivered_us = CASE WHEN e.mode = p_self_mode THEN p_now_us ELSE e.delivered_us END
        WHERE e.org_id = p_org_id AND e.effect_id = p_effect_id
            AND e.state = ANY (p_from_states)
        RETURNING e.* INTO v;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    INSERT INTO events (org_id, type, session_id, effect_id, payload, created_us)
    VALUES (v.org_id, p_event_type, v.session_id, v.effect_id,
        (jsonb_build_object('stage', p_target, 'tool_name', v.tool_name, 'attempt', v.attempts)
            || p_extra::jsonb)::text,
        p_now_us);
    RETURN NEXT v;
END;
$$;
