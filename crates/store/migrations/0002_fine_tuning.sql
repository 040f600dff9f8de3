-- Fine-tuning jobs, their events and their checkpoints.
-- Portable between SQLite and PostgreSQL: TEXT and BIGINT only (times are
-- seconds since the epoch; JSON values are stored as TEXT).

CREATE TABLE fine_tuning_jobs (
    id TEXT PRIMARY KEY,
    project_id TEXT NOT NULL REFERENCES projects (id),
    model TEXT NOT NULL,
    training_file TEXT NOT NULL,
    validation_file TEXT,
    suffix TEXT,
    seed BIGINT NOT NULL,
    hyperparameters TEXT NOT NULL,
    method TEXT NOT NULL DEFAULT 'supervised',
    status TEXT NOT NULL,
    fine_tuned_model TEXT,
    trained_tokens BIGINT,
    trained_steps BIGINT NOT NULL DEFAULT 0,
    total_steps BIGINT,
    result_files TEXT NOT NULL DEFAULT '[]',
    error TEXT,
    created_at BIGINT NOT NULL,
    finished_at BIGINT,
    claimed_by TEXT,
    heartbeat_at BIGINT
);

CREATE INDEX fine_tuning_jobs_by_project ON fine_tuning_jobs (project_id, id);
CREATE INDEX fine_tuning_jobs_by_status ON fine_tuning_jobs (status, id);

CREATE TABLE fine_tuning_events (
    id TEXT PRIMARY KEY,
    job_id TEXT NOT NULL REFERENCES fine_tuning_jobs (id) ON DELETE CASCADE,
    created_at BIGINT NOT NULL,
    level TEXT NOT NULL,
    type TEXT NOT NULL,
    message TEXT NOT NULL,
    data TEXT
);

CREATE INDEX fine_tuning_events_by_job ON fine_tuning_events (job_id, id);

CREATE TABLE fine_tuning_checkpoints (
    id TEXT PRIMARY KEY,
    job_id TEXT NOT NULL REFERENCES fine_tuning_jobs (id) ON DELETE CASCADE,
    created_at BIGINT NOT NULL,
    step_number BIGINT NOT NULL,
    fine_tuned_model_checkpoint TEXT NOT NULL,
    metrics TEXT NOT NULL,
    blob_prefix TEXT NOT NULL
);

CREATE INDEX fine_tuning_checkpoints_by_job ON fine_tuning_checkpoints (job_id, id);
