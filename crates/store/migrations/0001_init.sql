-- Projects, accounts and their API keys, stored files, server settings.
-- Portable between SQLite and PostgreSQL: TEXT and BIGINT only (times are
-- seconds since the epoch, flags are 0 or 1).

CREATE TABLE projects (
    id TEXT PRIMARY KEY,
    name TEXT NOT NULL,
    created_at BIGINT NOT NULL
);

CREATE TABLE accounts (
    id TEXT PRIMARY KEY,
    name TEXT NOT NULL,
    is_admin BIGINT NOT NULL DEFAULT 0,
    default_project_id TEXT NOT NULL REFERENCES projects (id),
    created_at BIGINT NOT NULL
);

CREATE TABLE account_projects (
    account_id TEXT NOT NULL REFERENCES accounts (id) ON DELETE CASCADE,
    project_id TEXT NOT NULL REFERENCES projects (id) ON DELETE CASCADE,
    PRIMARY KEY (account_id, project_id)
);

CREATE TABLE api_keys (
    id TEXT PRIMARY KEY,
    account_id TEXT NOT NULL REFERENCES accounts (id) ON DELETE CASCADE,
    name TEXT NOT NULL,
    prefix TEXT NOT NULL,
    hash TEXT NOT NULL UNIQUE,
    created_at BIGINT NOT NULL,
    last_used_at BIGINT,
    revoked_at BIGINT
);

CREATE TABLE files (
    id TEXT PRIMARY KEY,
    project_id TEXT NOT NULL REFERENCES projects (id),
    filename TEXT NOT NULL,
    purpose TEXT NOT NULL,
    bytes BIGINT NOT NULL,
    status TEXT NOT NULL,
    status_details TEXT,
    created_at BIGINT NOT NULL
);

CREATE INDEX files_by_project ON files (project_id, id);

CREATE TABLE settings (
    name TEXT PRIMARY KEY,
    value TEXT NOT NULL
);
