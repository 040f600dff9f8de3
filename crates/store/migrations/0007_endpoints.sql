-- Dedicated endpoints: the desired state of each endpoint, which a server's
-- reconciler brings its running replicas in line with. `generation` goes up
-- with every change of what runs (flavor, scaling, enabled, deletion);
-- `status` and `status_reason` are written by the reconciler. Portable
-- between SQLite and PostgreSQL: TEXT and BIGINT only (times are seconds
-- since the epoch, flags are 0 or 1).

CREATE TABLE dedicated_endpoints (
    -- A UUID v4 string made by the caller.
    id TEXT PRIMARY KEY,
    project_id TEXT NOT NULL REFERENCES projects (id),
    name TEXT NOT NULL,
    description TEXT,
    model_name TEXT NOT NULL,
    -- What requests name to reach the endpoint; free again once the row is
    -- purged.
    routing_key TEXT NOT NULL UNIQUE,
    flavor_name TEXT NOT NULL,
    gpu_type TEXT,
    gpu_count BIGINT NOT NULL,
    region TEXT NOT NULL,
    min_replicas BIGINT NOT NULL,
    max_replicas BIGINT NOT NULL,
    enabled BIGINT NOT NULL,
    status TEXT NOT NULL,
    status_reason TEXT,
    generation BIGINT NOT NULL DEFAULT 1,
    created_at BIGINT NOT NULL,
    updated_at BIGINT NOT NULL
);

CREATE INDEX dedicated_endpoints_by_project ON dedicated_endpoints (project_id);
