-- Sessions of the web console. The browser holds a random session token in
-- a cookie; only its SHA-256 is kept here, with the key that signed in (a
-- revoked key's sessions stop working at once: every lookup joins the key),
-- the project picked in the console, the form token (CSRF) and the expiry.

CREATE TABLE console_sessions (
    token_hash TEXT PRIMARY KEY,
    key_id TEXT NOT NULL REFERENCES api_keys (id) ON DELETE CASCADE,
    project_id TEXT NOT NULL REFERENCES projects (id) ON DELETE CASCADE,
    csrf_token TEXT NOT NULL,
    created_at BIGINT NOT NULL,
    expires_at BIGINT NOT NULL
);

CREATE INDEX console_sessions_by_expiry ON console_sessions (expires_at);
