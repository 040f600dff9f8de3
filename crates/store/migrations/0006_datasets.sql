-- Datasets (/v1/datasets): typed tables stored as Parquet parts in the blob
-- store, and the multipart uploads that create them. Portable between
-- SQLite and PostgreSQL: TEXT and BIGINT only (times are seconds since the
-- epoch, JSON values are stored as TEXT).

CREATE TABLE datasets (
    id TEXT PRIMARY KEY,
    project_id TEXT NOT NULL REFERENCES projects (id),
    name TEXT NOT NULL,
    folder TEXT,
    description TEXT,
    -- [{"name": ..., "type": {"name": ...}}, ...]
    schema TEXT NOT NULL,
    row_count BIGINT NOT NULL,
    bytes BIGINT NOT NULL,
    -- {"type": "upload", "upload_id": ...} or {"type": "object_storage", ...}
    source TEXT,
    created_at BIGINT NOT NULL,
    updated_at BIGINT NOT NULL
);

CREATE INDEX datasets_by_project ON datasets (project_id, id);
CREATE INDEX datasets_by_name ON datasets (project_id, name, id);

-- The Parquet parts of a dataset, in order.
CREATE TABLE dataset_parts (
    dataset_id TEXT NOT NULL REFERENCES datasets (id) ON DELETE CASCADE,
    idx BIGINT NOT NULL,
    blob_key TEXT NOT NULL,
    row_count BIGINT NOT NULL,
    bytes BIGINT NOT NULL,
    PRIMARY KEY (dataset_id, idx)
);

CREATE TABLE dataset_uploads (
    id TEXT PRIMARY KEY,
    project_id TEXT NOT NULL REFERENCES projects (id),
    name TEXT NOT NULL,
    folder TEXT,
    description TEXT,
    schema TEXT NOT NULL,
    -- PENDING, COMPLETED, CANCELLED, FAILED
    status TEXT NOT NULL,
    error TEXT,
    dataset_id TEXT,
    -- The JSON list of part ids that completed it (a repeated complete
    -- with the same list answers the same record).
    part_ids TEXT,
    -- Where an import reads from (JSON), for the dataset's `source`.
    source TEXT,
    created_at BIGINT NOT NULL,
    completed_at BIGINT
);

CREATE INDEX dataset_uploads_by_status ON dataset_uploads (status, created_at);

-- Parts received for an upload, each already checked and stored as Parquet.
CREATE TABLE dataset_upload_parts (
    id TEXT PRIMARY KEY,
    upload_id TEXT NOT NULL REFERENCES dataset_uploads (id) ON DELETE CASCADE,
    blob_key TEXT NOT NULL,
    row_count BIGINT NOT NULL,
    bytes BIGINT NOT NULL,
    created_at BIGINT NOT NULL
);

CREATE INDEX dataset_upload_parts_by_upload ON dataset_upload_parts (upload_id, id);
