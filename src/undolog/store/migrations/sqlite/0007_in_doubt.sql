-- Version 7: the lease sweeper looks for executing effects whose lease expired; a partial index
-- keeps that scan to the calls in flight.
CREATE INDEX IF NOT EXISTS effects_executing_lease ON effects (lease_expires_us)
    WHERE state = 'executing';
