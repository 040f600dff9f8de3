-- Stored responses of /v1/responses (store: true). The response object, the
-- request's input items and the conversation through its output (for
-- previous_response_id) are JSON text.
CREATE TABLE responses (
    id TEXT PRIMARY KEY,
    project_id TEXT NOT NULL REFERENCES projects (id),
    created_at BIGINT NOT NULL,
    previous_response_id TEXT,
    body TEXT NOT NULL,
    input_items TEXT NOT NULL,
    conversation TEXT NOT NULL
);

CREATE INDEX responses_by_project ON responses (project_id, id);
