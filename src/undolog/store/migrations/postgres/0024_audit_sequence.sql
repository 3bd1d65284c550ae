-- Version 24: a contiguous per-org sequence of events, for the audit chain (docs/audit.md).
--
-- Every event of an org gets the next number of its org (`audit_seq`: 1, 2, 3, ...), kept in
-- `audit_sequences`. An event deleted from the database, exported or not, leaves a gap that
-- `undolog audit export|verify` names; one deleted off the end is found against the
-- counter. The number is given by a trigger, so no write path can forget it. Existing
-- events are numbered in event order.
ALTER TABLE events ADD COLUMN audit_seq BIGINT;

CREATE TABLE audit_sequences (
    org_id   TEXT PRIMARY KEY,
    last_seq BIGINT NOT NULL
);

UPDATE events e SET audit_seq = r.n
FROM (SELECT event_id, ROW_NUMBER() OVER (PARTITION BY org_id ORDER BY event_id) AS n
      FROM events) r
WHERE e.event_id = r.event_id;
INSERT INTO audit_sequences (org_id, last_seq)
SELECT org_id, MAX(audit_seq) FROM events GROUP BY org_id;

CREATE UNIQUE INDEX events_by_audit_seq ON events (org_id, audit_seq);

-- The number is taken at COMMIT (a deferred constraint trigger), not when the row is
-- inserted: the org's counter row stays locked only while the transaction commits, after
-- every other lock it takes. Taken at insert, it would be held across the rest of the
-- transaction, and two group-commit batches locking sessions in order could deadlock on it.
-- A transaction that rolls back takes no number, so numbers have no gaps; they follow commit
-- order, so a reader that sees number N sees every number below it.
CREATE FUNCTION undolog_audit_seq() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    next_seq BIGINT;
BEGIN
    INSERT INTO audit_sequences AS s (org_id, last_seq) VALUES (NEW.org_id, 1)
        ON CONFLICT (org_id) DO UPDATE SET last_seq = s.last_seq + 1
        RETURNING s.last_seq INTO next_seq;
    UPDATE events SET audit_seq = next_seq WHERE event_id = NEW.event_id;
    RETURN NULL;
END
$$;

CREATE CONSTRAINT TRIGGER events_audit_seq AFTER INSERT ON events
    DEFERRABLE INITIALLY DEFERRED
    FOR EACH ROW EXECUTE FUNCTION undolog_audit_seq();
