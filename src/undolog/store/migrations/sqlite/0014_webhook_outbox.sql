-- Version 14: webhook notifications, delivered from a durable outbox (docs/notifications.md).
--
-- `webhook_subscriptions` says which of an org's configured webhooks (by name) want which
-- event types; the server rewrites it from the config at every start. A trigger on `events`
-- writes one `webhook_outbox` row per subscribed webhook in the transaction that writes the
-- event, so a notification is committed exactly when what it announces is. The trigger
-- knows no event type: the subscriptions hold them. On SQLite one writer at a time claims
-- due rows (`BEGIN IMMEDIATE`), moving `next_attempt_us` to the end of its lease.
CREATE TABLE webhook_subscriptions (
    org_id     TEXT NOT NULL,
    event_type TEXT NOT NULL,
    webhook    TEXT NOT NULL,
    PRIMARY KEY (org_id, event_type, webhook)
);

CREATE TABLE webhook_outbox (
    delivery_id     INTEGER PRIMARY KEY AUTOINCREMENT,
    org_id          TEXT NOT NULL,
    webhook         TEXT NOT NULL,
    event_id        INTEGER NOT NULL,
    state           TEXT NOT NULL,  -- pending | delivered | dead
    attempts        INTEGER NOT NULL DEFAULT 0,
    next_attempt_us INTEGER NOT NULL,  -- due from then; a claim moves it to its lease's end
    last_error      TEXT,
    created_us      INTEGER NOT NULL,
    updated_us      INTEGER NOT NULL,
    UNIQUE (event_id, webhook)
);
CREATE INDEX webhook_outbox_due ON webhook_outbox (state, next_attempt_us);
CREATE INDEX webhook_outbox_by_org ON webhook_outbox (org_id, state, delivery_id);

CREATE TRIGGER events_to_webhook_outbox AFTER INSERT ON events
BEGIN
    INSERT INTO webhook_outbox (org_id, webhook, event_id, state, attempts, next_attempt_us,
        created_us, updated_us)
    SELECT NEW.org_id, s.webhook, NEW.event_id, 'pending', 0, NEW.created_us, NEW.created_us,
        NEW.created_us
    FROM webhook_subscriptions s
    WHERE s.org_id = NEW.org_id AND s.event_type = NEW.type;
END;
