-- Version 14: webhook notifications, delivered from a durable outbox (docs/notifications.md).
--
-- `webhook_subscriptions` says which of an org's configured webhooks (by name) want which
-- event types; the server rewrites it from the config at every start. A trigger on `events`
-- writes one `webhook_outbox` row per subscribed webhook in the transaction that writes the
-- event (an approval requested, decided or timed out; a compensation that needs a person),
-- so a notification is committed exactly when what it announces is, and a process that dies
-- afterwards loses nothing. The trigger knows no event type: the subscriptions hold them.
-- The sender claims due rows (`FOR UPDATE SKIP LOCKED`, then a lease in `next_attempt_us`),
-- so one row is delivered by one process at a time.
CREATE TABLE webhook_subscriptions (
    org_id     TEXT NOT NULL,
    event_type TEXT NOT NULL,
    webhook    TEXT NOT NULL,
    PRIMARY KEY (org_id, event_type, webhook)
);

CREATE TABLE webhook_outbox (
    delivery_id     BIGSERIAL PRIMARY KEY,
    org_id          TEXT NOT NULL,
    webhook         TEXT NOT NULL,
    event_id        BIGINT NOT NULL,
    state           TEXT NOT NULL,  -- pending | delivered | dead
    attempts        INTEGER NOT NULL DEFAULT 0,
    next_attempt_us BIGINT NOT NULL,  -- due from then; a claim moves it to its lease's end
    last_error      TEXT,
    created_us      BIGINT NOT NULL,
    updated_us      BIGINT NOT NULL,
    UNIQUE (event_id, webhook)
);
CREATE INDEX webhook_outbox_due ON webhook_outbox (state, next_attempt_us);
CREATE INDEX webhook_outbox_by_org ON webhook_outbox (org_id, state, delivery_id);

CREATE OR REPLACE FUNCTION undolog_webhook_outbox() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO webhook_outbox (org_id, webhook, event_id, state, attempts, next_attempt_us,
        created_us, updated_us)
    SELECT NEW.org_id, s.webhook, NEW.event_id, 'pending', 0, NEW.created_us, NEW.created_us,
        NEW.created_us
    FROM webhook_subscriptions s
    WHERE s.org_id = NEW.org_id AND s.event_type = NEW.type;
    RETURN NULL;
END
$$;

CREATE TRIGGER events_to_webhook_outbox AFTER INSERT ON events
    FOR EACH ROW EXECUTE FUNCTION undolog_webhook_outbox();
