-- Version 22: a call's commit (or failure) as a function, so that concurrent ones can share a
-- statement (docs/performance.md, "Group commit of finishes").
--
-- `undolog_finish_effect` is the statement `finish_effect` sent before (one `WITH ... UPDATE
-- ... INSERT`): it moves an effect in one of `p_from_states` to `p_target` and writes its
-- event in the same transaction, and returns the effect's row; no row when the effect is in
-- none of those states (or does not exist), and then nothing is written. One call is one
-- statement, as before. Several calls go as one statement over `unnest` of their parameters
-- (`store/pg_group.py`): each call sees the writes of the calls before it, so a second finish
-- of the same effect finds it finished and returns no row, as it would alone afterwards.
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
