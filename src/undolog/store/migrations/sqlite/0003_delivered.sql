-- Version 3: when a step-less call's answer reached its client. An identical call of the same
-- session is a retry of it until then (the engine's step rule, DESIGN "Intercept").
ALTER TABLE effects ADD COLUMN delivered_us BIGINT;
