-- Version 24: a contiguous per-org sequence of events, for the audit chain (docs/audit.md).
--
-- Every event of an org gets the next number of its org (`audit_seq`: 1, 2, 3, ...), kept in
-- `audit_sequences`. An event deleted from the database, exported or not, leaves a gap that
-- `undolog audit export|verify` names; one deleted off the end is found against the
-- counter. The number is given by a trigger, so no write path can forget it. Existing
-- events are numbered in event order.
ALTER TABLE events ADD COLUMN audit_seq INTEGER;

CREATE TABLE audit_sequences (
    org_id   TEXT PRIMARY KEY,
    last_seq INTEGER NOT NULL
);

UPDATE events SET audit_seq = (
    SELECT COUNT(*) FROM events e WHERE e.org_id = events.org_id AND e.event_id <= events.event_id
);
INSERT INTO audit_sequences (org_id, last_seq)
SELECT org_id, MAX(audit_seq) FROM events GROUP BY org_id;

CREATE UNIQUE INDEX events_by_audit_seq ON events (org_id, audit_seq);

-- SQLite has one writer: the number is taken as the row is written.
CREATE TRIGGER events_audit_seq AFTER INSERT ON events
BEGIN
    INSERT INTO audit_sequences (org_id, last_seq) VALUES (NEW.org_id, 1)
        ON CONFLICT (org_id) DO UPDATE SET last_seq = last_seq + 1;
    UPDATE events SET audit_seq = (
        SELECT last_seq FROM audit_sequences WHERE org_id = NEW.org_id
    ) WHERE event_id = NEW.event_id;
END;
