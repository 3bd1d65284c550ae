-- Version 6: a tool names its upstream (operator configuration, `[[upstreams]]`) instead of
-- holding a URL a tenant supplied. Stored URLs are dropped, not translated: a URL is not a name,
-- and keeping one would keep the tenant's target. Those tools fall back to NULL, the upstream
-- named `default` (`--upstream-url`); an operator re-points them with `upstream = "name"`.
UPDATE tools SET upstream_url = NULL;
ALTER TABLE tools RENAME COLUMN upstream_url TO upstream;
