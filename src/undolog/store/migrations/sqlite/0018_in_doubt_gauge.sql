-- Version 18: the in-doubt gauge reads an index, not the effect log.
--
-- Every proxy's approval sweep counts the in-doubt effects per org for the
-- `undolog_proxy_effects_in_doubt_current` gauge (docs/observability.md). A partial index holds
-- only those rows, so the count costs the same with 10^6 effects as with ten, and a call that
-- never goes in doubt does not write to it.
CREATE INDEX IF NOT EXISTS effects_in_doubt ON effects (org_id) WHERE state = 'in_doubt';
