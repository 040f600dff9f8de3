-- Batches (/v1/batches) and the results of their requests, kept until the
-- batch's output and error files are written. Portable between SQLite and
-- PostgreSQL: TEXT and BIGINT only (times are seconds since the epoch, flags
-- are 0 or 1, JSON values are stored as TEXT).

CREATE TABLE batches (
    id TEXT PRIMARY KEY,
    project_id TEXT NOT NULL REFERENCES projects (id),
    endpoint TEXT NOT NULL,
    completion_window TEXT NOT NULL,
    input_file_id TEXT NOT NULL,
    status TEXT NOT NULL,
    metadata TEXT,
    override_settings TEXT,
    model TEXT,
    total BIGINT NOT NULL DEFAULT 0,
    completed BIGINT NOT NULL DEFAULT 0,
    failed BIGINT NOT NULL DEFAULT 0,
    output_file_id TEXT,
    error_file_id TEXT,
    errors TEXT,
    created_at BIGINT NOT NULL,
    expires_at BIGINT NOT NULL,
    in_progress_at BIGINT,
    finalizing_at BIGINT,
    completed_at BIGINT,
    failed_at BIGINT,
    expired_at BIGINT,
    cancelling_at BIGINT,
    cancelled_at BIGINT,
    claimed_by TEXT,
    heartbeat_at BIGINT,
    attempts BIGINT NOT NULL DEFAULT 0
);

CREATE INDEX batches_by_project ON batches (project_id, id);
CREATE INDEX batches_by_status ON batches (status, id);
CREATE INDEX batches_by_input_file ON batches (input_file_id);

CREATE TABLE batch_results (
    batch_id TEXT NOT NULL REFERENCES batches (id) ON DELETE CASCADE,
    line BIGINT NOT NULL,
    ok BIGINT NOT NULL,
    body TEXT NOT NULL,
    PRIMARY KEY (batch_id, line)
);
