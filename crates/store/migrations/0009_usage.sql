-- Usage metering, token quotas and spending budgets. Usage is summed per
-- UTC day (days since the epoch), project, model, credential (an API key
-- id, a service account id, or '' for keys given on the command line) and
-- class (interactive or batch); cost is in billionths of the currency unit.

CREATE TABLE usage_daily (
    day BIGINT NOT NULL,
    project_id TEXT NOT NULL,
    model TEXT NOT NULL,
    key_id TEXT NOT NULL,
    class TEXT NOT NULL,
    requests BIGINT NOT NULL DEFAULT 0,
    input_tokens BIGINT NOT NULL DEFAULT 0,
    output_tokens BIGINT NOT NULL DEFAULT 0,
    cached_tokens BIGINT NOT NULL DEFAULT 0,
    cost_nanos BIGINT NOT NULL DEFAULT 0,
    PRIMARY KEY (day, project_id, model, key_id, class)
);

CREATE INDEX usage_by_project ON usage_daily (project_id, day);

CREATE TABLE project_budgets (
    project_id TEXT PRIMARY KEY REFERENCES projects (id) ON DELETE CASCADE,
    amount_nanos BIGINT NOT NULL,
    period TEXT NOT NULL,
    currency TEXT NOT NULL,
    updated_at BIGINT NOT NULL
);

-- model '*' applies to every model without a row of its own.
CREATE TABLE project_quotas (
    project_id TEXT NOT NULL REFERENCES projects (id) ON DELETE CASCADE,
    model TEXT NOT NULL,
    tokens_per_minute BIGINT,
    requests_per_minute BIGINT,
    burst_tokens BIGINT,
    updated_at BIGINT NOT NULL,
    PRIMARY KEY (project_id, model)
);
