-- The cloud platform API's identities: service accounts of an account, the
-- account's groups (each with one role), RSA public keys that sign the
-- service accounts' token-exchange JWTs, the access tokens issued for them
-- (only their SHA-256 is kept) and the JWT ids already exchanged.

CREATE TABLE service_accounts (
    id TEXT PRIMARY KEY,
    account_id TEXT NOT NULL REFERENCES accounts (id) ON DELETE CASCADE,
    name TEXT NOT NULL,
    description TEXT NOT NULL DEFAULT '',
    created_at BIGINT NOT NULL
);

CREATE UNIQUE INDEX service_accounts_by_name ON service_accounts (account_id, name);

CREATE TABLE iam_groups (
    id TEXT PRIMARY KEY,
    account_id TEXT NOT NULL REFERENCES accounts (id) ON DELETE CASCADE,
    name TEXT NOT NULL,
    role TEXT NOT NULL,
    created_at BIGINT NOT NULL
);

CREATE UNIQUE INDEX iam_groups_by_name ON iam_groups (account_id, name);

CREATE TABLE iam_group_members (
    group_id TEXT NOT NULL REFERENCES iam_groups (id) ON DELETE CASCADE,
    service_account_id TEXT NOT NULL REFERENCES service_accounts (id) ON DELETE CASCADE,
    created_at BIGINT NOT NULL,
    PRIMARY KEY (group_id, service_account_id)
);

CREATE TABLE authorized_keys (
    id TEXT PRIMARY KEY,
    service_account_id TEXT NOT NULL REFERENCES service_accounts (id) ON DELETE CASCADE,
    public_key TEXT NOT NULL,
    algorithm TEXT NOT NULL,
    fingerprint TEXT NOT NULL,
    created_at BIGINT NOT NULL,
    expires_at BIGINT,
    revoked_at BIGINT
);

CREATE INDEX authorized_keys_by_account ON authorized_keys (service_account_id, id);

CREATE TABLE access_tokens (
    hash TEXT PRIMARY KEY,
    service_account_id TEXT NOT NULL REFERENCES service_accounts (id) ON DELETE CASCADE,
    authorized_key_id TEXT NOT NULL REFERENCES authorized_keys (id) ON DELETE CASCADE,
    created_at BIGINT NOT NULL,
    expires_at BIGINT NOT NULL
);

CREATE TABLE used_jwt_ids (
    service_account_id TEXT NOT NULL,
    jti TEXT NOT NULL,
    expires_at BIGINT NOT NULL,
    PRIMARY KEY (service_account_id, jti)
);
