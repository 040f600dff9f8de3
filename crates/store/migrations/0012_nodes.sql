-- The Hearth processes serving one store: each node registers itself on
-- start and renews `heartbeat_at` while it runs; a node whose heartbeat is
-- older than the timeout is considered gone. `models` is a JSON array of
-- the model ids the node serves, `capacity` a JSON object of its free
-- capacity (sequences, KV cache blocks).

CREATE TABLE nodes (
    id TEXT PRIMARY KEY,
    advertise_url TEXT,
    models TEXT NOT NULL,
    capacity TEXT NOT NULL,
    started_at BIGINT NOT NULL,
    heartbeat_at BIGINT NOT NULL
);

CREATE INDEX nodes_by_heartbeat ON nodes (heartbeat_at);
